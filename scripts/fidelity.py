"""Fidelity harness: langchain-core's own tests, plain and with every chain wrapped in
``TeolaRunnable``; writes docs/fidelity.json and docs/fidelity.md.

    make fidelity        # or: . scripts/runtime_env.sh && .venv/bin/python scripts/fidelity.py

1. Downloads the sdist of the installed langchain-core with pip (a registry download, kept
   under ``.fidelity/``, nothing committed) and installs its test dependencies there
   (``pip install --target``: the project's environment is not touched).
2. Copies its tests once per mode: ``plain`` as they are; ``wrapped``: each test's call
   sites ``chain.X(...)`` rewritten to ``TeolaRunnable(chain).X(...)`` by
   ``fidelity_rewrite.py`` (assertions unchanged); ``graph-run``: the same with
   ``timeout_s`` set, which makes every call a graph run on the runtime even for a chain
   that puts nothing on an engine (what lowered chains get; the test suites' models are
   fakes, which Teola does not lower, so ``wrapped`` runs them as they are).
3. Runs pytest on each and compares test by test: a test that passes plain and fails in a
   mode is that mode's failure, listed with its first error line, unless it passes when run
   once more (then it is listed as passed on rerun: a loaded machine can fail a
   timing-sensitive test in any mode).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_rewrite import rewrite  # noqa: E402

TESTS = "tests/unit_tests"
SUITES = ("runnables/test_runnable.py", "runnables/test_fallbacks.py", "runnables/test_history.py",
          "runnables/test_configurable.py", "runnables/test_concurrency.py", "runnables/test_runnable_events_v2.py",
          "runnables/test_runnable_events_v1.py", "runnables/test_tracing_interops.py",
          "output_parsers/test_list_parser.py", "output_parsers/test_json.py", "output_parsers/test_openai_tools.py",
          "prompts/test_chat.py")
MODES = {"wrapped": {}, "graph-run": {"timeout_s": 600.0}}  # TeolaRunnable's keyword arguments
# langchain-core's test dependency group (pyproject.toml), without what the venv has already.
TEST_DEPS = ("pytest-asyncio>=1.3,<2", "syrupy>=5,<6", "freezegun>=1.2.2,<2", "pytest-mock>=3.10,<4",
             "blockbuster>=1.5.18,<1.6", "forbiddenfruit", "responses>=0.25,<1", "pytest-socket>=0.7,<0.9",
             "grandalf>=0.8,<1")
TEST_TIMEOUT_S = 120  # per test: a hang is a failure, not a stuck harness


def fetch_sdist(work: Path, ver: str) -> Path:
    """The unpacked sdist of langchain-core ``ver`` (downloaded once)."""
    src = work / f"langchain_core-{ver}"
    if not (src / TESTS).is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", f"langchain-core=={ver}", "--no-binary", ":all:",
                        "--no-deps", "-d", str(work)], check=True)
        with tarfile.open(work / f"langchain_core-{ver}.tar.gz") as tar:
            tar.extractall(work, filter="data")
    return src


def install_test_deps(work: Path) -> Path:
    site = work / "site"
    stamp = site / ".installed"
    if stamp.is_file() and stamp.read_text() == "\n".join(TEST_DEPS):
        return site
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--upgrade", "--target", str(site),
                    *TEST_DEPS], check=True)
    stamp.write_text("\n".join(TEST_DEPS))
    return site


def prepare(src: Path, dest: Path, suites: list[str], options: dict | None) -> dict[str, int]:
    """A copy of the sdist's tests (and its pyproject: pytest settings); with ``options``,
    the suites rewritten to wrap with them. Returns the call sites wrapped per suite."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src / "tests", dest / "tests")
    shutil.copy(src / "pyproject.toml", dest / "pyproject.toml")
    sites = {}
    for suite in suites if options is not None else ():
        path = dest / TESTS / suite
        text, sites[suite] = rewrite(path.read_text(encoding="utf-8"), options)
        path.write_text(text, encoding="utf-8")
    return sites


def run_pytest(tree: Path, site: Path, targets: list[str], report: Path) -> float:
    """pytest on ``targets`` (suites under ``TESTS``, or ``suite::test`` ids) in ``tree``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src")]))
    env.pop("PYTEST_ADDOPTS", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--timeout={TEST_TIMEOUT_S}",
                    f"--junitxml={report}", "-o", "junit_family=xunit1", *[f"{TESTS}/{t}" for t in targets]],
                   cwd=tree, env=env, check=False, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def rerun_failures(tree: Path, site: Path, plain: dict, mode: dict, report: Path) -> dict[str, list[dict]]:
    """Run each test that passed plain and failed in ``mode`` once more, alone with the other
    such tests (a slow machine can fail a timing-sensitive test either way): one that passes
    now counts as passed, and is listed ``{suite: [{"test", "first_outcome"}]}``."""
    failed = [(suite, f["test"]) for suite in mode for f in only_failures(plain.get(suite, {}), mode[suite])]
    if not failed:
        return {}
    run_pytest(tree, site, [f"{suite}::{test}" for suite, test in failed], report)
    again, passed_on_rerun = outcomes(report), {}
    for suite, test in failed:
        if again.get(suite, {}).get(test) == "passed":
            passed_on_rerun.setdefault(suite, []).append({"test": test, "first_outcome": mode[suite][test]})
            mode[suite][test] = "passed"
    return passed_on_rerun


def outcomes(report: Path) -> dict[str, dict[str, str]]:
    """``{suite: {test name: "passed" | "skipped" | "failure: <first line>" | "error: ..."}}``."""
    found: dict[str, dict[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        suite = file.split(TESTS + "/", 1)[-1]
        problem = next((c for c in case if c.tag in ("failure", "error")), None)
        if problem is not None:
            first = (problem.get("message") or problem.text or "").strip().splitlines()
            outcome = f"{problem.tag}: {first[0][:300] if first else ''}"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        found.setdefault(suite, {})[case.get("name")] = outcome
    return found


def only_failures(plain: dict[str, str], mode: dict[str, str]) -> list[dict[str, str]]:
    return [{"test": name, "outcome": mode.get(name, "not run")}
            for name, outcome in sorted(plain.items()) if outcome == "passed" and mode.get(name) != "passed"]


def write_markdown(data: dict, path: Path) -> None:
    lines = ["# Fidelity: langchain-core's own tests with every chain wrapped in TeolaRunnable", "",
             "Generated by `make fidelity` (scripts/fidelity.py); numbers in docs/fidelity.json.", "",
             f"langchain-core {data['langchain_core']}, the suites below from its sdist. Each call site "
             "`chain.X(...)` in a test function (`invoke`, `ainvoke`, `batch`, `stream`, `astream_events`, "
             "`transform`...) is rewritten to `TeolaRunnable(chain).X(...)`; assertions are unchanged. "
             "A wrapped-only failure passes plain and fails wrapped.", "",
             "- **wrapped**: `TeolaRunnable(chain)` as a user writes it. The suites' models are fakes, "
             "which no Teola engine serves, so these chains put nothing on an engine and run as they are "
             "(their own streams, run trees, config and batch; model-server calls would still go through "
             "Teola's served engines).",
             "- **graph run**: `TeolaRunnable(chain, timeout_s=600)`, which makes every call a graph run on "
             "the runtime (what a chain with a lowered model gets): the same chains traced into primitives, "
             "each component run as an opaque step or lowered, scheduled by the graph scheduler.", "",
             "| suite | plain passed | wrapped passed | wrapped-only failures | graph run passed "
             "| graph-run-only failures | call sites |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    wrapped = {suite: s.get("wrapped_only_failures", []) for suite, s in data["suites"].items()}
    graph = {suite: s.get("graph_run", {}).get("only_failures", []) for suite, s in data["suites"].items()}
    for suite, s in data["suites"].items():
        lines.append(f"| {suite} | {s['plain_passed']} | {s.get('wrapped_passed', '-')} | {len(wrapped[suite])} "
                     f"| {s.get('graph_run', {}).get('passed', '-')} | {len(graph[suite])} "
                     f"| {s['call_sites_wrapped']} |")
    lines += ["", f"Totals: {sum(map(len, wrapped.values()))} wrapped-only failures, "
              f"{sum(map(len, graph.values()))} graph-run-only failures. Run time: "
              + ", ".join(f"{mode} {t:.0f} s" for mode, t in data["run_s"].items()) + ".", ""]
    lines += ["## Where a graph run still differs from plain", "",
              "The graph-run column shows what a chain with a lowered model gets where its components "
              "run in the graph. The causes behind its failures:", "",
              "- **Run trees**: a graph run reports the run tree plain reports (every component's run under "
              "its parent, with its tags, inputs and outputs: `capture/langchain/run_scopes.py`, "
              "`langchain/run_tree.py`), so the tracing suites pass; what still differs in the event "
              "suites is the *stream* events of steps that run once instead of streaming (below), a "
              "model's token events interleaving differently with a parser's, and spies on a template's "
              "`invoke` (a lowered template is rendered inside the model call's format, its run reported "
              "by the run tree).",
              "- **Streams under `timeout_s`**: opaque steps run once on their whole input. Without `timeout_s`, "
              "the steps after a chain's last engine step stream through their own `transform` "
              "(`langchain/stream_split.py`); before it, a lowered model's tokens stream.",
              "- **Batch**: a component's own `batch` / `_batch` is not called (each input is one graph run, "
              "each step invoked): batch-only runnables raise, `return_exceptions` surfaces per input, and "
              "without it an input that fails stops the others' graph runs where they are (their requests "
              "aborted, their runs ending with its error): plain's sequence batches step by step, so an early "
              "step's error sends no model request at all, while the other graph runs may have sent theirs "
              "(the error raised is the same).",
              "- **Config as an argument**: opaque steps get the call's config through LangChain's context, not "
              "as an explicit argument (spies on `invoke` see `config=None`).",
              "- **A sync call inside a running event loop** waits for the graph run on the runtime's loop "
              "(LangChain's blockbuster fixture flags the wait).", ""]
    reran = [(suite, f) for suite, s in data["suites"].items()
             for f in s.get("wrapped_passed_on_rerun", []) + s.get("graph_run", {}).get("passed_on_rerun", [])]
    if reran:
        lines += ["## Passed when run once more", "",
                  *[f"- `{suite}::{f['test']}` (first: {f['first_outcome']})" for suite, f in reran], ""]
    for title, listed in (("Wrapped-only failures", wrapped), ("Graph-run-only failures", graph)):
        if any(listed.values()):
            lines += [f"## {title}", ""]
            for suite, failures in listed.items():
                lines += [f"- `{suite}::{f['test']}`: {f['outcome']}" for f in failures]
            lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".fidelity", help="download and run directory")
    ap.add_argument("--suites", nargs="*", default=list(SUITES), help="test files under " + TESTS)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", type=Path, default=None,
                    help="where fidelity.json / .md go (default: docs/ for a full run, else --work)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ver = version("langchain-core")
    src, site = fetch_sdist(args.work, ver), install_test_deps(args.work)
    results, run_s, sites, reruns = {}, {}, {}, {}
    for mode, options in {"plain": None, **{m: MODES[m] for m in args.modes}}.items():
        tree = args.work / mode
        sites = prepare(src, tree, args.suites, options) or sites
        run_s[mode] = round(run_pytest(tree, site, args.suites, args.work / f"{mode}.xml"), 1)
        results[mode] = outcomes(args.work / f"{mode}.xml")
        if mode != "plain":
            reruns[mode] = rerun_failures(tree, site, results["plain"], results[mode],
                                          args.work / f"{mode}-rerun.xml")
    suites = {}
    for suite in args.suites:
        plain = results["plain"].get(suite, {})
        per_mode = {m: results[m].get(suite, {}) for m in args.modes}
        suites[suite] = {"plain_passed": sum(o == "passed" for o in plain.values()), "call_sites_wrapped": sites[suite]}
        if "wrapped" in per_mode:
            suites[suite].update(wrapped_passed=sum(o == "passed" for o in per_mode["wrapped"].values()),
                                 wrapped_only_failures=only_failures(plain, per_mode["wrapped"]),
                                 wrapped_passed_on_rerun=reruns["wrapped"].get(suite, []))
        if "graph-run" in per_mode:
            suites[suite]["graph_run"] = {"passed": sum(o == "passed" for o in per_mode["graph-run"].values()),
                                          "only_failures": only_failures(plain, per_mode["graph-run"]),
                                          "passed_on_rerun": reruns["graph-run"].get(suite, [])}
    data = {"langchain_core": ver, "command": "make fidelity", "run_s": run_s, "suites": suites}
    full = set(args.modes) == set(MODES) and list(args.suites) == list(SUITES)
    out = args.out or (ROOT / "docs" if full else args.work)  # a partial run leaves the docs alone
    (out / "fidelity.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    write_markdown(data, out / "fidelity.md")
    print(f"wrapped-only failures: {sum(len(s.get('wrapped_only_failures', ())) for s in suites.values())}, "
          f"graph-run-only: {sum(len(s.get('graph_run', {}).get('only_failures', ())) for s in suites.values())} "
          f"({out / 'fidelity.md'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
