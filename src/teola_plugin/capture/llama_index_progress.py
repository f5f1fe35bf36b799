"""LlamaIndex's "Generating embeddings" progress bar, for node embeddings Teola computes.

Plain LlamaIndex shows it (tqdm.auto, to stderr) when ``show_progress=True`` reaches
``VectorStoreIndex._add_nodes_to_index``: ``from_documents(..., show_progress=True)`` or
``insert_nodes(nodes, show_progress=True)``; ``insert(doc)`` passes nothing there, so no
embedding bar, as in plain LlamaIndex. Under the executor the embedding runs elsewhere, so the
bar is driven from there (``show_progress`` travels with the deferred nodes, ``PendingBatch``):

* deferred nodes joined into a query's graph: the run's ``Claim`` holds a :class:`NodeProgress`
  that counts nodes as each shard's vectors reach the insert and closes once all are stored;
* nodes embedded through the executor at call time (``defer_ingestion=False``, or a flush):
  :func:`embedding_bar` around that Teola query (it returns all vectors at once: one step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

DESCRIPTION = "Generating embeddings"  # LlamaIndex's (BaseEmbedding.get_text_embedding_batch)


def embedding_bar(total: int) -> Any:
    """The bar LlamaIndex's ``get_tqdm_iterable`` makes, sized up front (we count nodes)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=DESCRIPTION)


class NodeProgress:
    """Embedded nodes of one run, by flat position; only batches that asked for a bar count."""

    def __init__(self, shown: Sequence[range] = ()) -> None:
        self._shown = list(shown)
        self._seen: set[int] = set()  # a position counts once, however often it arrives
        total = sum(len(r) for r in self._shown)
        self._bar = embedding_bar(total) if total else None

    @classmethod
    def for_batches(cls, batches: Iterable[Any]) -> NodeProgress:
        """Positions run over the batches' nodes in order, as ``Claim`` numbers them."""
        shown, start = [], 0
        for batch in batches:
            if getattr(batch, "show_progress", False):
                shown.append(range(start, start + len(batch.nodes)))
            start += len(batch.nodes)
        return cls(shown)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, positions: Iterable[int]) -> None:
        if self._bar is None:
            return
        new = {p for p in positions if p not in self._seen and any(p in r for r in self._shown)}
        if new:
            self._seen |= new
            self._bar.update(len(new))

    def close(self) -> None:
        """Idempotent. A run that embedded nothing (released before it started) leaves no
        empty bar behind: its nodes are pending again and get their bar when stored."""
        bar, self._bar = self._bar, None
        if bar is not None:
            if not self._seen:
                bar.leave = False
            bar.close()
