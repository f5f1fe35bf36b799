"""Which replica of an LLM engine a request goes to: where its prompt's prefix is cached.

Replicas of one model (several URLs serving it, or several in-process engines) each keep
their own prefix cache. A request whose prompt starts like an earlier one's (the same
system prompt, the same template before the context) is prefilled faster on the replica
that served the earlier one. :class:`PrefixAffinity` remembers, for a few prefix lengths,
which replica last received a prompt with that prefix, and sends a request to the replica
holding its longest remembered prefix, unless that replica has more than ``SLACK``
outstanding requests beyond the least loaded one: then balance wins, as in the cache-aware
routers of serving systems. A prompt with no remembered prefix (or shorter than the shortest
length: less than about one cache block) goes to the least loaded replica, equally loaded
ones taking turns, so that new prefixes spread over the replicas' caches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..recent import Recent

PREFIX_CHARS = (512, 2048, 8192, 32768)  # prefix lengths remembered (~128 to ~8k tokens)
SLACK = 2  # outstanding requests above the least loaded replica a cached prefix is worth
MAX_PREFIXES = 8192  # remembered prefixes (least recently used dropped)


def prompt_text(kwargs: Mapping[str, Any]) -> str | None:
    """The text a stream's or prefill's prompt starts with: an engine prompt (str), or an
    OpenAI-compatible request body (its messages' roles and contents, or its prompt)."""
    body = kwargs.get("prompt", kwargs.get("request"))
    if isinstance(body, str):
        return body
    if not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    if isinstance(messages, Sequence):
        return "".join(f"{m.get('role')}\x1f{m.get('content')}\x1e" for m in messages if isinstance(m, Mapping))
    prompt = body.get("prompt")
    if isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def _key(text: str, length: int) -> bytes:
    return hashlib.blake2b(text[:length].encode(), digest_size=16).digest()


class PrefixAffinity:
    def __init__(self) -> None:
        self._owner: Recent[int] = Recent(MAX_PREFIXES)  # prefix -> the replica that has it
        self._turn = 0  # new prefixes take turns among equally loaded replicas

    def choose(self, text: str | None, outstanding: Sequence[int]) -> int:
        """The replica for a prompt starting with ``text``, given each replica's outstanding requests."""
        lowest = min(outstanding)
        idle = [i for i, n in enumerate(outstanding) if n == lowest]
        least = idle[self._turn % len(idle)]
        for length in reversed(PREFIX_CHARS):
            if text is None or len(text) < length:
                continue
            owner = self._owner.get(_key(text, length))
            if owner is not None and owner < len(outstanding) and outstanding[owner] <= outstanding[least] + SLACK:
                return owner
        self._turn += 1
        return least

    def record(self, text: str | None, replica: int) -> None:
        """``replica`` received a prompt starting with ``text``: it caches its prefixes now."""
        for length in PREFIX_CHARS:
            if text is None or len(text) < length:
                break
            self._owner.put(_key(text, length), replica)
