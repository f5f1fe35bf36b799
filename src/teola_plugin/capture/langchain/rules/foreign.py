"""Framework models mapped onto a Teola engine: LangChain's ``VLLM`` (langchain_community).

``VLLM`` runs an in-process ``vllm.LLM``; when a Teola LLM engine loads the same model the
same way (``capture/vllm_identity.py``: directory, dtype, engine arguments that can change
the tokens), the call is that engine's generation with the sampling parameters
``VLLM._generate`` builds (its own recipe, reproduced exactly: defaults, then ``stop`` from
the call, then only the fields ``vllm.SamplingParams`` knows). Greedy or sampled alike;
``n`` must be 1 (only the first completion is returned). Any other model stays opaque.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...vllm_identity import ServedModel, engine_serving
from ...lowerable import LLMCallSpec
from ..tracer import NotLowerable


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


def foreign_call_spec(model: Any, engine_models: Mapping[str, ServedModel | str],
                      stop: list[str] | None) -> LLMCallSpec:
    vllm_cls = _vllm_class()
    if vllm_cls is None or type(model) is not vllm_cls:
        raise NotLowerable("not a Teola model: its engine is unknown (use TeolaChatModel / TeolaLLM)")
    engine, why = engine_serving(engine_models, "VLLM", model.model, model.dtype, model.vllm_kwargs)
    if engine is None:
        raise NotLowerable(why)
    if model.n != 1 or (model.best_of or 1) != 1 or model.use_beam_search:
        raise NotLowerable("VLLM with n / best_of / beam search other than one greedy-or-sampled completion")

    def to_engine_prompt(input: Any) -> str:
        return model._convert_input(input).to_string()  # BaseLLM.invoke's own conversion

    return LLMCallSpec(engine, to_engine_prompt, vllm_sampling_params(model, stop))
