"""An engine's library settings, chosen from the cost model's measured profile.

A library's default is not its best on every machine. sentence-transformers encodes in
forward passes of 32 texts; on a CPU a pass of 8 paragraphs runs ~1.5x more texts per
second than one of 32, and one of 64 less than half as many (docs/benchmarks/engines.md),
so the runtime gives a CPU embedder the pass size at which its profile's ``embed_pass``
curve peaks. A setting the user passed in the spec's kwargs is kept, and so is the
library's default on a GPU, where the CPU measurements say nothing (profile a GPU with
``scripts/compare_engines.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from .compute_groups import spec_group
from .hosting import EngineSpec

# engine kind -> (the profiled op that measures one library call, the kwarg that sizes it)
TUNED_SETTINGS: dict[str, tuple[str, str]] = {"embedder": ("embed_pass", "batch_size")}


def tuned(spec: EngineSpec, cost_model: Any) -> EngineSpec:
    """``spec`` with its library setting taken from ``cost_model``'s profile, where it has
    one for this kind of engine, the user set none and the engine computes on a CPU."""
    setting = TUNED_SETTINGS.get(spec.kind)
    if setting is None or setting[1] in spec.kwargs or spec_group(spec).startswith("gpu:"):
        return spec
    op, kwarg = setting
    if not _takes(spec, kwarg):  # another engine class of this kind (a user's own) has no such setting
        return spec
    best = cost_model.best_batch(spec.name, op, spec.kind)
    if best is None:
        return spec
    return dataclasses.replace(spec, kwargs={**spec.kwargs, kwarg: best})


def _takes(spec: EngineSpec, kwarg: str) -> bool:
    params = inspect.signature(spec.engine_class()).parameters
    return kwarg in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
