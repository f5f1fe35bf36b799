"""The `teola` command, run as a user would (a subprocess of the installed entry point)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from teola_plugin.cli import main

ROOT = Path(__file__).resolve().parents[1]


def teola(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "teola_plugin.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def teola_here(capsys, *args: str) -> subprocess.CompletedProcess[str]:
    """``teola`` in this process: for the checks that end before any engine starts (a
    subprocess costs an interpreter and the package's imports, ~8 s on 2 slow cores)."""
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["teola", *args], code, out.out, out.err)


def test_graph_writes_both_pictures_and_explains_the_passes(tmp_path):
    proc = teola("graph", "advanced_rag", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "pipeline_decode" in proc.stdout and "critical path" in proc.stdout
    after = (tmp_path / "advanced_rag_after.mmd").read_text()
    before = (tmp_path / "advanced_rag_before.mmd").read_text()
    assert "shard" in after and "shard" not in before
    assert (tmp_path / "advanced_rag_after.dot").read_text().startswith("digraph")
    assert (tmp_path / "advanced_rag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_graph_for_a_shared_cpu_declines_the_overlap_only_passes(tmp_path):
    proc = teola("graph", "naive_rag", "--hardware", "shared-cpu", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "planned for shared-cpu hardware" in proc.stdout
    after = (tmp_path / "naive_rag_after.mmd").read_text()
    assert "shard" not in after and "partial" not in after  # nothing to gain by overlapping one CPU


def test_graph_with_an_unknown_pass_says_which_without_a_traceback(tmp_path):
    proc = teola("graph", "naive_rag", "--disable", "no_such_pass", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "no_such_pass" in proc.stderr and "prune_dependencies" in proc.stderr  # names the valid ones
    assert "Traceback" not in proc.stderr


def test_graph_rejects_an_unknown_app():
    proc = teola("graph", "no_such_app")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.slow
@pytest.mark.extended  # imports and starts every part in its own process: `make test-all`
def test_doctor_checks_every_part_without_the_llm():
    proc = teola("doctor", "--skip-llm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for part in ("import vllm", "GPU and vLLM build", "engine environment", "model directory", "ray", "chromadb",
                 "import llama_index.core", "import langchain_core"):
        assert f"ok    {part}" in proc.stdout
    assert "all good" in proc.stdout


def commands(capsys) -> list[str]:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    return re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out).group(1).split(",")


def test_help_works_for_every_command(capsys):
    names = commands(capsys)
    assert {"demo", "graph", "doctor"} <= set(names)
    for name in names:
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        out = capsys.readouterr().out
        assert done.value.code == 0 and out.startswith(f"usage: teola {name}"), name
        assert "--verbose" in out, f"teola {name} lacks -v/--verbose"


LOG_PROBE = """
import logging, sys
import teola_plugin
from teola_plugin.cli import _configure_logging
if sys.argv[1] != "library":
    _configure_logging(int(sys.argv[1]))
log = logging.getLogger("teola_plugin.probe")
log.warning("probe-warning"); log.info("probe-info"); log.debug("probe-debug")
"""


@pytest.mark.parametrize("mode, shown", [
    ("library", []),  # imported as a library: no output unless the application configures logging
    ("0", ["probe-warning"]),
    ("1", ["probe-warning", "probe-info"]),
    ("2", ["probe-warning", "probe-info", "probe-debug"]),
])
def test_logging_is_silent_in_the_library_and_verbose_in_the_cli(mode, shown):
    proc = subprocess.run([sys.executable, "-c", LOG_PROBE, mode], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stderr
    found = [word for word in ("probe-warning", "probe-info", "probe-debug") if word in proc.stderr]
    assert found == shown


def test_verbose_flag_is_accepted_before_and_after_the_command(tmp_path):
    proc = teola("-v", "graph", "naive_rag", "-v", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "naive_rag.png").exists()


@pytest.mark.slow
def test_doctor_reports_a_bad_model_directory_with_its_fix(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TEOLA_MODEL_DIR": str(tmp_path)}  # empty: no model
    proc = subprocess.run([sys.executable, "-m", "teola_plugin.cli", "doctor", "--skip-llm"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 1
    assert "FAIL  model directory" in proc.stdout and "fix: set TEOLA_MODEL_DIR" in proc.stdout
    assert "1 problem(s) found" in proc.stdout


def test_bench_report_only_regenerates_the_page_from_results_json(tmp_path):
    import json

    run = lambda system, s: {"system": system, "query": "q1", "latency_s": s, "answer": "x"}  # noqa: E731
    stats = lambda s: {"mean_s": s, "p50_s": s, "p99_s": s, "n": 1, "fidelity": 1.0, "em": 0.0, "f1": 0.5}  # noqa: E731
    results = {"machine": "test machine", "command": "teola bench --quick", "mode": "quick", "config": {},
               "apps": {"search_gen": {"title": "3 Search", "framework": "langchain", "workload": "w",
                                       "systems": {"plain-sequential": stats(4.0), "teola-full": stats(2.0)},
                                       "runs": [run("plain-sequential", 4.0), run("teola-full", 2.0)],
                                       "bound_mean_s": 1.6, "teola_over_bound": 1.25, "ideal_speedup": 2.5,
                                       "achieved_speedup": 2.0, "share_of_ideal": 0.667, "errors": []}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    page = tmp_path / "bench.md"
    proc = teola("bench", "--report-only", "--out", str(tmp_path), "--page", str(page))
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "teola bench --quick" in text and "test machine" in text
    assert "| teola-full | 1 | 2.00 |" in text and "2.00x" in text
    assert "achieved 2.00x of an ideal 2.50x, 67% of the ideal gain" in text and "MISSED" in text  # 67% < 80%
    assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"
    # --rebound: the bounds again from the run's recorded traces (a search then the answer's prefill and decode)
    node = lambda name, op, preds, s: {"name": name, "op": op, "engine": "e", "kind": "cpu", "group": "cpu:host",  # noqa: E731
                                       "preds": preds, "items": 1.0, "measured_s": s}
    trace = {"app": "search_gen", "query": "q1", "outside_s": 0.1, "graphs": [{"name": "g", "nodes": [
        node("search", "search", [], 0.2), node("llm", "opaque", ["search"], 1.5)]}]}
    (tmp_path / "traces.json").write_text(json.dumps({"apps": {"search_gen": [trace]}}))
    results["apps"]["search_gen"]["bounds"] = [{"query": "q1", "bound_s": 1.6}]
    (tmp_path / "results.json").write_text(json.dumps(results))
    proc = teola("bench", "--report-only", "--rebound", "--out", str(tmp_path), "--page", str(page))
    assert proc.returncode == 0, proc.stderr
    app = json.loads((tmp_path / "results.json").read_text())["apps"]["search_gen"]
    assert app["bound_mean_s"] == pytest.approx(1.8) and app["hw_bound_mean_s"] == pytest.approx(1.8)
    assert "bounds recomputed from the run's recorded traces" in page.read_text()
    assert "ideal 2.22x" in page.read_text()  # 4.0 s / 1.8 s


def test_bench_rejects_an_unknown_app():
    proc = teola("bench", "--apps", "no_such_app", "--out", "/nonexistent")
    assert proc.returncode == 2 and "no_such_app" in proc.stderr


@pytest.mark.slow
@pytest.mark.extended  # `make demo` itself, in its own process with its own engines: `make test-all`
def test_demo_answers_with_plain_llama_index_and_teola_and_writes_pictures(tmp_path):
    proc = teola("demo", "--questions", "1", "--docs", "20", "--max-tokens", "16", "--out", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "plain LlamaIndex" in proc.stdout and "teola" in proc.stdout and "x over 1 questions" in proc.stdout
    for name in ("graph.png", "graph_module_order.mmd", "graph_teola.mmd", "explain.txt", "timeline.png",
                 "timeline.json"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_bench_guards_an_unfinished_run_and_resumes_only_as_it_started(tmp_path, capsys):
    """A run of hours saves its progress; a new run never overwrites an unfinished one by
    accident, and a resumed run keeps the settings and the code it started with."""
    import json

    from teola_plugin.bench.checkpoint import Checkpoint

    ckpt = tmp_path / "checkpoint.json"
    proc = teola_here(capsys, "bench", "--resume", "--checkpoint", str(ckpt))
    assert proc.returncode == 2 and "no benchmark checkpoint" in proc.stderr
    Checkpoint.start(ckpt, {"apps": ["search_gen"]}).save()  # an interrupted run
    proc = teola_here(capsys, "bench", "--quick", "--checkpoint", str(ckpt), "--out", str(tmp_path))
    assert proc.returncode == 2 and "unfinished" in proc.stderr and "--fresh" in proc.stderr
    proc = teola_here(capsys, "bench", "--resume", "--questions", "3", "--checkpoint", str(ckpt))
    assert proc.returncode == 2 and "'--questions'" in proc.stderr
    proc = teola_here(capsys, "bench", "--report-only", "--resume", "--out", str(tmp_path))
    assert proc.returncode == 2 and "--report-only" in proc.stderr
    proc = teola_here(capsys, "bench", "--rebound", "--out", str(tmp_path))  # it recomputes a finished run's
    assert proc.returncode == 2 and "--rebound" in proc.stderr and "--report-only" in proc.stderr
    (tmp_path / "results.json").write_text(json.dumps({"apps": {}}))  # a run without its traces
    proc = teola_here(capsys, "bench", "--report-only", "--rebound", "--out", str(tmp_path))
    assert proc.returncode == 2 and "traces.json" in proc.stderr and "--no-bound" in proc.stderr
    data = json.loads(ckpt.read_text())
    live = {"started": "now", "open": True, "pid": os.getpid(), "host": __import__("socket").gethostname()}
    ckpt.write_text(json.dumps({**data, "segments": [live]}))  # this test process stands for a running run
    proc = teola_here(capsys, "bench", "--resume", "--checkpoint", str(ckpt))
    assert proc.returncode == 2 and "still running" in proc.stderr
    ckpt.write_text(json.dumps({**data, "code_identity": "0" * 16}))  # other package source
    proc = teola_here(capsys, "bench", "--resume", "--checkpoint", str(ckpt))
    assert proc.returncode == 2 and "same code" in proc.stderr and "git worktree" in proc.stderr
