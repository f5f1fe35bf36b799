"""Pure logic of ``called_chains``: the wrappers it installs and the per-chain cache (the
lowering itself runs on the real server: ``test_langgraph_nodes.py``)."""

from __future__ import annotations

from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnableSequence

from teola_plugin.langchain import called_chains
from teola_plugin.langchain.called_chains import CalledChains, Lowering
from teola_plugin.served_calls import routing_served_calls


def test_install_wraps_each_composition_once_and_uninstall_restores_it():
    called_chains.install()
    wrapped = RunnableSequence.invoke
    called_chains.install()
    assert RunnableSequence.invoke is wrapped and hasattr(RunnableParallel.ainvoke, "__teola_original__")
    called_chains.uninstall()
    try:
        assert not hasattr(RunnableSequence.invoke, "__teola_original__")
        assert not hasattr(RunnableParallel.ainvoke, "__teola_original__")
    finally:
        called_chains.install()


def test_one_wrapper_per_chain_object_and_only_the_last_ones_kept():
    made = []
    chains = CalledChains(lambda chain: made.append(chain) or ("wrapper", len(made)))
    first = RunnableLambda(str) | RunnableLambda(len)
    assert chains.wrapper(first) == chains.wrapper(first) == ("wrapper", 1)
    for _ in range(CalledChains.MAX_CHAINS):
        chains.wrapper(RunnableLambda(str) | RunnableLambda(len))
    assert chains.wrapper(first) == ("wrapper", CalledChains.MAX_CHAINS + 2)  # evicted, made again


def test_recent_keeps_what_was_used_last_and_holds_the_objects_whose_ids_key_it():
    import gc
    import weakref

    from teola_plugin.recent import Recent

    kept: Recent[str] = Recent(2)
    kept.put("a", "A")
    kept.put("b", "B")
    assert kept.get("a") == "A"  # used: now the newest
    kept.put("c", "C")
    assert (kept.get("a"), kept.get("b"), kept.get("c")) == ("A", None, "C") and len(kept) == 2

    chain = RunnableLambda(str) | RunnableLambda(len)
    alive = weakref.ref(chain)
    kept.get_or_make(id(chain), lambda: "plan", keep=chain)
    del chain
    gc.collect()
    assert alive() is not None  # its id cannot be handed to another chain while its plan is kept


def test_the_scope_owners_own_chain_and_calls_outside_a_scope_run_their_own_invoke():
    chain = RunnableLambda(lambda x: x + 1) | RunnableLambda(lambda x: x * 2)
    asked = []
    chains = CalledChains(lambda c: asked.append(c))
    assert chain.invoke(1) == 4 and asked == []  # no scope
    with routing_served_calls(runtime=None, lowers=Lowering(chains, running=chain)):
        assert chain.invoke(1) == 4
    assert asked == []  # the owner's own chain: never wrapped
