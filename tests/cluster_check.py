"""Run by test_ray_cluster.py in its own process (a process joins one Ray cluster only).

Starts a 2-node Ray cluster on this machine, places the search engine on one node and
the embedder (2 replicas) on the other, runs concurrent queries, prints a JSON report.
"""

from __future__ import annotations

import asyncio
import json
import sys

from ray.cluster_utils import Cluster

from teola_plugin import datasets
from teola_plugin.ir.graph import PGraph
from teola_plugin.ir.ports import PortType as T
from teola_plugin.runtime.hosting import EngineSpec
from teola_plugin.runtime.runtime import Runtime


def main() -> int:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 10}})
    cluster.add_node(num_cpus=1, resources={"node_b": 10})
    cluster.wait_for_nodes()
    specs = {
        "search": EngineSpec("search", "teola_plugin.engines.search:BM25SearchEngine", kind="search",
                             resources={"node_a": 1}),
        "embedder": EngineSpec("embedder", "teola_plugin.engines.embedder:SentenceTransformerEmbedder",
                               kind="embedder", resources={"node_b": 1}, replicas=2),
    }
    rt = Runtime(specs, ray_address=cluster.address)
    g = PGraph("two_nodes")
    q = g.input("question", T.TEXT)
    qs = g.add("aggregate", inputs={"in0": q}, attrs={"mode": "list"})
    g.output("hits", g.add("search", inputs={"queries": qs.out()}, attrs={"top_k": 2}).out())
    g.output("vectors", g.add("embed", inputs={"texts": qs.out()}).out())
    questions = [x.question for x in datasets.load_questions("squad-xquad-en", limit=24)]

    async def run_all():
        await rt.start_engines()
        outs = await asyncio.gather(*(rt.execute(g, {"question": x}, timeout_s=120) for x in questions))
        nodes = {name: [await h.node_id() for h in rt.engines(name).handles] for name in specs}
        stats = {name: await rt.engines(name).stats() for name in specs}
        transports = {name: [h.transport for h in rt.engines(name).handles] for name in specs}
        return outs, nodes, stats, transports

    try:
        outs, nodes, stats, transports = rt.run_sync(run_all(), timeout=300)
        import ray

        report = {
            "answered": sum(1 for o in outs if o["hits"] and len(o["vectors"]) == 1),
            "top1": [o["hits"][0][0].id for o in outs],
            "nodes": nodes,
            "driver_node": ray.get_runtime_context().get_node_id(),
            "transports": transports,
            "embedder_batches": [s["batches_run"] for s in stats["embedder"]],
        }
    finally:
        rt.shutdown()
        cluster.shutdown()
    print("REPORT " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
