"""Which engines compute on the same hardware, from how the runtime places them.

The optimizer's cost model assumes engines in different *compute groups* run side by side
and engines in one group take turns (see ``optimizer.cost``). The groups follow from the
engine specs:

* an engine that asks Ray for GPUs (``num_gpus > 0``) or is built for a CUDA device
  (``device="cuda[:N]"``) has hardware of its own: group ``gpu:<engine>``;
* a CPU engine pinned with custom Ray resources (``resources={"node_a": 1}``) shares the
  CPUs of whatever else is pinned with the same resources: ``cpu:<resource names>``;
* an engine calling a model server (``engines/llm_served.py``) is the server's hardware:
  ``server:<url>``, unless the server runs on this host, where it shares the cores;
* every other CPU engine, the engines served in-process (``add_local_engine``) and the
  graph's own CPU steps (format, aggregate, opaque framework code) share this host's cores:
  ``cpu:host``. On a multi-node Ray cluster, pin CPU engines with resources to tell the
  optimizer they run apart; unpinned ones are assumed to share, which only makes the
  optimizer decline overlaps it cannot be sure of.
"""

from __future__ import annotations

from collections.abc import Mapping

from .hosting import EngineSpec

HOST_CPU = "cpu:host"


def spec_group(spec: EngineSpec) -> str:
    base_url = spec.kwargs.get("base_url")
    if base_url is not None:  # a model server: its own hardware unless it runs on this host
        from ..engines.llm_served import ServerEndpoint

        return HOST_CPU if ServerEndpoint(str(base_url)).is_local() else f"server:{base_url}"
    device = str(spec.kwargs.get("device", "cpu"))
    if spec.num_gpus > 0 or device.startswith("cuda"):
        return f"gpu:{spec.name}"
    if spec.resources:
        return "cpu:" + "+".join(sorted(spec.resources))
    return HOST_CPU


def compute_groups(specs: Mapping[str, EngineSpec]) -> dict[str, str]:
    """Engine name -> compute group for the configured engines; anything else a graph names
    (in-graph CPU steps, in-process engines) is on :data:`HOST_CPU`."""
    return {name: spec_group(spec) for name, spec in specs.items()}
