"""Engines on different nodes of a real (local, 2-node) Ray cluster, through ray_address."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from teola_plugin import datasets

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # its own Ray and engines: `make test-all`


def test_queries_run_across_a_two_node_cluster():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_check.py"))],
                          capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT "):])
    assert report["answered"] == 24
    search_node = set(report["nodes"]["search"])
    embed_nodes = set(report["nodes"]["embedder"])
    assert len(search_node) == 1 and len(embed_nodes) == 1 and search_node != embed_nodes
    assert all(n > 0 for n in report["embedder_batches"]), "both embedder replicas should serve"
    # the direct channel only to an actor on the driver's node; Ray calls to the other node's
    for name, node_ids in report["nodes"].items():
        expected = ["channel" if n == report["driver_node"] else "ray" for n in node_ids]
        assert report["transports"][name] == expected, (name, report)
    assert sorted(set(report["transports"]["search"] + report["transports"]["embedder"])) == ["channel", "ray"]
    # BM25 finds each SQuAD question's own passage for most questions
    questions = datasets.load_questions("squad-xquad-en", limit=24)
    hits = sum(top == q.supporting_ids[0] for top, q in zip(report["top1"], questions))
    assert hits >= 12
