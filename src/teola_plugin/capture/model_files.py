"""Which files a sentence-transformers model loads, and whether two models load the same.

A framework's embedding class names its model either by directory or by hub id
(``sentence-transformers/all-MiniLM-L6-v2``, what the frameworks' docs write). A hub id loads
the snapshot in the local Hugging Face cache; it computes what the engine's directory
computes when both load the same files with the same bytes. Files that do not reach the
model (its card, training-data notes, git attributes) are not compared, nor other formats of
the weights (ONNX, OpenVINO folders; PyTorch ``.bin`` and the like next to
``model.safetensors``, which is compared). Hashes are kept per file (path, size, mtime): a
model's weights are read once per process.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NOT_LOADED = frozenset({"README.md", "data_config.json", "train_script.py"})
OTHER_BACKENDS = frozenset({"onnx", "openvino"})  # folders of other runtimes' exports
OTHER_WEIGHTS = frozenset({"pytorch_model.bin", "tf_model.h5", "rust_model.ot", "flax_model.msgpack"})

_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: weights hash once
_lock = threading.Lock()


def local_model_dir(model_name: Any, cache_folders: Sequence[str | None] = (None,)) -> Path | None:
    """The directory ``SentenceTransformer(model_name, cache_folder=...)`` loads without a
    download: ``model_name`` itself when it is a directory, else the hub id's snapshot in the
    first of ``cache_folders`` that holds one (``None``: sentence-transformers' own rule,
    ``SENTENCE_TRANSFORMERS_HOME`` and then the hub's default cache)."""
    path = Path(str(model_name)).expanduser()
    if path.is_dir():
        return path.resolve()
    from huggingface_hub import snapshot_download

    for folder in cache_folders:
        try:
            snapshot = snapshot_download(str(model_name), cache_dir=folder or os.getenv("SENTENCE_TRANSFORMERS_HOME"),
                                         local_files_only=True)
        except Exception:  # noqa: BLE001 — not a hub id, or not cached there
            continue
        return Path(snapshot).resolve()
    return None


def loaded_files(model_dir: Path) -> set[Path]:
    """The files of ``model_dir`` that reach the model, relative to it: not the card or the
    notes, not other formats' folders (ONNX, OpenVINO), and, next to ``model.safetensors``
    (which the torch backend loads), not the same weights in other formats."""
    files = {f.relative_to(model_dir) for f in model_dir.rglob("*") if f.is_file()}
    safetensors = Path("model.safetensors") in files
    return {rel for rel in files
            if rel.name not in NOT_LOADED and not any(part.startswith(".") for part in rel.parts)
            and rel.parts[0] not in OTHER_BACKENDS and not (safetensors and rel.name in OTHER_WEIGHTS)}


def first_difference(reference: Path, candidate: Path) -> str | None:
    """What differs in the first file that one directory loads and the other lacks or holds
    other bytes in ("model.safetensors differs"), else None: both load the same model."""
    ours, theirs = loaded_files(reference), loaded_files(candidate)
    for rel in sorted(ours | theirs):
        if rel not in theirs or rel not in ours:
            return f"{rel} is only in {reference if rel in ours else candidate}"
        if _digest(reference / rel) != _digest(candidate / rel):
            return f"{rel} differs"
    return None


def _digest(path: Path) -> str:
    stat = path.stat()  # follows the hub cache's symlinks to their blobs
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _lock:
        if key in _digests:
            return _digests[key]
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    with _lock:
        _digests[key] = sha.hexdigest()
    return _digests[key]
