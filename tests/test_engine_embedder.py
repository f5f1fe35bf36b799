"""SentenceTransformerEmbedder on the bundled all-MiniLM-L6-v2 (real weights, CPU)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from teola_plugin.engines import SentenceTransformerEmbedder
from teola_plugin.errors import ConfigError, EngineInputError, EngineNotStartedError, ModelNotFoundError

TEXTS = [
    "The cat sat on the mat.",
    "A kitten was sitting on the rug.",
    "Quarterly revenue grew by twelve percent, driven by cloud services and strong demand in Asia.",
    "",
]


def test_shape_dtype_and_unit_norm(aio, embedder):
    emb = aio.run(embedder.embed(TEXTS))
    assert embedder.dim == 384
    assert isinstance(emb, np.ndarray) and emb.dtype == np.float32 and emb.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert embedder.describe()["dim"] == 384 and embedder.describe()["ops"] == ["embed"]


def test_paraphrases_are_closer_than_unrelated_texts(aio, embedder):
    a, b, c, _ = aio.run(embedder.embed(TEXTS))
    paraphrase, unrelated = float(a @ b), float(a @ c)
    # measured: 0.65 vs -0.004
    assert paraphrase > 0.5 > 0.2 > unrelated
    assert paraphrase - unrelated > 0.4


def test_batch_equals_single_within_1e_5(aio, embedder):
    batch = aio.run(embedder.embed(TEXTS))  # padded together, different lengths
    singles = np.stack([aio.run(embedder.embed([t]))[0] for t in TEXTS])
    assert np.abs(batch - singles).max() < 1e-5


def test_execute_merges_requests_and_splits_back_in_order(aio, embedder):
    out = aio.run(embedder.execute("embed", [{"texts": TEXTS[2:3]}, {"texts": TEXTS[:2]}]))
    assert [o.shape for o in out] == [(1, 384), (2, 384)]
    ref = aio.run(embedder.embed(TEXTS[:3]))
    assert np.abs(out[0][0] - ref[2]).max() < 1e-5
    assert np.abs(out[1] - ref[:2]).max() < 1e-5


@pytest.mark.parametrize(
    "texts, match",
    [
        ("just a string", "single str"),
        ([], "empty"),
        (["ok", 3], r"texts\[1\] must be str"),
        (None, "list of strings"),
    ],
)
def test_bad_input_raises_engine_input_error(aio, embedder, texts, match):
    with pytest.raises(EngineInputError, match=match):
        aio.run(embedder.embed(texts))


def test_bad_requests_through_execute(aio, embedder):
    with pytest.raises(EngineInputError, match="request 1"):
        aio.run(embedder.execute("embed", [{"texts": ["a"]}, {"text": ["b"]}]))
    with pytest.raises(EngineInputError, match="no operation 'rerank'"):
        aio.run(embedder.execute("rerank", [{"texts": ["a"]}]))


def test_missing_model_directory_is_named(aio, tmp_path):
    missing = tmp_path / "no-such-model"
    engine = SentenceTransformerEmbedder(model_path=missing)
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        aio.run(engine.start())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="holds no model"):
        aio.run(SentenceTransformerEmbedder(model_path=empty).start())


def test_not_started_and_bad_config(aio):
    engine = SentenceTransformerEmbedder()
    with pytest.raises(EngineNotStartedError):
        _ = engine.dim
    with pytest.raises(EngineNotStartedError):
        aio.run(engine.embed(["x"]))
    with pytest.raises(ConfigError):
        SentenceTransformerEmbedder(batch_size=0)
    with pytest.raises(ConfigError):
        SentenceTransformerEmbedder(device="tpu")


def test_unstarted_engine_pickles_for_ray_actors():
    engine = pickle.loads(pickle.dumps(SentenceTransformerEmbedder(batch_size=8, device="cpu")))
    assert engine.batch_size == 8 and not engine.started


def test_a_cancelled_model_load_gives_its_shared_reference_back(monkeypatch):
    """A start nobody waits for is cancelled while the model loads in a thread; when the
    thread finishes, its reference to the shared model goes back (else it never unloads)."""
    import asyncio
    import threading
    import time

    from teola_plugin.engines import embedder as emb

    path = emb.default_model_path()
    key = (str(path.resolve()), "cpu")
    count = lambda: emb._SHARED[key][2] if key in emb._SHARED else 0  # noqa: E731
    before, loaded, original = count(), threading.Event(), emb.acquire_sentence_transformer

    def slow_acquire(*args):  # a load that is still running when the cancel lands
        try:
            time.sleep(0.5)  # (the model may already be loaded in this process: then it is instant)
            return original(*args)
        finally:
            loaded.set()

    monkeypatch.setattr(emb, "acquire_sentence_transformer", slow_acquire)

    async def cancel_mid_load() -> None:
        task = asyncio.ensure_future(emb.acquire_sentence_transformer_async(path, "cpu"))
        await asyncio.sleep(0.01)  # the thread has started loading
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(loaded.wait, 120)
        for _ in range(20):  # the loading future's callbacks run on this loop
            await asyncio.sleep(0.01)

    asyncio.run(cancel_mid_load())
    assert count() == before
