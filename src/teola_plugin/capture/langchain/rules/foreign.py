"""Framework models mapped onto a Teola engine: LangChain's ``VLLM`` (langchain_community).

``VLLM`` runs an in-process ``vllm.LLM``; when a Teola LLM engine serves the same model,
the call is that engine's generation with the sampling parameters ``VLLM._generate``
builds (its own recipe, reproduced exactly: defaults, then ``stop`` from the call, then
only the fields ``vllm.SamplingParams`` knows). Greedy or sampled alike; ``n`` must be 1
(only the first completion is returned). Any other model stays opaque.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..protocols import LLMCallSpec
from ..tracer import CannotLower

# vllm_kwargs that only size or place the engine; the others may change what it generates.
PLACEMENT_KWARGS = {"max_model_len", "gpu_memory_utilization", "enforce_eager", "swap_space",
                    "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "seed"}


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    return bool(a and b and os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))


def _vllm_class() -> type | None:
    try:
        from langchain_community.llms.vllm import VLLM
    except ImportError:
        return None
    return VLLM


def vllm_sampling_params(model: Any, stop: list[str] | None) -> dict[str, Any]:
    """``VLLM._generate``'s parameters as a dict (its ``stop`` field is replaced by the call's)."""
    from vllm import SamplingParams  # heavy import: only when a VLLM model is traced

    params = {**model._default_params, "stop": stop}
    known = SamplingParams.__annotations__.keys()
    return {k: v for k, v in params.items() if k in known}


def foreign_call_spec(model: Any, engine_models: Mapping[str, str], stop: list[str] | None) -> LLMCallSpec:
    vllm_cls = _vllm_class()
    if vllm_cls is None or type(model) is not vllm_cls:
        raise CannotLower("not a Teola model: its engine is unknown (use TeolaChatModel / TeolaLLM)")
    engine = next((name for name, served in engine_models.items() if _same_model(served, model.model)), None)
    if engine is None:
        raise CannotLower(f"VLLM model {model.model!r} is not the model of a Teola LLM engine "
                          f"(serving: {sorted(engine_models.values()) or 'none known'})")
    if model.n != 1 or (model.best_of or 1) != 1 or model.use_beam_search:
        raise CannotLower("VLLM with n / best_of / beam search other than one greedy-or-sampled completion")
    engine_args = sorted(set(model.vllm_kwargs) - PLACEMENT_KWARGS)
    if engine_args or model.dtype != "auto":
        raise CannotLower(f"VLLM engine arguments {engine_args or ['dtype']} may change what it generates")

    def to_engine_prompt(input: Any) -> str:
        return model._convert_input(input).to_string()  # BaseLLM.invoke's own conversion

    return LLMCallSpec(engine, to_engine_prompt, vllm_sampling_params(model, stop))
