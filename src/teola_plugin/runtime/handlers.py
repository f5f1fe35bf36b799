"""How each primitive op runs: one coroutine per op, in the style of torch.fx's Interpreter.

``PrimitiveHandlers.<op>(prim, inputs, ctx) -> {port: value}``. Engine-backed ops turn
their inputs into one engine request and submit it through the engine's scheduler (which
may batch it with other queries' requests); CPU ops (format, aggregate, chunk, opaque) run
here. Sharding, aggregate modes, templates and item parsing use ``ir.semantics``, so the
runtime computes exactly what the reference interpreter computes.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import semantics
from ..ir.expansion import Expansion
from ..ir.node import Primitive
from .caller import caller_loop
from .framework_threads import in_framework_thread
from .values import Document, IndexHandle, LLMState, as_document

if TYPE_CHECKING:
    from .graph_scheduler import NodeContext


def default_chunker(docs: list[Document], chunk_size: int = 1024, overlap: int = 128) -> list[Document]:
    """Character windows on whitespace; used only when a lowering gives no splitter."""
    out: list[Document] = []
    for d in docs:
        text, start, n = d.text, 0, 0
        while True:
            end = min(len(text), start + chunk_size)
            if end < len(text):
                cut = text.rfind(" ", start + chunk_size // 2, end)
                end = cut if cut > start else end
            out.append(Document(f"{d.id}#{n}", text[start:end], {**d.metadata, "source_id": d.id}, d.source))
            if end >= len(text):
                break
            start, n = max(end - overlap, start + 1), n + 1
    return out


@contextlib.contextmanager
def framework_errors(prim: Primitive) -> Iterator[None]:
    """An engine error as the framework's model raises it: ``attrs["raise_error"]`` is the
    model's own translation (e.g. LangChain ChatOpenAI's ``openai.APIConnectionError`` ->
    ``OpenAIConnectionError``), called while the error is handled; the engine's notes stay."""
    try:
        yield
    except Exception as exc:
        translate = prim.attrs.get("raise_error")
        if translate is None:
            raise
        try:
            translate(exc)
        except Exception as translated:
            if translated is not exc:
                for note in getattr(exc, "__notes__", []):
                    translated.add_note(note)
            raise
        raise


@contextlib.asynccontextmanager
async def llm_call_errors(prim: Primitive, listener: Any = None) -> AsyncIterator[None]:
    """An LLM call's engine error raised as the model raises it (:func:`framework_errors`),
    and that exception reported to the call's listener's ``failed`` (a framework's callback
    run: ``on_llm_error``) before it propagates."""
    try:
        with framework_errors(prim):
            yield
    except Exception as exc:
        failed = getattr(listener, "failed", None)
        if failed is not None:
            await failed(exc)
        raise


class PrimitiveHandlers:
    """One method per op. Subclass and override a method to change how an op runs."""

    async def chunk(self, prim: Primitive, inputs: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        docs = [as_document(d, i) for i, d in enumerate(inputs["docs"])]
        splitter: Callable[[list[Document]], list[Any]] | None = prim.attrs.get("splitter")
        if splitter is not None:
            chunks = [as_document(c, i) for i, c in enumerate(await in_framework_thread(splitter, docs))]
        else:
            chunks = default_chunker(docs, prim.attrs.get("chunk_size", 1024), prim.attrs.get("chunk_overlap", 128))
        return {"chunks": chunks, "texts": [c.text for c in chunks]}

    async def embed(self, prim, inputs, ctx):
        texts = list(inputs["texts"])
        if not texts:
            return {"vectors": []}
        embed_text = prim.attrs.get("embed_text")
        if embed_text is not None:
            # A served embedding model's own code, one call per text as its embed_query makes
            # them (concurrently); its requests reach the server through the served engine.
            # Its vectors are returned as it returns them.
            return {"vectors": list(await asyncio.gather(*(in_framework_thread(embed_text, t) for t in texts)))}
        vectors = await ctx.submit("embed", {"texts": texts})
        return {"vectors": list(np.asarray(vectors, dtype=np.float32))}

    async def vector_insert(self, prim, inputs, ctx):
        index: IndexHandle = inputs["index"]
        docs = [as_document(d, i) for i, d in enumerate(inputs["docs"])]
        vectors = list(inputs["vectors"])
        if docs:
            await ctx.submit("insert", {
                "index": index.name, "ids": [d.id for d in docs], "vectors": np.stack(vectors),
                "texts": [d.text for d in docs], "metadatas": [dict(d.metadata) for d in docs],
            }, route_key=index.name)
        return {"index": index}

    async def vector_search(self, prim, inputs, ctx):
        index: IndexHandle = inputs["index"]
        vectors = list(inputs["vectors"])
        if not vectors:
            return {"hits": []}
        request = {"index": index.name, "vectors": np.stack(vectors), "k": int(prim.attrs.get("top_k", 5))}
        if "store_search" in prim.attrs:  # only engines serving a user's store take it
            request["store_search"] = prim.attrs["store_search"]
        if prim.attrs.get("async_search"):  # a user's store with an async search of its own
            request["caller_loop"] = caller_loop()
        return {"hits": await ctx.submit("search", request, route_key=index.name)}

    async def rerank(self, prim, inputs, ctx):
        hits = list(inputs["hits"])
        top_n = int(prim.attrs.get("top_n", len(hits)))
        if not hits:
            return {"hits": []}
        return {"hits": await ctx.submit("rerank", {"query": inputs["query"], "hits": hits, "top_n": top_n})}

    async def search(self, prim, inputs, ctx):
        queries = list(inputs["queries"])
        if not queries:
            return {"hits": []}
        return {"hits": await ctx.submit("search", {"queries": queries, "k": int(prim.attrs.get("top_k", 5))})}

    async def format(self, prim, inputs, ctx):
        # A framework template's own code renders when the lowering kept it (prompts stay
        # byte-identical); `parts` then only describe the template to the optimizer.
        if prim.attrs.get("render") is not None:  # framework code (its callbacks may block): off the loop
            return {"prompt": await in_framework_thread(semantics.render_format, prim.attrs, inputs)}
        return {"prompt": semantics.render_format(prim.attrs, inputs)}

    async def llm_partial_prefill(self, prim, inputs, ctx):
        if inputs["prompt"]:  # None: the render had no text before its first late variable
            await ctx.submit("prefill", {"prompt": inputs["prompt"]})
        return {"done": True}

    async def llm_prefill(self, prim, inputs, ctx):
        # The framework's own sampling params when the lowering captured them (a served model's
        # are in its request body: no overrides, {}); else greedy.
        params = prim.attrs.get("sampling_params")
        if params is None:
            params = {"temperature": 0.0, "max_tokens": int(prim.attrs.get("max_tokens", 256))}
        streamed = prim.attrs.get("streamed_request")  # what a served model's own streaming call adds
        if streamed and (ctx.streams_to_caller() or prim.attrs.get("always_streamed")):
            params = {**params, **streamed}
        async with llm_call_errors(prim, inputs.get("listener")):
            opened = await ctx.open_stream("stream", {"prompt": inputs["prompt"], "params": params})
        ctx.record_batch(opened.info)
        return {"state": LLMState(prim.engine, opened.sid, list(opened.first), opened.finished)}

    async def llm_decode(self, prim, inputs, ctx):
        state: LLMState = inputs["state"]
        state.consumed = True
        parse = prim.attrs.get("parse")
        # A pipelined decode feeds its region every item, each as soon as it is complete
        # (a line: at its line break; a JSON list's: at the end), and in order.
        stream_items = bool(prim.attrs.get("stream_items")) and parse is not None
        listener = inputs.get("listener")
        text, emitted, response = "", 0, None

        def on_delta(delta: Any) -> None:
            nonlocal text, emitted, response
            response = getattr(delta, "response", None) or response  # a served model's reply, at the end
            text += delta.text
            if not getattr(delta, "stream_end", False):  # a token per chunk, as the framework streams them
                ctx.emit_token(delta.text)
                if listener is not None:  # every chunk, empty ones too: the listener picks what it reports
                    listener(delta.text, delta.chunk)
            if stream_items:
                complete = semantics.complete_items(text, parse)
                for item in complete[emitted:]:
                    ctx.emit_item(item)
                emitted = len(complete)

        for delta in state.first:
            on_delta(delta)
        if not state.finished:
            async with llm_call_errors(prim, listener):
                async for delta in ctx.resume_stream(state.stream_id):
                    on_delta(delta)
        items = semantics.parse_items(text, parse) if parse else []
        if stream_items:
            for item in items[emitted:]:  # the last line (no line break after it), a JSON list's all
                ctx.emit_item(item)
        return {"text": text, "items": items, "response": response}

    async def aggregate(self, prim, inputs, ctx):
        return {"out": semantics.aggregate(prim.attrs, inputs)}

    async def opaque(self, prim, inputs, ctx):
        """Call the framework component unchanged. Blocking calls run on the framework threads."""
        fn = prim.attrs["fn"]
        if inspect.iscoroutinefunction(fn):
            result = await fn(**inputs)
        else:
            result = await in_framework_thread(fn, **inputs)
        if isinstance(result, Expansion):
            return result  # type: ignore[return-value]
        return semantics.opaque_outputs(prim.outputs, result)
