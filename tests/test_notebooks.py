"""The example notebooks: committed without outputs, and each runs headless (nbclient) on the
real engines in its own kernel, as a user would run it. The notebooks assert what they show
(same answer as the plain framework, replicas on the intended nodes), so a failing cell fails
the test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # one cell may start Ray and vLLM on a busy 2-core machine




@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_carries_no_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} carry outputs; clear them before committing "
                       f"(jupyter nbconvert --clear-output --inplace {path.name})")


def text_outputs(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for cell in nb.cells for out in cell.get("outputs", []))


EXPECT = {  # what each notebook must print (besides finishing without error), and its pictures
    "01_llama_index_quickstart": (["same answer: True", "source squad-", "opaque: ", "KeepBest"], 0),
    "02_langchain_quickstart": (["same answer: True", "format_docs", "batch: "], 0),
    "03_what_the_optimizer_did": (["critical path", "prune_dependencies", "llm_decode", "Chrome trace"], 4),
    "04_scaling_out": (["cluster address:", "batches run:", "no GPU on this machine"], 0),
    "05_langgraph_rag": (["same answer: True", "run as their own optimized graphs", "graph runs for one question: 4",
                          "updates: ['generate']"], 0),
    "06_llama_index_sub_questions_and_chat": (["sub-queries overlapped: True", "same sub-questions and sources: True",
                                              "same answers and memory: True", "retrieval ("], 0),
}


def test_each_notebook_has_its_expectations():
    # LlamaIndex, LangChain, what the optimizer did, scaling out, a LangGraph graph, sub-questions and chat
    assert [p.stem for p in NOTEBOOKS] == sorted(EXPECT)


@pytest.mark.slow
@pytest.mark.extended  # each kernel starts its own Ray and engines: `make test-all`
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless(path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # Run in a scratch folder (nothing lands in examples/); the kernel inherits this environment.
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()  # raises on a failing cell
    finally:
        keep = os.environ.get("TEOLA_NOTEBOOK_OUT")  # set it to look at the executed notebooks
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(keep) / path.name)
    texts, n_images = EXPECT[path.stem]
    out = text_outputs(nb)
    for text in texts:
        if text == "no GPU on this machine" and "GPU found" in out:
            continue
        assert text in out, f"{path.name}: expected {text!r} in its output"
    assert images(nb) >= n_images
