"""The README's code runs as written: its LlamaIndex and LangChain sections, in one process
(one vLLM load), on the real engines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def section_code(readme: str, heading: str) -> str:
    section = readme.split(f"### {heading}\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under '### {heading}'"
    return match.group(1)


@pytest.mark.extended  # starts its own vLLM engine and Ray: `make test-all`
def test_readme_integration_sections_run_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text()
    script = tmp_path / "readme_sections.py"
    script.write_text(section_code(readme, "LlamaIndex") + "\nprint('=== langchain ===')\n"
                      + section_code(readme, "LangChain"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    llama_out, lang_out = proc.stdout.split("=== langchain ===")
    assert "squad-" in llama_out  # the printed source node ids are bundled passages
    assert lang_out.strip()  # an answer was printed


@pytest.mark.extended  # the README's script as a subprocess (~1.5 min); test_served_models runs the same apps: `make test-all`
def test_readme_served_models_section_runs_as_written(tmp_path, model_server):
    readme = (ROOT / "README.md").read_text()
    code = section_code(readme, "Served models")
    assert "http://127.0.0.1:8000/v1" in code
    script = tmp_path / "readme_served.py"
    script.write_text(code.replace("http://127.0.0.1:8000/v1", model_server.base_url)
                      + "\nassert Settings.executor.traced(index.as_query_engine(similarity_top_k=3)).opaque == []\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "squad-" in proc.stdout
