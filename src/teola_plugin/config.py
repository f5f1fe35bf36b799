"""Where things live on disk, and the environment knobs that choose them.

TEOLA_CACHE_DIR   base of everything we materialise (default ~/.cache/teola_plugin)
TEOLA_MODEL_DIR   the LLM directory to serve (default: the converted SmolLM2 in the cache)
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LLM_NAME = "SmolLM2-135M-Instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("TEOLA_CACHE_DIR", Path.home() / ".cache" / "teola_plugin")).expanduser()


def default_model_dir() -> Path:
    """The LLM served by default: TEOLA_MODEL_DIR, else the converted bundled SmolLM2."""
    override = os.environ.get("TEOLA_MODEL_DIR")
    if override:
        return Path(override).expanduser()
    return cache_dir() / "models" / DEFAULT_LLM_NAME
