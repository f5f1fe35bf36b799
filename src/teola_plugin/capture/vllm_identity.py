"""Whether a framework's own in-process vLLM model generates what a Teola LLM engine does.

LangChain's community ``VLLM`` and LlamaIndex's ``Vllm`` each build ``vllm.LLM(model,
dtype=..., **vllm_kwargs)``; the engine (``engines/llm_vllm.py``) builds ``AsyncEngineArgs(
model, max_model_len, dtype, **engine_kwargs)``. Their calls may become that engine's
requests only when it loads the same model the same way: the same directory, the same
dtype and the same value of every engine argument that can change the tokens (all but
those that only size or place the engine). A ``max_model_len`` the framework model sets
must be the engine's (it decides where a long generation is cut); one it leaves unset is
vLLM's model-derived length, which is not compared (that would mean loading the config).

What each engine serves is read from the runtime's engine specs (and the engine class's
defaults), fixed when the runtime is built: no call to the engines, so a trace never waits
on Ray or starts an engine to recognise a model. Both frameworks' rules use :func:`engine_serving`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engines.cpu_dtype import loaded_dtype

# vllm_kwargs that only size or place the engine; the others may change what it generates.
PLACEMENT_KWARGS = frozenset({"gpu_memory_utilization", "enforce_eager", "swap_space", "max_num_seqs",
                              "max_num_batched_tokens", "enable_prefix_caching", "seed"})


@dataclass(frozen=True)
class ServedModel:
    """How one Teola LLM engine loads its model: what decides the tokens it generates."""

    model: str
    dtype: str = "auto"
    max_model_len: int | None = None  # None: not known here, not compared
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, served: ServedModel | str) -> ServedModel:
        """A bare model path stands for an engine on that model with the default loading."""
        return served if isinstance(served, ServedModel) else cls(str(served))


def served_models(runtime: Any) -> dict[str, ServedModel]:
    """Each LLM engine of ``runtime`` and how it loads its model (from its spec: no engine call)."""
    from ..config import default_model_dir

    out = {}
    for name, spec in getattr(runtime, "specs", {}).items():
        if spec.kind != "llm" or spec.in_process:  # in-process LLM engines call model servers
            continue
        args = {**_constructor_defaults(spec), **spec.kwargs}
        dtype = loaded_dtype(str(args.get("dtype") or "auto"))  # "auto" may be float32 on a CPU (cpu_dtype.py)
        out[name] = ServedModel(str(args.get("model") or default_model_dir()), dtype,
                                args.get("max_model_len"), dict(args.get("engine_kwargs") or {}))
    return out


def _constructor_defaults(spec: Any) -> dict[str, Any]:
    """The engine class's own defaults (e.g. ``max_model_len``) for what the spec leaves out."""
    try:
        params = inspect.signature(spec.engine_class()).parameters
    except Exception:  # noqa: BLE001 — an engine class that cannot be imported here: its spec alone
        return {}
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def same_model(a: Any, b: Any) -> bool:
    """The same model name, or two paths to the same directory."""
    a, b = str(a or ""), str(b or "")
    if a == b:
        return bool(a)
    try:
        return bool(a and b and os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))
    except OSError:
        return False


def loading_differences(engine: ServedModel, dtype: Any, vllm_kwargs: Mapping[str, Any] | None) -> list[str]:
    """What a framework model's ``vllm.LLM(dtype=dtype, **vllm_kwargs)`` loads differently from ``engine``."""
    theirs = dict(vllm_kwargs or {})
    out = []
    if str(dtype or "auto") != engine.dtype:
        out.append(f"dtype {dtype!r} (engine: {engine.dtype!r})")
    length = theirs.pop("max_model_len", None)
    if length is not None and engine.max_model_len is not None and length != engine.max_model_len:
        out.append(f"max_model_len {length!r} (engine: {engine.max_model_len!r})")
    ours = {k: v for k, v in engine.engine_kwargs.items() if k not in PLACEMENT_KWARGS}
    theirs = {k: v for k, v in theirs.items() if k not in PLACEMENT_KWARGS}
    out += [f"{k} {theirs.get(k)!r} (engine: {ours.get(k)!r})"
            for k in sorted(theirs.keys() | ours.keys()) if theirs.get(k) != ours.get(k)]
    return out


def engine_serving(engines: Mapping[str, ServedModel | str], label: str, model: Any, dtype: Any = "auto",
                   vllm_kwargs: Mapping[str, Any] | None = None) -> tuple[str | None, str]:
    """(engine name, "") of the engine that loads ``model`` as ``label`` (the framework class's
    name) would, else (None, why): no engine serves the model, or how they load it differs."""
    served = {name: ServedModel.of(s) for name, s in engines.items()}
    candidates = [name for name, s in served.items() if same_model(s.model, model)]
    if not candidates:
        return None, (f"{label} model {model!r} is not the model of a Teola LLM engine "
                      f"(serving: {sorted(s.model for s in served.values()) or 'none known'})")
    differences = {}
    for name in candidates:
        differences[name] = loading_differences(served[name], dtype, vllm_kwargs)
        if not differences[name]:
            return name, ""
    name = candidates[0]
    return None, (f"{label} loads {model!r} unlike engine {name!r}, which may change what it generates: "
                  + "; ".join(differences[name]))
