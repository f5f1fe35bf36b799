"""ReadPace's bookkeeping (capture/llama_index_llm_events.py), pure logic: which events a
streamed call reports, and when, as its reader reads, finishes or leaves. The end to end
behaviour against plain LlamaIndex is tested on the real server in test_served_models.py."""

from __future__ import annotations

from teola_plugin.capture.llama_index_llm_events import ReadPace, StartedCall


class Events:
    """What a StartedCall reports through its LLMEvents, recorded."""

    streamed = True

    def __init__(self) -> None:
        self.log: list[str] = []

    def in_progress(self, started, text, chunk) -> None:
        self.log.append(f"P:{text}")

    def failed(self, started, exc) -> None:
        self.log.append(f"X:{type(exc).__name__}")


def paced_call() -> tuple[ReadPace, StartedCall, Events]:
    pace, events = ReadPace(), Events()
    with pace.running():
        call = StartedCall(events, "event", [], None, None)  # type: ignore[arg-type]
    assert call.pace is pace
    return pace, call, events


def test_chunks_are_reported_as_their_tokens_are_read_and_the_end_once_the_reader_is_past_the_last():
    pace, call, events = paced_call()
    for text in ("a", "b", "c"):
        call(text)  # arrive from the engine ahead of the reader
    pace.read()
    assert events.log == ["P:a"]
    call.ended = True
    pace.end_when_read(lambda: events.log.append("E"))
    pace.read()
    assert events.log == ["P:a", "P:b"]  # no end before the reader is past the last token
    pace.read()
    pace.exhausted()
    pace.leave()
    assert events.log == ["P:a", "P:b", "P:c", "E"]


def test_a_reader_that_leaves_ends_the_call_with_generator_exit_and_nothing_after_it():
    pace, call, events = paced_call()
    call("a")
    call("b")
    pace.read()
    pace.leave()
    call.failed(RuntimeError("the run, cancelled"))  # its span drops next: already ended
    pace.end_when_read(lambda: events.log.append("E"))  # a decode that finished meanwhile
    assert events.log == ["P:a", "X:GeneratorExit"]


def test_a_reader_that_leaves_after_the_call_ended_gets_generator_exit_not_the_end():
    pace, call, events = paced_call()
    call("a")
    call.ended = True
    pace.end_when_read(lambda: events.log.append("E"))
    pace.leave()
    assert events.log == ["X:GeneratorExit"]


def test_only_the_runs_first_streamed_call_is_paced():
    pace, _, events = paced_call()
    with pace.running():
        second = StartedCall(events, "event", [], None, None)  # type: ignore[arg-type]
    assert second.pace is None
