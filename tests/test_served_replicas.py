"""A second real vLLM server, started with ``--scheduling-policy priority``: what Teola detects
about a server and builds on (``engines/server_features.py``), and two servers of one model as
replicas with prefix affinity (``runtime/prefix_affinity.py``, ``Runtime(server_replicas=...)``).

Both servers run the bundled model with the same flags (the second adds the policy), so a
request gets the same greedy answer from either. Recording proxies in front of each show
which server received what. The second server starts once for this module (~60 s) and stops
at its end; ``TEOLA_TEST_PRIORITY_SERVER_PORT`` uses one already running instead.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI

from teola_plugin.langchain import TeolaRunnable
from teola_plugin.runtime.runtime import Runtime
from tests.fixtures_served import SERVED_NAME, ModelServer, RecordingProxy, start_model_server

# A second model server (priority scheduling), besides the session's: `make test-all`.
pytestmark = [pytest.mark.slow, pytest.mark.extended]

QUESTIONS = ["Where is the Eiffel Tower?", "Who wrote Hamlet?", "What is the capital of Japan?",
             "What do bees make?"]


@pytest.fixture(scope="module")
def priority_server(tmp_path_factory):
    running = os.environ.get("TEOLA_TEST_PRIORITY_SERVER_PORT")
    log = tmp_path_factory.mktemp("vllm-priority") / "server.log"
    if running:
        yield ModelServer(None, int(running), log)
        return
    server = start_model_server(log, extra_args=["--scheduling-policy", "priority"])
    yield server
    server.stop()


@pytest.fixture
def proxies(model_server, priority_server):
    first = RecordingProxy(f"http://127.0.0.1:{model_server.port}").start()
    second = RecordingProxy(f"http://127.0.0.1:{priority_server.port}").start()
    yield first, second
    first.stop()
    second.stop()


def chat_chain(base_url: str, system: str = "Answer in a few words."):
    llm = ChatOpenAI(model=SERVED_NAME, base_url=base_url, api_key="none", temperature=0, max_tokens=10)
    return ChatPromptTemplate.from_messages([("system", system), ("human", "{q}")]) | llm | StrOutputParser()


def posts(proxy: RecordingProxy) -> list[dict]:
    return [body for path, body in proxy.take() if path.endswith("/chat/completions")]


def served_engines(runtime: Runtime, base_url: str) -> list:
    (name,) = [n for n, spec in runtime.specs.items() if n.startswith("served:") and spec.kwargs["base_url"] == base_url]
    return [handle.server.engine for handle in runtime.engines(name).handles]


def test_priority_goes_only_to_a_server_that_schedules_by_it(proxies, runtime):
    """The session's server (first come, first served) gets plain's body; the priority server
    gets it with vLLM's ``priority`` field beside it, from Teola's rule: the request's latest
    start (earlier first), and the same answer."""
    fcfs, by_priority = proxies
    for proxy, schedules in ((fcfs, False), (by_priority, True)):
        chain = chat_chain(proxy.base_url)
        plain = chain.invoke({"q": QUESTIONS[0]})
        (sent_plain,) = posts(proxy)
        fast = TeolaRunnable(chain, runtime=runtime)
        asked = time.time()
        assert fast.invoke({"q": QUESTIONS[0]}) == plain
        answered = time.time()
        (sent,) = posts(proxy)
        (engine,) = served_engines(runtime, proxy.base_url)
        assert engine.scheduling.enabled is schedules, engine.scheduling.how
        assert engine.describe()["priority_scheduling"]["enabled"] is schedules
        if not schedules:
            assert sent == sent_plain
            continue
        assert {k: v for k, v in sent.items() if k != "priority"} == sent_plain and "priority" not in sent_plain
        # the stream opens at the prefill, on the query's critical path: its latest start (ms) is
        # the query's arrival plus the cost-model time of the prompt's formatting before it
        before = _before_prefill(fast)
        assert 0 < before < 0.1
        assert (asked + before) * 1000 - 1 <= sent["priority"] <= (answered + before) * 1000 + 1


def _before_prefill(fast: TeolaRunnable) -> float:
    """The cost-model time from the query's start to its prefill's (the prompt's formatting)."""
    from teola_plugin.runtime.graph_scheduler import remaining_path

    plan = fast._plan({"q": QUESTIONS[0]})
    remaining = remaining_path(plan.graph, fast.teola_runtime().cost)
    prefill = next(p.name for p in plan.graph.nodes if p.op.value == "llm_prefill")
    return max(remaining.values()) - remaining[prefill]


def test_requests_sharing_a_prefix_go_to_the_replica_that_has_it(proxies):
    """Two servers as replicas of one model: new system prompts take turns between them; a
    later request with an earlier one's system prompt goes to the server that has that prefix
    cached (its reply reports the cached tokens), and every answer is plain's."""
    first, second = proxies
    runtime = Runtime(hosting="local", server_replicas={first.base_url: [second.base_url]})
    try:
        systems = [f"Session {uuid.uuid4()}. " + "You answer questions briefly and precisely. " * 40
                   for _ in range(2)]
        chains = [chat_chain(first.base_url, system) for system in systems]
        calls = [(0, QUESTIONS[0]), (1, QUESTIONS[1]), (0, QUESTIONS[2]), (1, QUESTIONS[3])]
        plain = [chains[i].invoke({"q": q}) for i, q in calls]
        first.take()
        fast = [TeolaRunnable(chain, runtime=runtime) for chain in chains]
        received = []
        for (i, q), expected in zip(calls, plain):
            assert fast[i].invoke({"q": q}) == expected
            (where,) = [(proxy, sent) for proxy in (first, second) for sent in proxy.take()]
            received.append(where)
        servers = [proxy for proxy, _ in received]
        assert servers[0] is not servers[1] and servers[2] is servers[0] and servers[3] is servers[1]
        proxy, (path, body) = received[3]  # the second server: cached by Teola's own earlier request
        assert proxy is second and body["messages"][0]["content"] == systems[1]
        usage = json.loads(proxy.replies[path + json.dumps(body, sort_keys=True)][2])["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 256
        assert [e.base_url for e in served_engines(runtime, first.base_url)] == [first.base_url, second.base_url]
    finally:
        runtime.shutdown()
