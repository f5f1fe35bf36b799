"""A LangChain callback handler that records the run tree a call reports, for comparing
Teola's with plain's: each run's path of names from the root, its tags, what it was given and
returned, and whether its children ran inside it (started after it, ended before it)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import BaseCallbackHandler


def _comparable(value: Any) -> Any:
    """A value as the test compares it: messages by type and content (their ids name the run;
    a Teola model's own reply carries no provider metadata), documents by text."""
    from langchain_core.documents import Document
    from langchain_core.messages import BaseMessage
    from langchain_core.prompt_values import PromptValue

    if isinstance(value, BaseMessage):
        return (type(value).__name__.replace("Chunk", ""), value.content)
    if isinstance(value, Document):
        return value.page_content
    if isinstance(value, PromptValue):
        return [_comparable(m) for m in value.to_messages()]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    return value


def _class_name(serialized: Any) -> str:
    """A model run's name when its call names none: its class, as tracers name it."""
    return ((serialized or {}).get("id") or ["model"])[-1]


class RunTreeRecorder(BaseCallbackHandler):
    comparable = staticmethod(_comparable)

    def __init__(self) -> None:
        self.runs: dict[Any, dict[str, Any]] = {}
        self.events: list[tuple[str, Any]] = []  # (start / end, run id), in order

    def _start(self, kind: str, name: str, run_id: Any, parent_run_id: Any, tags: Any, given: Any) -> None:
        self.runs[run_id] = {"kind": kind, "name": name, "parent": parent_run_id, "tags": list(tags or []),  # in order: handlers see the order
                             "given": repr(_comparable(given)), "returned": None}
        self.events.append(("start", run_id))

    def _end(self, run_id: Any, returned: Any) -> None:
        self.runs[run_id]["returned"] = repr(_comparable(returned))
        self.events.append(("end", run_id))

    def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, tags=None, **kwargs):
        self._start(kwargs.get("run_type") or "chain", kwargs.get("name"), run_id, parent_run_id, tags, inputs)

    def on_chain_end(self, outputs, *, run_id, **kwargs):
        self._end(run_id, outputs)

    def on_chat_model_start(self, serialized, messages, *, run_id, parent_run_id=None, tags=None, **kwargs):
        self._start("chat_model", kwargs.get("name") or _class_name(serialized), run_id, parent_run_id, tags, messages)

    def on_llm_start(self, serialized, prompts, *, run_id, parent_run_id=None, tags=None, **kwargs):
        self._start("llm", kwargs.get("name") or _class_name(serialized), run_id, parent_run_id, tags, prompts)

    def on_llm_end(self, response, *, run_id, **kwargs):
        self._end(run_id, response.generations[0][0].text)

    def on_retriever_start(self, serialized, query, *, run_id, parent_run_id=None, tags=None, **kwargs):
        self._start("retriever", kwargs.get("name"), run_id, parent_run_id, tags, query)

    def on_retriever_end(self, documents, *, run_id, **kwargs):
        self._end(run_id, documents)

    def path(self, run_id: Any) -> tuple[str, ...]:
        names = []
        while run_id is not None:
            names.append(self.runs[run_id]["name"])
            run_id = self.runs[run_id]["parent"]
        return tuple(reversed(names))

    def tree(self, values: bool = True) -> list[tuple]:
        """Every run as (path, kind, tags[, given, returned]), sorted: the tree without the
        order of concurrent siblings (a parallel's branches)."""
        rows = []
        for run_id, run in self.runs.items():
            row = (self.path(run_id), run["kind"], tuple(run["tags"]))
            rows.append(row + ((run["given"], run["returned"]) if values else ()))
        return sorted(rows, key=repr)

    def nested(self) -> bool:
        """Each run started after its parent and ended before it; a sequence's steps one after another."""
        at = {(kind, run): i for i, (kind, run) in enumerate(self.events)}
        for run_id, run in self.runs.items():
            parent = run["parent"]
            if parent is None:
                continue
            if not (at[("start", parent)] < at[("start", run_id)] < at[("end", run_id)] < at[("end", parent)]):
                return False
        steps: dict[Any, list[tuple[int, Any]]] = {}
        for run_id, run in self.runs.items():
            step = [int(t.rsplit(":", 1)[1]) for t in run["tags"] if t.startswith("seq:step:")]
            if step and run["parent"] is not None:
                steps.setdefault(run["parent"], []).append((step[0], run_id))
        for children in steps.values():
            ordered = [run_id for _, run_id in sorted(children, key=lambda c: c[0])]
            for before, after in zip(ordered, ordered[1:]):
                if at[("end", before)] > at[("start", after)]:
                    return False
        return True
