"""Whether a framework's own sentence-transformers embedding model computes what a Teola
embedder engine computes, so its query embeddings may become ``embed`` primitives.

LlamaIndex ``HuggingFaceEmbedding`` and LangChain's community ``HuggingFaceEmbeddings`` each
load a ``SentenceTransformer`` in-process; the runtime's ``SentenceTransformerEmbedder``
loads its own directory (``model_path``, else the bundled all-MiniLM-L6-v2) and returns
normalized vectors. They agree only when the framework model loads the same files (the same
directory, or a hub id such as ``sentence-transformers/all-MiniLM-L6-v2`` whose snapshot in the
local Hugging Face cache holds byte-identical files: :mod:`.model_files`) and nothing it sets
changes the vectors: normalization (unless the model's own pipeline ends in
a ``Normalize`` module, when asking for it again changes nothing), a prompt / instruction,
a truncated dimension, another maximum sequence length. Read from the runtime's engine specs
and the model object: no engine call. Both frameworks' rules use :func:`embedder_serving`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import model_files

EMBEDDER_FACTORY = "SentenceTransformerEmbedder"


def _engine(specs: Mapping[str, Any]) -> tuple[str | None, Path | None]:
    from ..engines.embedder import default_model_path

    for name, spec in specs.items():
        if spec.kind == "embedder" and EMBEDDER_FACTORY in spec.factory:
            return name, Path(spec.kwargs.get("model_path") or default_model_path()).resolve()
    return None, None


def _config(model_dir: Path, file: str) -> Any:
    try:
        return json.loads((model_dir / file).read_text())
    except (OSError, ValueError):
        return None


def max_seq_length(model_dir: Path) -> int | None:
    config = _config(model_dir, "sentence_bert_config.json")
    return int(config["max_seq_length"]) if isinstance(config, dict) and "max_seq_length" in config else None


def normalizes_itself(model_dir: Path) -> bool:
    """The model's pipeline ends in sentence-transformers' ``Normalize`` module."""
    modules = _config(model_dir, "modules.json") or []
    return bool(modules) and str(modules[-1].get("type", "")).endswith("models.Normalize")


def embedder_serving(specs: Mapping[str, Any], label: str, model_name: Any, *, normalize: bool,
                     prompts: Mapping[str, Any] | None = None, truncate_dim: Any = None,
                     max_length: Any = None, cache_folders: Sequence[str | None] = (None,)
                     ) -> tuple[str | None, str]:
    """(engine name, "") of the embedder engine computing ``label``'s vectors, else (None, why).
    ``cache_folders``: where the framework class looks up a hub id's snapshot, in its order."""
    name, engine_dir = _engine(specs)
    if name is None or engine_dir is None:
        return None, "the runtime has no sentence-transformers embedder engine"
    model_dir = model_files.local_model_dir(model_name, cache_folders)
    if model_dir is None:
        return None, (f"{label} model {str(model_name)!r} is not the embedder engine's model ({engine_dir}): "
                      "neither its directory nor a hub id with a snapshot in the local cache")
    if model_dir != engine_dir:
        differing = model_files.first_difference(engine_dir, model_dir)
        if differing is not None:
            return None, (f"{label} model {str(model_name)!r} ({model_dir}) is not the embedder engine's model "
                          f"({engine_dir}): {differing}")
    if not normalize and not normalizes_itself(engine_dir):
        return None, f"{label} does not normalize its vectors (the engine does)"
    added = sorted(k for k, v in (prompts or {}).items() if v)
    if added:
        return None, f"{label} adds {' and '.join(f'a {k} instruction' for k in added)} to the texts it embeds"
    if truncate_dim is not None:
        return None, f"{label} truncates its vectors (truncate_dim)"
    engine_length = max_seq_length(engine_dir)
    if max_length is not None and max_length != engine_length:
        return None, f"{label} max_length {max_length} differs from the engine's ({engine_length})"
    return name, ""


def newlines_to_spaces(text: str) -> str:
    """LangChain ``HuggingFaceEmbeddings``' own preparation of every text it embeds."""
    return text.replace("\n", " ")


PLAIN_ENCODE_KWARGS = frozenset({"normalize_embeddings", "batch_size", "show_progress_bar"})  # vectors unchanged


def huggingface_embeddings_serving(specs: Mapping[str, Any], embeddings: Any, encode_kwargs: Mapping[str, Any],
                                   field: str = "encode_kwargs") -> tuple[str | None, str]:
    """(engine name, "") when the embedder engine computes what LangChain's
    ``HuggingFaceEmbeddings`` computes with ``encode_kwargs`` (its ``encode_kwargs``, or
    ``query_encode_kwargs`` for a query: ``field`` names which, for the reason), else (None,
    why). The lowered retriever rule and the calls of code run as it is
    (``served_calls/embedding_calls.py``) both ask here."""
    name = type(embeddings).__name__
    if embeddings.multi_process:
        return None, f"{name}(multi_process=True)"
    extra = sorted(set(encode_kwargs) - PLAIN_ENCODE_KWARGS)
    if extra:
        return None, f"{name} {field} {extra} change how it encodes"
    if set(embeddings.model_kwargs) - {"device"} or str(embeddings.model_kwargs.get("device", "cpu")) != "cpu":
        return None, f"{name} model_kwargs {sorted(embeddings.model_kwargs)} load it unlike the engine"
    client = getattr(embeddings, "_client", None) or getattr(embeddings, "client", None)
    return embedder_serving(specs, name, embeddings.model_name,
                            normalize=bool(encode_kwargs.get("normalize_embeddings", False)),
                            prompts=getattr(client, "prompts", None),
                            truncate_dim=getattr(client, "truncate_dim", None),
                            max_length=getattr(client, "max_seq_length", None),
                            cache_folders=[getattr(embeddings, "cache_folder", None)])
