"""Vector store engine (kind ``vector_store``) on embedded chromadb.

One chromadb collection per index, cosine space, so a hit's ``score`` is the cosine
similarity (``1 - distance``; higher is better). The HNSW parameters are set explicitly
rather than left to chromadb: ``ef_construction=200, max_neighbors=32, ef_search=100``
(chromadb's defaults are 100 / 16 / 100). Measured recall@10 against exact brute-force
search, 200 questions as queries, MiniLM embeddings: 1.000 on squad-xquad-en (240
passages) and 1.000 on hotpotqa-dev-500 (4,858) with these settings; chromadb's defaults
give 1.000 / 0.9975, and ``ef_search=10`` drops to 0.97 / 0.90.
``tests/test_engine_vector_store.py`` re-measures it.

In chromadb >= 1.0 these are set through the collection ``configuration``
(``{"hnsw": {"space", "ef_construction", "max_neighbors", "ef_search"}}``), not the
legacy ``hnsw:*`` metadata keys.

Storage: in memory by default (the data lives as long as the engine is started), or
on disk under ``persist_dir`` (survives ``close()`` and a new process). chromadb shares
one in-memory system per process, so each in-memory engine keeps its collections under
a private name prefix: two engines never see each other's indexes.

Writes are all-or-nothing per call: every input check runs before anything is written
(:class:`~teola_plugin.errors.EngineInputError`), and if chromadb fails part-way through
a multi-chunk insert, the ids this call added are deleted again before the error propagates.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, EngineInputError
from .base import Engine, Hit, check_texts

__all__ = ["ChromaVectorStore"]

_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?$")
_DIM_KEY = "teola_dim"
_META_TYPES = (str, int, float, bool)


def _meta_value_ok(val: Any) -> bool:
    """What chromadb stores: a scalar, None, or a non-empty list of scalars of one type."""
    if val is None or isinstance(val, _META_TYPES):
        return not (isinstance(val, float) and not np.isfinite(val))
    if isinstance(val, list) and val:
        kinds = {bool if isinstance(v, bool) else type(v) for v in val}
        return len(kinds) == 1 and kinds <= {str, int, float, bool}
    return False


def _check_index_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise EngineInputError(
            f"index name must be 1-200 characters of [A-Za-z0-9._-], starting and ending with a letter "
            f"or digit, without '..'; got {name!r}"
        )
    return name


def _pos_int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"{what} must be a positive int, got {v!r}")
    return v


class ChromaVectorStore(Engine):
    """Vector indexes on embedded chromadb.

    Args:
        persist_dir: directory for a persistent store; ``None`` (default) = in memory.
        ef_construction, max_neighbors: HNSW build parameters (fixed per index at creation).
        ef_search: HNSW search breadth (the effective value is ``max(ef_search, k)``).
        insert_batch_size: most vectors per chromadb ``add`` call (``None``: chromadb's limit).
        name: engine name for schedulers and reports.

    Operations: ``insert`` and ``search`` (``batch_insert`` / ``batch_search`` merge several
    queries' requests into one chromadb call per index), also reachable under the primitive
    names ``vector_insert`` / ``vector_search`` so a scheduler can dispatch a primitive's op
    as is.
    """

    kind: ClassVar[str] = "vector_store"

    def __init__(
        self,
        persist_dir: str | Path | None = None,
        ef_construction: int = 200,
        max_neighbors: int = 32,
        ef_search: int = 100,
        insert_batch_size: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        self.persist_dir = None if persist_dir is None else str(persist_dir)
        self.ef_construction = _pos_int(ef_construction, "ef_construction")
        self.max_neighbors = _pos_int(max_neighbors, "max_neighbors")
        self.ef_search = _pos_int(ef_search, "ef_search")
        self.insert_batch_size = None if insert_batch_size is None else _pos_int(insert_batch_size, "insert_batch_size")
        self._client: Any = None
        self._prefix = ""
        self._indexes: dict[str, tuple[Any, int]] = {}
        self._write_lock: asyncio.Lock | None = None
        self._max_batch = 0

    # -- lifecycle ---------------------------------------------------------------------
    async def _load(self) -> None:
        self._client = await asyncio.to_thread(self._open_client)
        self._write_lock = asyncio.Lock()
        self._indexes = {}
        try:
            limit = int(self._client.get_max_batch_size())
        except Exception:  # pragma: no cover - older clients
            limit = 5000
        self._max_batch = min(limit, self.insert_batch_size or limit)

    def _open_client(self) -> Any:
        import chromadb
        from chromadb.config import Settings

        settings = Settings(anonymized_telemetry=False, allow_reset=False)
        if self.persist_dir is None:
            self._prefix = f"teola-{uuid.uuid4().hex[:12]}-"
            return chromadb.EphemeralClient(settings=settings)
        Path(self.persist_dir).mkdir(parents=True, exist_ok=True)
        self._prefix = "teola-"
        return chromadb.PersistentClient(path=self.persist_dir, settings=settings)

    async def _unload(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            if self.persist_dir is None:  # in memory: the data lives as long as the engine
                for name in await asyncio.to_thread(self._physical_names):
                    await asyncio.to_thread(client.delete_collection, name)
        finally:
            self._client = None
            self._indexes = {}
            close = getattr(client, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    def _physical_names(self) -> list[str]:
        return [c.name for c in self._client.list_collections() if c.name.startswith(self._prefix)]

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(
            persist_dir=self.persist_dir,
            space="cosine",
            ef_construction=self.ef_construction,
            max_neighbors=self.max_neighbors,
            ef_search=self.ef_search,
        )
        return d

    # -- index bookkeeping ---------------------------------------------------------------
    def _lookup(self, name: Any) -> tuple[Any, int]:
        """(collection, dim) of an existing index, or EngineInputError naming the known ones."""
        _check_index_name(name)
        hit = self._indexes.get(name)
        if hit is not None:
            return hit
        try:
            coll = self._client.get_collection(self._prefix + name, embedding_function=None)
        except Exception:
            coll = None
        dim = None if coll is None else (coll.metadata or {}).get(_DIM_KEY)
        if coll is None or not isinstance(dim, int):
            known = sorted(n[len(self._prefix):] for n in self._physical_names())
            raise EngineInputError(f"unknown index {name!r}; existing indexes: {known}")
        self._indexes[name] = (coll, dim)
        return coll, dim

    async def list_indexes(self) -> list[str]:
        """Names of the indexes in this store."""
        self._require_started()
        return sorted(n[len(self._prefix):] for n in await asyncio.to_thread(self._physical_names))

    async def create_index(self, name: str, dim: int, exist_ok: bool = True) -> None:
        """Create index ``name`` for ``dim``-dimensional vectors.

        If it exists already: nothing happens when ``exist_ok`` and the dimension agrees;
        otherwise EngineInputError.
        """
        self._require_started()
        _check_index_name(name)
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise EngineInputError(f"dim must be a positive int, got {dim!r}")
        async with self._write_lock:
            try:
                _, have = await asyncio.to_thread(self._lookup, name)
            except EngineInputError:
                have = None
            if have is not None:
                if have != dim:
                    raise EngineInputError(f"index {name!r} exists with dimension {have}, not {dim}")
                if not exist_ok:
                    raise EngineInputError(f"index {name!r} exists already")
                return
            coll = await asyncio.to_thread(self._create, name, dim)
            self._indexes[name] = (coll, dim)

    def _create(self, name: str, dim: int) -> Any:
        return self._client.create_collection(
            self._prefix + name,
            configuration={
                "hnsw": {
                    "space": "cosine",
                    "ef_construction": self.ef_construction,
                    "max_neighbors": self.max_neighbors,
                    "ef_search": self.ef_search,
                }
            },
            metadata={_DIM_KEY: dim},
            embedding_function=None,
        )

    async def delete_index(self, name: str) -> None:
        """Drop index ``name`` and its data (EngineInputError if it does not exist)."""
        self._require_started()
        async with self._write_lock:
            await asyncio.to_thread(self._lookup, name)
            await asyncio.to_thread(self._client.delete_collection, self._prefix + name)
            self._indexes.pop(name, None)

    async def count(self, index: str) -> int:
        """Number of vectors in ``index``."""
        self._require_started()
        coll, _ = await asyncio.to_thread(self._lookup, index)
        return int(await asyncio.to_thread(coll.count))

    async def index_info(self, index: str) -> dict[str, Any]:
        """``{"name", "dim", "count", "hnsw": {...}}``, the HNSW settings as chromadb reports them."""
        self._require_started()
        coll, dim = await asyncio.to_thread(self._lookup, index)
        n = await asyncio.to_thread(coll.count)
        hnsw = dict((coll.configuration or {}).get("hnsw") or {})
        return {"name": index, "dim": dim, "count": int(n), "hnsw": hnsw}

    # -- input checks (no state touched) -------------------------------------------------
    def _check_vectors(self, vectors: Any, dim: int, index: str, where: str) -> np.ndarray:
        if isinstance(vectors, (str, bytes)):
            raise EngineInputError(f"{where} vectors must be a 2-D array of numbers, got {type(vectors).__name__}")
        try:
            arr = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise EngineInputError(f"{where} vectors must be a 2-D array of numbers: {e}") from e
        if arr.ndim != 2:
            hint = "; wrap a single vector as [v]" if arr.ndim == 1 else ""
            raise EngineInputError(f"{where} vectors must be 2-D (n, {dim}), got shape {arr.shape}{hint}")
        if arr.shape[0] == 0:
            raise EngineInputError(f"{where} vectors is empty")
        if arr.shape[1] != dim:
            raise EngineInputError(
                f"{where} vectors have dimension {arr.shape[1]}, but index {index!r} has dimension {dim}"
            )
        if not np.isfinite(arr).all():
            raise EngineInputError(f"{where} vectors contain NaN or infinity")
        return arr

    def _check_insert(self, r: Mapping[str, Any], where: str) -> tuple[Any, str, list[str], np.ndarray, list[str], list[dict] | None]:
        if not isinstance(r, Mapping) or not {"index", "ids", "vectors", "texts"} <= set(r) or set(r) - {
            "index", "ids", "vectors", "texts", "metadatas"
        }:
            got = sorted(r) if isinstance(r, Mapping) else type(r).__name__
            raise EngineInputError(f"{where} must have keys index, ids, vectors, texts[, metadatas], got {got}")
        index = r["index"]
        coll, dim = self._lookup(index)
        ids = check_texts(r["ids"], f"{where} ids")
        vectors = self._check_vectors(r["vectors"], dim, index, where)
        texts = check_texts(r["texts"], f"{where} texts")
        metadatas = r.get("metadatas")
        if len(ids) != len(vectors) or len(ids) != len(texts):
            raise EngineInputError(
                f"{where}: ids, vectors and texts must have the same length, got {len(ids)}, {len(vectors)}, {len(texts)}"
            )
        if any(not i for i in ids):
            raise EngineInputError(f"{where}: ids must be non-empty strings")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
            raise EngineInputError(f"{where}: duplicate ids in one insert: {dup}")
        metas = None
        if metadatas is not None:
            if isinstance(metadatas, (str, bytes, Mapping)) or not isinstance(metadatas, Sequence):
                raise EngineInputError(f"{where} metadatas must be a list of dicts, got {type(metadatas).__name__}")
            if len(metadatas) != len(ids):
                raise EngineInputError(f"{where}: {len(metadatas)} metadatas for {len(ids)} ids")
            metas = []
            for j, m in enumerate(metadatas):
                if m is None:
                    metas.append(None)
                    continue
                if not isinstance(m, Mapping):
                    raise EngineInputError(f"{where} metadatas[{j}] must be a dict, got {type(m).__name__}")
                for key, val in m.items():
                    if not isinstance(key, str) or not key or key.startswith("chroma:") or key == "#document":
                        raise EngineInputError(f"{where} metadatas[{j}] has an invalid key {key!r}")
                    if not _meta_value_ok(val):
                        raise EngineInputError(
                            f"{where} metadatas[{j}][{key!r}] must be str, int, float, bool, None or a "
                            f"non-empty list of one of those scalar types, got {val!r:.80}"
                        )
                metas.append(dict(m) or None)
        return coll, index, ids, vectors, texts, metas

    # -- typed API -----------------------------------------------------------------------------
    async def insert(
        self,
        index: str,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str],
        metadatas: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> int:
        """Add ``vectors`` (n, dim) with their ``ids`` and ``texts``; all or nothing. Returns n."""
        (n,) = await self.batch_insert(
            [{"index": index, "ids": ids, "vectors": vectors, "texts": texts, "metadatas": metadatas}]
        )
        return n

    async def search(self, index: str, vectors: Any, k: int = 10) -> list[list[Hit]]:
        """The ``k`` nearest neighbours of each query vector, best first (``k`` clipped to
        the index size; an empty index returns empty lists)."""
        (out,) = await self.batch_search([{"index": index, "vectors": vectors, "k": k}])
        return out

    # -- batched entry points --------------------------------------------------------------------
    async def batch_insert(self, requests: list[dict[str, Any]]) -> list[int]:
        """Requests ``{"index", "ids", "vectors", "texts", "metadatas"?}`` -> count inserted each.

        All requests are checked first (including ids repeated across requests or already in
        the index); then one write per index. If a write fails, everything this call added is
        removed again.
        """
        self._require_started()
        async with self._write_lock:  # one thread hop for the checks and the write: calls are short
            return await asyncio.to_thread(self._insert_all, requests)

    def _insert_all(self, requests: list[dict[str, Any]]) -> list[int]:
        parsed = [self._check_insert(r, f"insert request {i}") for i, r in enumerate(requests)]
        groups: dict[str, list[int]] = {}
        for i, p in enumerate(parsed):
            groups.setdefault(p[1], []).append(i)
        for index, members in groups.items():
            seen: set[str] = set()
            for i in members:
                clash = seen.intersection(parsed[i][2])
                if clash:
                    raise EngineInputError(f"insert request {i}: ids also inserted by another request: {sorted(clash)[:5]}")
                seen.update(parsed[i][2])
            existing = self._existing_ids(parsed[members[0]][0], sorted(seen))
            if existing:
                raise EngineInputError(f"ids already in index {index!r}: {sorted(existing)[:5]}")
        self._write(parsed, groups)
        return [len(p[2]) for p in parsed]

    def _existing_ids(self, coll: Any, ids: list[str]) -> list[str]:
        found: list[str] = []
        for s in range(0, len(ids), self._max_batch):
            found.extend(coll.get(ids=ids[s : s + self._max_batch], include=[])["ids"])
        return found

    def _write(self, parsed: list[tuple], groups: dict[str, list[int]]) -> None:
        written: list[tuple[Any, list[str]]] = []
        try:
            for members in groups.values():
                coll = parsed[members[0]][0]
                ids = [x for i in members for x in parsed[i][2]]
                vecs = np.concatenate([parsed[i][3] for i in members])
                texts = [x for i in members for x in parsed[i][4]]
                metas = [
                    m for i in members for m in (parsed[i][5] if parsed[i][5] is not None else [None] * len(parsed[i][2]))
                ]
                written.append((coll, ids))
                for s in range(0, len(ids), self._max_batch):
                    e = s + self._max_batch
                    chunk_metas = metas[s:e]
                    coll.add(
                        ids=ids[s:e],
                        embeddings=vecs[s:e],
                        documents=texts[s:e],
                        metadatas=None if all(m is None for m in chunk_metas) else chunk_metas,
                    )
        except BaseException:
            # Nothing half-written stays: every id of this call was absent before (checked),
            # so deleting them all restores the previous state.
            for coll, ids in written:
                for s in range(0, len(ids), self._max_batch):
                    try:
                        coll.delete(ids=ids[s : s + self._max_batch])
                    except Exception:  # pragma: no cover - best effort; the original error wins
                        pass
            raise

    async def batch_search(self, requests: list[dict[str, Any]]) -> list[list[list[Hit]]]:
        """Requests ``{"index", "vectors", "k"?}`` -> per request, one hit list per vector.

        Requests on the same index with the same ``k`` share one chromadb query.
        """
        self._require_started()
        parsed = []
        for i, r in enumerate(requests):
            where = f"search request {i}"
            if not isinstance(r, Mapping) or not {"index", "vectors"} <= set(r) or set(r) - {"index", "vectors", "k"}:
                got = sorted(r) if isinstance(r, Mapping) else type(r).__name__
                raise EngineInputError(f"{where} must have keys index, vectors[, k], got {got}")
            k = r.get("k", 10)
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise EngineInputError(f"{where} k must be a positive int, got {k!r}")
            # a known index is a dict hit; only an index this engine has not opened yet asks chromadb
            known = self._indexes.get(r["index"]) if isinstance(r["index"], str) else None
            coll, dim = known or await asyncio.to_thread(self._lookup, r["index"])
            parsed.append((coll, r["index"], self._check_vectors(r["vectors"], dim, r["index"], where), k))
        groups: dict[tuple[str, int], list[int]] = {}
        for i, p in enumerate(parsed):
            groups.setdefault((p[1], p[3]), []).append(i)
        results: list[Any] = [None] * len(parsed)
        for (_, k), members in groups.items():
            coll = parsed[members[0]][0]
            vecs = np.concatenate([parsed[i][2] for i in members])
            hits = await asyncio.to_thread(self._query, coll, vecs, k)
            start = 0
            for i in members:
                n = len(parsed[i][2])
                results[i] = hits[start : start + n]
                start += n
        return results

    @staticmethod
    def _query(coll: Any, vecs: np.ndarray, k: int) -> list[list[Hit]]:
        # chromadb (>= 1.5) answers k beyond the index size with all it has, and an empty index
        # with empty lists: no count() round trip per search
        res = coll.query(query_embeddings=vecs, n_results=k, include=["documents", "metadatas", "distances"])
        out = []
        for ids, docs, metas, dists in zip(res["ids"], res["documents"], res["metadatas"], res["distances"]):
            out.append(
                [
                    Hit(id=i, score=1.0 - float(d), text=t if t is not None else "", metadata=dict(m or {}))
                    for i, t, m, d in zip(ids, docs, metas, dists)
                ]
            )
        return out

    # The primitive names (ir vocabulary) dispatch to the same handlers.
    batch_vector_insert = batch_insert
    batch_vector_search = batch_search
