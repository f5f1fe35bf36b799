"""The vLLM engine, really running (inside its Ray actor, shared by the session)."""

from __future__ import annotations

import asyncio
import json

import pytest

from teola_plugin.engines.llm_vllm import VLLMEngine
from teola_plugin.errors import EngineInputError, ModelNotFoundError
from teola_plugin.runtime.policies import Priority

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
LONG_PREFIX = "You are a careful assistant that answers questions about documents. " * 20


def test_generate_reports_tokens_and_stop_reasons(llm, call):
    full = call(llm.call("generate", QUESTION, {"temperature": 0.0, "max_tokens": 64}))
    assert full.finish_reason == "stop"
    assert "Paris" in full.text
    assert 0 < len(full.token_ids) < 64
    assert full.num_prompt_tokens > 10
    cut = call(llm.call("generate", QUESTION, {"temperature": 0.0, "max_tokens": 3}))
    assert cut.finish_reason == "length"
    assert len(cut.token_ids) == 3
    assert full.text.startswith(cut.text.strip()[:3])  # greedy: same first tokens


def test_repeated_prefix_hits_the_prefix_cache(llm, call):
    first = call(llm.call("prefill", LONG_PREFIX + " Question one?"))
    assert first.num_prompt_tokens > 200
    second = call(llm.call("generate", LONG_PREFIX + " A different question?", {"temperature": 0.0, "max_tokens": 4}))
    # whole KV blocks of the shared prefix are served from the cache
    assert second.num_cached_tokens >= 128
    assert second.num_cached_tokens <= second.num_prompt_tokens


def test_stream_yields_deltas_that_add_up_to_the_generation(llm, call):
    params = {"temperature": 0.0, "max_tokens": 24}

    async def streamed():
        opened = await llm.open_stream("stream", {"prompt": QUESTION, "params": params}, Priority())
        deltas = list(opened.first)
        if not opened.finished:
            async for d in llm.resume_stream(opened.sid):
                deltas.append(d)
        return deltas

    deltas = call(streamed())
    whole = call(llm.call("generate", QUESTION, params))
    assert len(deltas) > 3  # tokens arrive as decoded, not one final chunk
    assert "".join(d.text for d in deltas) == whole.text
    assert deltas[-1].finished and deltas[-1].finish_reason == whole.finish_reason
    assert deltas[-1].num_generated_tokens == len(whole.token_ids)


def test_closing_a_stream_early_aborts_the_request(llm, call):
    async def start_and_abandon():
        opened = await llm.open_stream(
            "stream", {"prompt": "Count from one to one thousand:", "params": {"temperature": 0.0, "max_tokens": 2000}},
            Priority())
        assert not opened.finished
        await llm.close_stream(opened.sid)
        return opened.sid

    call(start_and_abandon())
    stats = call(llm.call("describe"))
    assert stats["kind"] == "llm"
    # The engine is still healthy and no stream stays open on the server.
    assert call(llm.call("generate", "Hi", {"max_tokens": 2})).finish_reason == "length"


def test_structured_outputs_in_the_servers_spelling_constrain_the_generation(llm, call):
    """``{"structured_outputs": {"json": schema}}``, as ``extra_body`` sends it to vLLM's server
    (and ``TeolaLLM(sampling_kwargs=...)`` to the engine): the text is the schema's JSON."""
    schema = {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"enum": ["Paris", "Lyon", "Nice"]}}}
    out = call(llm.call("generate", QUESTION, {"temperature": 0.0, "max_tokens": 24,
                                               "structured_outputs": {"json": schema}}))
    assert json.loads(out.text)["city"] in ("Paris", "Lyon", "Nice"), out.text
    with pytest.raises(EngineInputError, match="sampling params"):
        call(llm.call("generate", "hi", {"structured_outputs": {"no_such_kind": 1}}))


def test_bad_inputs_raise_clear_errors(llm, call):
    with pytest.raises(EngineInputError, match="prompt must be"):
        call(llm.call("generate", 42))
    with pytest.raises(EngineInputError, match="sampling params"):
        call(llm.call("generate", "hi", {"no_such_field": 1}))
    with pytest.raises(EngineInputError):
        call(llm.call("generate", "word " * 6000, {"max_tokens": 4}))  # beyond max_model_len


def test_missing_model_directory_is_named(tmp_path):
    engine = VLLMEngine(model=tmp_path / "nope")
    with pytest.raises(ModelNotFoundError, match="nope"):
        asyncio.run(engine.start())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="not a Hugging Face model directory"):
        asyncio.run(VLLMEngine(model=tmp_path / "empty").start())


def test_a_model_vllm_cannot_load_raises_model_load_error(tmp_path):
    import shutil

    from teola_plugin.errors import ModelLoadError
    from teola_plugin.models import ensure_default_llm

    good = ensure_default_llm(progress=False)
    bad = tmp_path / "broken-model"
    bad.mkdir()
    for f in good.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, bad / f.name)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="broken-model"):
        asyncio.run(VLLMEngine(model=bad).start())
