"""examples/llama_index_quickstart.py runs as a user would run it (its own process and runtime)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # its own Ray and engines: `make test-all`

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_index_quickstart.py"


def test_quickstart_example_runs_on_teola_and_matches_plain():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--passages", "20", "--max-tokens", "16"],
                            capture_output=True, text=True, timeout=420, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "A (Teola" in out and "source squad-" in out
    assert "opaque components: none" in out
    assert "same answer: True" in out
