"""Which files a sentence-transformers model loads, and whether two models load the same.

A framework's embedding class names its model either by directory or by hub id
(``sentence-transformers/all-MiniLM-L6-v2``, what the frameworks' docs write). A hub id loads
the snapshot in the local Hugging Face cache; it computes what the engine's directory
computes when every file the engine's model loads is in the snapshot with the same bytes.
Files that do not reach the model (its card, training-data notes, git attributes) are not
compared; extra files in the snapshot (other formats: ONNX, OpenVINO, PyTorch ``.bin``) are
not loaded while ``model.safetensors`` is there, and that file is compared.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NOT_LOADED = frozenset({"README.md", "data_config.json", "train_script.py"})

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


def loaded_files(model_dir: Path) -> list[Path]:
    """The files of ``model_dir`` that reach the model, relative to it."""
    return sorted(f.relative_to(model_dir) for f in model_dir.rglob("*")
                  if f.is_file() and f.name not in NOT_LOADED
                  and not any(part.startswith(".") for part in f.relative_to(model_dir).parts))


def first_difference(reference: Path, candidate: Path) -> str | None:
    """The first file ``reference`` loads that ``candidate`` lacks or holds other bytes in
    ("model.safetensors"), else None: both directories load the same model."""
    for rel in loaded_files(reference):
        other = candidate / rel
        if not other.is_file():
            return f"{rel} (missing)"
        if _digest(reference / rel) != _digest(other):
            return str(rel)
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
