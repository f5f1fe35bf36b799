"""Fidelity harness: langchain-core's own runnable tests, plain and with every chain wrapped
in ``TeolaRunnable``; writes docs/fidelity.json and docs/fidelity.md.

    make fidelity                  # or: . scripts/runtime_env.sh && .venv/bin/python scripts/fidelity.py

1. Downloads the sdist of the installed langchain-core with pip (a registry download, kept
   under ``.fidelity/``, nothing committed) and installs its test dependencies there
   (``pip install --target``: the project's environment is not touched).
2. Copies the sdist twice: ``plain/`` as it is, ``wrapped/`` with the chosen test files'
   call sites rewritten by ``fidelity_rewrite.py`` (assertions unchanged).
3. Runs pytest on both and compares test by test: a test that passes plain and fails
   wrapped is a wrapped-only failure, listed with its first error line.
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

SUITES = ("test_runnable.py", "test_fallbacks.py", "test_history.py", "test_configurable.py",
          "test_concurrency.py", "test_runnable_events_v2.py")
SUITE_DIR = "tests/unit_tests/runnables"
# langchain-core's test dependency group (pyproject.toml), without what the venv has already.
TEST_DEPS = ("pytest-asyncio>=1.3,<2", "syrupy>=5,<6", "freezegun>=1.2.2,<2", "pytest-mock>=3.10,<4",
             "blockbuster>=1.5.18,<1.6", "forbiddenfruit", "responses>=0.25,<1", "pytest-socket>=0.7,<0.9",
             "grandalf>=0.8,<1")
TEST_TIMEOUT_S = 120  # per test: a hang is a failure, not a stuck harness


def fetch_sdist(work: Path, ver: str) -> Path:
    """The unpacked sdist of langchain-core ``ver`` (downloaded once)."""
    src = work / f"langchain_core-{ver}"
    if not (src / SUITE_DIR).is_dir():
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


def prepare(src: Path, dest: Path, suites: list[str], wrap: bool) -> dict[str, int]:
    """A copy of the sdist's tests (and its pyproject: pytest settings); with ``wrap``, the
    suites rewritten. Returns the call sites wrapped per suite."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src / "tests", dest / "tests")
    shutil.copy(src / "pyproject.toml", dest / "pyproject.toml")
    sites = {}
    for suite in suites if wrap else ():
        path = dest / SUITE_DIR / suite
        text, sites[suite] = rewrite(path.read_text(encoding="utf-8"))
        path.write_text(text, encoding="utf-8")
    return sites


def run_pytest(tree: Path, site: Path, suites: list[str], report: Path) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src")]))
    env.pop("PYTEST_ADDOPTS", None)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--timeout={TEST_TIMEOUT_S}", f"--junitxml={report}", "-o", "junit_family=xunit1",
                    *[f"{SUITE_DIR}/{s}" for s in suites]], cwd=tree, env=env, check=False)
    return time.perf_counter() - start


def outcomes(report: Path) -> dict[str, dict[str, str]]:
    """``{suite file: {test id: "passed" | "failed: <first line>" | "skipped"}}``."""
    found: dict[str, dict[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        suite = Path(case.get("file") or case.get("classname", "").replace(".", "/") + ".py").name
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


def compare(plain: dict[str, dict[str, str]], wrapped: dict[str, dict[str, str]], suites: list[str],
            sites: dict[str, int]) -> dict:
    result = {}
    for suite in suites:
        p, w = plain.get(suite, {}), wrapped.get(suite, {})
        failures = [{"test": name, "wrapped": w.get(name, "not run")}
                    for name, outcome in sorted(p.items()) if outcome == "passed" and w.get(name) != "passed"]
        result[suite] = {"plain_passed": sum(o == "passed" for o in p.values()),
                         "wrapped_passed": sum(o == "passed" for o in w.values()),
                         "call_sites_wrapped": sites.get(suite, 0),
                         "wrapped_only_failures": failures}
    return result


def write_markdown(data: dict, path: Path) -> None:
    lines = ["# Fidelity: langchain-core's own tests with every chain wrapped in TeolaRunnable", "",
             "Generated by `make fidelity` (scripts/fidelity.py); numbers in docs/fidelity.json.", "",
             f"langchain-core {data['langchain_core']}, its `{SUITE_DIR}` suites. Each call site "
             "`chain.X(...)` in a test function (`invoke`, `ainvoke`, `batch`, `stream`, `astream_events`...) "
             "is rewritten to `TeolaRunnable(chain).X(...)`; assertions are unchanged. A wrapped-only "
             "failure passes plain and fails wrapped.", "",
             "| suite | plain passed | wrapped passed | call sites wrapped | wrapped-only failures |",
             "|---|---:|---:|---:|---:|"]
    for suite, s in data["suites"].items():
        lines.append(f"| {suite} | {s['plain_passed']} | {s['wrapped_passed']} | {s['call_sites_wrapped']} "
                     f"| {len(s['wrapped_only_failures'])} |")
    lines += ["", f"Run time: plain {data['plain_s']:.0f} s, wrapped {data['wrapped_s']:.0f} s.", ""]
    for suite, s in data["suites"].items():
        if s["wrapped_only_failures"]:
            lines += [f"## {suite}", ""]
            lines += [f"- `{f['test']}`: {f['wrapped']}" for f in s["wrapped_only_failures"]]
            lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=ROOT / ".fidelity", help="download and run directory")
    ap.add_argument("--suites", nargs="*", default=list(SUITES), help="test files under " + SUITE_DIR)
    ap.add_argument("--out", type=Path, default=ROOT / "docs", help="where fidelity.json / .md go")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ver = version("langchain-core")
    src, site = fetch_sdist(args.work, ver), install_test_deps(args.work)
    prepare(src, args.work / "plain", args.suites, wrap=False)
    sites = prepare(src, args.work / "wrapped", args.suites, wrap=True)
    plain_s = run_pytest(args.work / "plain", site, args.suites, args.work / "plain.xml")
    wrapped_s = run_pytest(args.work / "wrapped", site, args.suites, args.work / "wrapped.xml")
    data = {"langchain_core": ver, "command": "make fidelity", "plain_s": round(plain_s, 1),
            "wrapped_s": round(wrapped_s, 1),
            "suites": compare(outcomes(args.work / "plain.xml"), outcomes(args.work / "wrapped.xml"),
                              args.suites, sites)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    write_markdown(data, args.out / "fidelity.md")
    total = sum(len(s["wrapped_only_failures"]) for s in data["suites"].values())
    print(f"wrapped-only failures: {total} (docs/fidelity.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
