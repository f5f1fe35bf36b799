"""The `teola` command, run as a user would (a subprocess of the installed entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def teola(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "teola_plugin.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_graph_writes_both_pictures_and_explains_the_passes(tmp_path):
    proc = teola("graph", "advanced_rag", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "pipeline_decode" in proc.stdout and "critical path" in proc.stdout
    after = (tmp_path / "advanced_rag_after.mmd").read_text()
    before = (tmp_path / "advanced_rag_before.mmd").read_text()
    assert "shard" in after and "shard" not in before
    assert (tmp_path / "advanced_rag_after.dot").read_text().startswith("digraph")


def test_graph_rejects_an_unknown_app():
    proc = teola("graph", "no_such_app")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.slow
def test_doctor_checks_every_part_without_the_llm():
    proc = teola("doctor", "--skip-llm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for part in ("import vllm", "model directory", "ray", "chromadb", "import llama_index.core", "import langchain_core"):
        assert f"ok    {part}" in proc.stdout
    assert "all good" in proc.stdout
