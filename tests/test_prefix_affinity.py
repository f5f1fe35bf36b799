"""Replica choice for LLM requests (``runtime/prefix_affinity.py``): pure logic, no engine."""

from teola_plugin.runtime.prefix_affinity import PREFIX_CHARS, SLACK, PrefixAffinity, prompt_text


def body(system: str, question: str) -> dict:
    return {"prompt": {"model": "m", "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": question}]}}


def test_a_shared_prefix_goes_back_to_its_replica_unless_that_one_is_much_busier():
    affinity = PrefixAffinity()
    first, second = "A" * PREFIX_CHARS[1], "B" * PREFIX_CHARS[0]
    a, b = prompt_text(body(first, "q1")), prompt_text(body(second, "q2"))
    assert affinity.choose(a, [0, 0]) == 0  # nobody has it: the least loaded
    affinity.record(a, 0)
    assert affinity.choose(b, [1, 0]) == 1
    affinity.record(b, 1)
    later = prompt_text(body(first, "another question"))
    assert affinity.choose(later, [1, 1]) == 0 and affinity.choose(prompt_text(body(second, "q3")), [1, 1]) == 1
    assert affinity.choose(later, [SLACK, 0]) == 0  # a cached prefix is worth SLACK requests of queue
    assert affinity.choose(later, [SLACK + 1, 0]) == 1  # beyond that, balance wins
    # the longest remembered prefix decides: a prompt sharing only the first block with `a`
    # but all of it with a newer one goes where the newer one went
    longer = first + "C" * PREFIX_CHARS[2]
    affinity.record(prompt_text(body(longer, "x")), 1)
    assert affinity.choose(prompt_text(body(longer, "y")), [0, 0]) == 1
    assert affinity.choose(prompt_text(body(first, "z")), [0, 0]) == 1  # its first block is there now too
    assert affinity.choose(prompt_text(body("short", "q")), [3, 2]) == 1  # under one block: load only


def test_prompt_text_reads_engine_prompts_and_request_bodies():
    assert prompt_text({"prompt": "plain text"}) == "plain text"
    assert prompt_text({"prompt": {"prompt": ["completion"]}}) == "completion"
    assert prompt_text({"request": {"prompt": "relayed"}}) == "relayed"
    chat = prompt_text(body("sys", "user"))
    assert chat.startswith("system") and "sys" in chat and chat.index("sys") < chat.index("user")
    assert prompt_text({"prompt": [1, 2, 3]}) is None and prompt_text({}) is None
