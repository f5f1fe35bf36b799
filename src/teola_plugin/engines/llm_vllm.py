"""The LLM engine: stock vLLM through its asynchronous engine (``AsyncLLM``).

Operations the primitives need, on an unmodified vLLM:

* ``prefill(prompt)``: a prefill-only request (``max_tokens=1``). With automatic prefix
  caching on, it leaves the prompt's KV blocks in the cache, so a later request sharing
  that prefix only prefills the rest. This is how ``llm_partial_prefill`` works without
  Teola's vLLM fork.
* ``generate(prompt, params)`` / ``stream(prompt, params)``: full generation; the stream
  yields text deltas as tokens are decoded.
* ``abort(request_id)``: stop a request (a cancelled query must not keep generating).

Sampling parameters pass through unchanged: a ``vllm.SamplingParams`` or a dict of its
fields. Any Hugging Face model directory works; the default is the bundled SmolLM2.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineInputError, ModelLoadError, ModelNotFoundError
from .base import lone_surrogate
from .cpu_dtype import loaded_dtype
from .generation import Generation, GenerationDelta, LLMEngine, PrefillResult

Prompt = str | Sequence[Mapping[str, str]]  # text, or chat messages [{"role", "content"}]

# Measured on 2-core CPUs (ENV-NOTES): without these vLLM fails to start (KV cache
# size), leaves a core idle (thread binding), or starves every other engine after a
# request with spinning OpenMP threads (wait policy). Users' own values win.
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 1) - 1)}",
    "OMP_WAIT_POLICY": "PASSIVE",
}


def _validation_errors() -> tuple[type[BaseException], ...]:
    """vLLM's request-validation exception types (their home moved between versions)."""
    found: list[type[BaseException]] = [ValueError]
    try:
        from vllm.exceptions import VLLMValidationError

        found.append(VLLMValidationError)
    except ImportError:
        pass
    return tuple(found)


class VLLMEngine(LLMEngine):
    """vLLM ``AsyncLLM`` serving one model, with automatic prefix caching on."""

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        name: str | None = None,
        *,
        max_model_len: int = 4096,
        dtype: str = "auto",
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name)
        self.model = str(model) if model is not None else None
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.enforce_eager = enforce_eager  # None: eager on CPU (compiled mode loads 4x slower there)
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed
        self.gpu_memory_utilization = gpu_memory_utilization
        self.engine_kwargs = dict(engine_kwargs or {})
        self._llm: Any = None
        self._tokenizer: Any = None

    # -- lifecycle -----------------------------------------------------------------------
    async def _load(self) -> None:
        from ..models import ensure_default_llm, is_model_dir

        path = Path(self.model) if self.model else ensure_default_llm()
        if not path.exists():
            raise ModelNotFoundError(f"LLM model directory {path} does not exist")
        if path.is_dir() and not is_model_dir(path):
            raise ModelNotFoundError(
                f"{path} is not a Hugging Face model directory (needs config.json, tokenizer files, *.safetensors)"
            )
        self.model = str(path)
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if on_cpu:
            for key, value in CPU_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.dtype = loaded_dtype(self.dtype)  # "auto" on a CPU: what it computes fastest in (cpu_dtype.py)
        args = AsyncEngineArgs(
            model=self.model,
            max_model_len=self.max_model_len,
            dtype=self.dtype,
            enforce_eager=on_cpu if self.enforce_eager is None else self.enforce_eager,
            enable_prefix_caching=self.enable_prefix_caching,
            seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            disable_log_stats=True,
            **self.engine_kwargs,
        )
        try:
            self._llm = AsyncLLM.from_engine_args(args)
        except Exception as exc:  # vLLM raises many types; the user needs one clear message
            raise ModelLoadError(f"vLLM could not load {self.model}: {type(exc).__name__}: {exc}") from exc
        self._tokenizer = self._llm.get_tokenizer()

    async def _unload(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model": self.model, "max_model_len": self.max_model_len, "dtype": self.dtype}

    # -- prompts -------------------------------------------------------------------------
    def render(self, prompt: Prompt) -> str:
        """The exact text sent to the model: chat messages go through the model's chat template."""
        text = self._render(prompt)
        where = lone_surrogate([text])
        if where is not None:  # vLLM's tokenizer fails on it with an error that says nothing
            raise EngineInputError(f"the prompt cannot be tokenized: it {where.removeprefix('text 0 ')}")
        return text

    def _render(self, prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt) and prompt:
            self._require_started()
            messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
            return self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        raise EngineInputError(
            f"prompt must be a str or a non-empty list of chat messages {{'role','content'}}, got {type(prompt).__name__}"
        )

    def count_tokens(self, text: str) -> int:
        self._require_started()
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    @staticmethod
    def sampling_params(params: Any = None, **overrides: Any) -> Any:
        """A ``SamplingParams`` from one, a dict of its fields, or None (greedy, 256 tokens)."""
        from vllm import SamplingParams

        if params is None:
            params = SamplingParams(temperature=0.0, max_tokens=256)
        elif isinstance(params, Mapping):
            try:
                params = SamplingParams(**_with_structured_outputs(params))
            except (TypeError, *_validation_errors()) as exc:  # vLLM validates as it builds them
                raise EngineInputError(f"invalid sampling params {dict(params)}: {exc}") from exc
        elif not isinstance(params, SamplingParams):
            raise EngineInputError(f"params must be vllm.SamplingParams or a dict, got {type(params).__name__}")
        if overrides:
            params = params.clone()
            for key, value in overrides.items():
                setattr(params, key, value)
        return params

    # -- operations ----------------------------------------------------------------------
    async def stream(
        self, prompt: Prompt, params: Any = None, request_id: str | None = None
    ) -> AsyncIterator[GenerationDelta]:
        """Generate, yielding text deltas as tokens are decoded. Closing the iterator aborts."""
        from vllm.sampling_params import RequestOutputKind

        self._require_started()
        text = self.render(prompt)
        sp = self.sampling_params(params, output_kind=RequestOutputKind.DELTA)
        rid = request_id or self._new_request_id("gen")
        produced, finished = 0, False
        try:
            async for out in self._llm.generate({"prompt": text}, sp, rid):
                completion = out.outputs[0]
                produced += len(completion.token_ids)
                finished = out.finished
                yield GenerationDelta(rid, completion.text, produced, finished, completion.finish_reason)
        except _validation_errors() as exc:  # e.g. a prompt longer than the context
            raise EngineInputError(str(exc)) from exc
        finally:
            if not finished and self._llm is not None:
                await self._llm.abort(rid)

    async def generate(self, prompt: Prompt, params: Any = None, request_id: str | None = None) -> Generation:
        """Generate to completion."""
        from vllm.sampling_params import RequestOutputKind

        self._require_started()
        text = self.render(prompt)
        sp = self.sampling_params(params, output_kind=RequestOutputKind.FINAL_ONLY)
        rid = request_id or self._new_request_id("gen")
        final = None
        try:
            async for out in self._llm.generate({"prompt": text}, sp, rid):
                final = out
        except _validation_errors() as exc:
            raise EngineInputError(str(exc)) from exc
        except asyncio.CancelledError:
            await self._llm.abort(rid)
            raise
        assert final is not None
        completion = final.outputs[0]
        return Generation(
            request_id=rid,
            text=completion.text,
            token_ids=tuple(completion.token_ids),
            finish_reason=completion.finish_reason,
            num_prompt_tokens=len(final.prompt_token_ids or ()),
            num_cached_tokens=final.num_cached_tokens or 0,
        )

    async def prefill(self, prompt: Prompt, request_id: str | None = None) -> PrefillResult:
        """Prefill only (one token generated and discarded) to warm the prefix cache."""
        gen = await self.generate(prompt, self.sampling_params(None, max_tokens=1), request_id or self._new_request_id("prefill"))
        return PrefillResult(gen.request_id, gen.num_prompt_tokens, gen.num_cached_tokens)

    async def abort(self, request_id: str) -> None:
        self._require_started()
        await self._llm.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        """Drop vLLM's cached prefixes (benchmarks start each run cold); False if requests run."""
        self._require_started()
        return bool(await self._llm.reset_prefix_cache())

    def unfinished_requests(self) -> int:
        """Requests vLLM is still working on (0 when idle: nothing generates for nobody)."""
        self._require_started()
        return self._llm.get_num_unfinished_requests()


def _with_structured_outputs(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with a ``structured_outputs`` dict (as the OpenAI-compatible server takes it,
    e.g. ``{"json": schema}``) made vLLM's ``StructuredOutputsParams``: a dict crosses Ray and
    the API the same way, and ``SamplingParams`` does not convert it itself."""
    spec = params.get("structured_outputs")
    if not isinstance(spec, Mapping):
        return dict(params)
    import dataclasses

    from vllm.sampling_params import StructuredOutputsParams

    unknown = set(spec) - {f.name for f in dataclasses.fields(StructuredOutputsParams)}
    if unknown:  # it would drop them silently, and say no constraint was given
        raise TypeError(f"structured_outputs has no field {sorted(unknown)}")
    return {**params, "structured_outputs": StructuredOutputsParams(**spec)}
