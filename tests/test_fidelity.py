"""The fidelity harness (scripts/fidelity.py): its rewriter, and a fast subset of
langchain-core's own suites run plain and wrapped in TeolaRunnable (the full run, both
modes, is ``make fidelity``; its numbers are in docs/fidelity.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from fidelity_rewrite import rewrite  # noqa: E402

SOURCE = '''"""A test module."""
from __future__ import annotations


def helper(chain):
    return chain.invoke(1)


def test_calls(chain):
    assert chain.invoke(1) == 2
    out = [c for c in chain.with_config(tags=["t"]).stream(
        1)]
    fn = RunnableLambda(lambda x: inner.invoke(x))

    class Step(Runnable):
        def invoke(self, x, config=None):
            return super().invoke(x) + self.invoke(x)

    async def nested():
        return await chain.ainvoke(1)
'''


def test_the_rewriter_wraps_the_tests_call_sites_in_place_and_nothing_else():
    text, sites = rewrite(SOURCE, {"timeout_s": 5.0})
    assert sites == 2
    assert "    assert _teola_wrap(chain).invoke(1) == 2\n" in text
    assert '    out = [c for c in _teola_wrap(chain.with_config(tags=["t"])).stream(\n        1)]\n' in text
    # the chain's own code: helpers, lambdas, classes and functions a test defines
    for kept in ("    return chain.invoke(1)\n", "RunnableLambda(lambda x: inner.invoke(x))",
                 "return super().invoke(x) + self.invoke(x)", "return await chain.ainvoke(1)"):
        assert kept in text
    assert text.index("from __future__") < text.index("_TEOLA_OPTIONS = {'timeout_s': 5.0}")
    compile(text, "rewritten.py", "exec")


@pytest.mark.slow
@pytest.mark.extended  # langchain-core's suites in their own process: `make test-all` (all modes: `make fidelity`)
def test_langchain_cores_own_suites_pass_wrapped(tmp_path):
    """Downloads langchain-core's sdist of the installed version (pip, a registry download),
    runs three of its suites plain and with every chain wrapped: no test that passes plain
    fails wrapped."""
    suites = ["runnables/test_runnable.py", "runnables/test_fallbacks.py", "runnables/test_runnable_events_v2.py"]
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fidelity.py"), "--modes", "wrapped",
                           "--suites", *suites, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "fidelity.json").read_text())
    for suite in suites:
        result = report["suites"][suite]
        assert result["plain_passed"] > 10 and result["call_sites_wrapped"] > 10, (suite, result)
        assert result["wrapped_only_failures"] == [], (suite, result["wrapped_only_failures"])
        assert result["wrapped_passed"] >= result["plain_passed"]
