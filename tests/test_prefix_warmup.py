"""Prefill splitting where only the framework renders the prompt, and only where the model
server caches prefixes: the pure parts (the prompt cut before its late variables, the
template read back from marks, the server's metrics read, the pass's declines). The real
server's side is ``test_served_models.py::test_a_servers_prefix_cache_is_detected...``."""

from __future__ import annotations

from teola_plugin.capture.app_graphs import naive_rag
from teola_plugin.capture.prompt_parts import marked_parts
from teola_plugin.engines.server_features import PrefixCache, metrics_url, parse_prefix_cache
from teola_plugin.ir import Op
from teola_plugin.ir.semantics import CUT, parts_from_marks, prompt_before_cut, render_format, var_mark
from teola_plugin.optimizer import CostModel, PassManager

# vLLM 0.x's line, as the test server writes it (labels shortened to the ones read, plus neighbours)
METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0"} 1.0
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 45312.0
"""


def chat_body(system: str, user: str) -> dict:
    return {"model": "m", "temperature": 0.0, "messages": [{"role": "system", "content": system},
                                                            {"role": "user", "content": user}]}


def test_a_prompt_is_cut_before_its_first_late_variable_in_its_own_shape():
    assert prompt_before_cut(f"Instructions. Q: x\nContext: {CUT} more {CUT}") == "Instructions. Q: x\nContext: "
    body = chat_body("Be brief.", f"Q: x\nContext: {CUT}\nAnswer:")
    assert prompt_before_cut(body) == chat_body("Be brief.", "Q: x\nContext: ")
    # a cut in the system message drops the later messages
    assert prompt_before_cut(chat_body(f"Use {CUT}", "Q"))["messages"] == [{"role": "system", "content": "Use "}]
    assert prompt_before_cut({"model": "m", "prompt": f"A {CUT} B"}) == {"model": "m", "prompt": "A "}
    parts = [{"role": "user", "content": [{"type": "text", "text": f"see {CUT}"}]}]
    assert prompt_before_cut(parts) == [{"role": "user", "content": [{"type": "text", "text": "see "}]}]
    assert prompt_before_cut(chat_body("no late variable", "in it")) is None
    attrs = {"render": lambda q, c: chat_body("S", f"{q}|{c}"), "cut_vars": ["c"]}
    assert render_format(attrs, {"q": "x"}) == chat_body("S", "x|")


def test_a_template_is_read_back_from_its_marks_in_order():
    def render(**v):
        return chat_body("Long instructions. ", f"Question: {v['question']}\nContext:\n{v['context']}")

    assert marked_parts(render, ["context", "question"]) == [
        "Long instructions. Question: ", {"var": "question"}, "\nContext:\n", {"var": "context"}]
    assert parts_from_marks(f"only {var_mark('a')}", ["a", "b"]) is None  # b is not rendered as text
    assert marked_parts(lambda **v: 1 / 0, ["a"]) is None  # a render that fails: no description


def test_the_servers_prefix_cache_is_read_from_its_metrics():
    assert metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("https://host/proxy/v1/") == "https://host/proxy/metrics"
    cache = parse_prefix_cache(METRICS, "u")
    assert (cache.enabled, cache.block_tokens) == (True, 128)
    off = parse_prefix_cache(METRICS.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"'), "u")
    assert off.enabled is False
    assert parse_prefix_cache("# some other server\nrequests_total 3\n", "u").enabled is None


def split(caches: dict) -> tuple[int, str]:
    """Partial prefills added to the naive RAG graph (its LLM engine: ``llm``), and explain()."""
    out = PassManager(["prune", "split_prefill"]).run(naive_rag(), CostModel.default().with_prefix_caches(caches))
    return sum(p.op is Op.LLM_PARTIAL_PREFILL for p in out.nodes), out.explain()


def test_split_prefill_warms_only_a_server_known_to_cache_and_a_prefix_of_whole_blocks():
    assert split({})[0] == 1  # an in-process vLLM engine caches prefixes (vLLM's default)
    assert split({"llm": PrefixCache(True, 16, "metrics")})[0] == 1
    count, text = split({"llm": PrefixCache(None, 0, "not detected yet")})
    assert count == 0 and "not known to cache prefixes (not detected yet)" in text
    count, text = split({"llm": PrefixCache(False, 128, "enable_prefix_caching=False")})
    assert count == 0 and "enable_prefix_caching=False" in text
    count, text = split({"llm": PrefixCache(True, 4096, "metrics")})
    assert count == 0 and "under one 4096-token cache block" in text
