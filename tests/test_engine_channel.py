"""The direct channel to Ray engine actors (runtime/engine_channel.py), on the real engines of
the session runtime: requests go over it and answer as Ray's actor calls do, an engine's
error keeps its type, and the socket answers only a connection that knows its secret.

(The actor killed and restarted under the channel: tests/test_runtime.py; cancels and
closes over it: tests/test_reliability_cancel.py, tests/test_reliability_close.py.)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from teola_plugin.errors import EngineInputError
from teola_plugin.runtime import engine_channel
from teola_plugin.runtime.bridge import engine_stream
from teola_plugin.runtime.engine_channel import EngineChannel, _frame
from teola_plugin.runtime.policies import Priority
from teola_plugin.runtime.ray_hosting import _remote

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not engine_channel.supported(), reason="abstract Unix sockets are Linux's")]

TEXTS = ["the Denver Broncos won Super Bowl 50", "Levi's Stadium is in Santa Clara"]


def test_engines_on_this_node_answer_over_their_channel_as_over_ray_calls(runtime, call):
    embedder = runtime.engines("embedder").handles[0]
    llm = runtime.engines("llm").handles[0]
    assert (embedder.transport, llm.transport) == ("channel", "channel")

    async def both_ways():
        over_channel, _ = await runtime.engines("embedder").submit("embed", {"texts": TEXTS}, Priority())
        (ok, (over_ray, _)), = await _remote(embedder.actor.submit_many.remote(
            [("channel-test-1", "embed", {"texts": TEXTS}, Priority())]))
        assert ok
        return over_channel, over_ray

    over_channel, over_ray = call(both_ways())
    assert over_channel.shape == (2, 384)
    np.testing.assert_allclose(over_channel, over_ray, rtol=1e-5, atol=1e-6)

    # a stream: opened, resumed and closed over the channel, every token as generate's
    params = {"max_tokens": 12, "temperature": 0.0}

    async def streamed() -> str:
        deltas = [d async for d in engine_stream(runtime, "llm", "stream", {"prompt": "The capital of France is",
                                                                             "params": params})]
        return "".join(d.text for d in deltas)

    whole = call(runtime.engines("llm").call("generate", "The capital of France is", params)).text
    assert whole and call(streamed()) == whole
    assert call(runtime.engines("llm").stats())[0]["open_streams"] == 0


def test_an_engines_error_over_the_channel_keeps_its_type_and_the_actors_traceback(runtime, call):
    with pytest.raises(EngineInputError, match="has no operation 'nonsense'"):  # a request's own error
        call(runtime.engines("embedder").submit("nonsense", {"texts": ["x"]}, Priority()))
    with pytest.raises(EngineInputError, match="no public stream method 'nonsense'") as caught:  # a call's
        call(runtime.engines("llm").open_stream("nonsense", {}, Priority()))
    assert any("raised inside a Ray engine actor" in note and "open_stream" in note
               for note in caught.value.__notes__)


class WritesAFileWhenUnpickled:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


class FailsToUnpickle:
    def __reduce__(self):
        return int, ("not a number",)


def test_the_channel_answers_only_connections_that_present_its_secret(runtime, call, tmp_path):
    handle = runtime.engines("embedder").handles[0]
    address = call(_remote(handle.actor.open_channel.remote()))
    assert address.socket.startswith("\0"), "abstract namespace: no file on disk, not on any network"
    batches_before = call(handle.stats())["batches_run"]
    embed = ("secret-test-1", "embed", {"texts": ["never embedded"]}, Priority())
    planted = tmp_path / "unpickled"

    async def intruder(secret: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(address.socket)
        writer.write(secret)
        writer.write(_frame(0, "submit_many", ([embed],)))
        writer.write(_frame(1, "cancel", (WritesAFileWhenUnpickled(planted),)))
        try:
            await writer.drain()
        except ConnectionError:  # the actor already closed it
            pass
        try:
            answer = await asyncio.wait_for(reader.read(), 10)  # closed by the actor: EOF ...
        except ConnectionError:  # ... or reset (a broken pipe), as it closed with our frames unread
            answer = b""
        writer.close()
        return answer

    assert call(intruder(bytes(len(address.secret)))) == b""  # the wrong secret
    assert call(intruder(address.secret[:5])) == b""  # a short one (the frames' bytes complete it, wrongly)
    assert not planted.exists(), "a frame from a connection without the secret was unpickled"
    assert call(handle.stats())["batches_run"] == batches_before

    async def with_the_secret():
        channel = await EngineChannel.connect(address, "embedder")
        try:
            answers = await channel.call("submit_many", [embed])
            with pytest.raises(ValueError, match="not a request method"):
                await channel.call("close")  # only the request methods are served
            with pytest.raises(ValueError, match="invalid literal for int"):  # fails its own call only
                await channel.call("cancel", [FailsToUnpickle()])
            assert await channel.call("cancel", []) is None
            return answers
        finally:
            await channel.close()

    (ok, (vectors, _)), = call(with_the_secret())
    assert ok and vectors.shape == (1, 384)

    async def trusted_peer_sends_the_same_frame() -> bool:  # the check above can fail
        reader, writer = await asyncio.open_unix_connection(address.socket)
        writer.write(address.secret + _frame(1, "cancel", (WritesAFileWhenUnpickled(planted),)))
        await writer.drain()
        for _ in range(100):
            if planted.exists():
                break
            await asyncio.sleep(0.05)
        writer.close()
        return planted.exists()

    assert call(trusted_peer_sends_the_same_frame())

