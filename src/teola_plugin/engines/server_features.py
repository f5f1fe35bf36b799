"""What a model server does that Teola may build on: detected, never assumed.

Prefill splitting sends a prefix warm-up (a ``max_tokens=1`` request of the prompt's early
part) so that the full request finds the prefix in the server's cache. That only pays where
the server caches prefixes, and only for whole cache blocks. vLLM says both in its metrics:
the ``vllm:cache_config_info`` gauge carries ``enable_prefix_caching`` and ``block_size``
as labels. A server that does not answer ``/metrics`` with them (another kind of server, a
proxy that hides it, one not up yet) is *unknown*, and the pass declines for it.

Request priority goes to vLLM's ``priority`` field only where the server schedules by it
(``--scheduling-policy priority``; under its default first-come-first-served policy the field
is ignored). vLLM names its policy only in ``/server_info`` (served with
``VLLM_SERVER_DEV_MODE=1``); a server that does not say is *unknown*, and its requests are
ordered by Teola's admission alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

PROBE_TIMEOUT_S = 5.0  # once, when the engine starts; a busy server on shared cores may take a while
# (at most the client's own timeout: the first request waits for the probes, and a server that
# does not answer must fail it about when the user's client would)
_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class PrefixCache:
    """A server's prefix cache as detected: ``enabled`` (None: unknown), the block size in
    tokens (a prefix caches only in whole blocks), and how it was found out (or why not)."""

    enabled: bool | None
    block_tokens: int = 0
    how: str = ""


def metrics_url(base_url: str) -> str:
    """The server's ``/metrics`` (vLLM serves it at the root, beside ``/v1``)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/metrics", "", ""))


def parse_prefix_cache(metrics: str, url: str) -> PrefixCache:
    """The prefix cache a vLLM ``/metrics`` page describes."""
    found = _CACHE_CONFIG.search(metrics)
    if found is None:
        return PrefixCache(None, 0, f"{url} has no vllm:cache_config_info (not a vLLM server?)")
    labels = dict(_LABEL.findall(found.group("labels")))
    enabled = labels.get("enable_prefix_caching", "").lower() == "true"
    try:
        block = int(labels.get("block_size", "0"))
    except ValueError:
        block = 0
    return PrefixCache(enabled, block, f"{url}: enable_prefix_caching={labels.get('enable_prefix_caching')}, "
                                       f"block_size={labels.get('block_size')}")


async def detect_prefix_cache(base_url: str, headers: dict[str, Any] | None = None,
                              timeout_s: float = PROBE_TIMEOUT_S) -> PrefixCache:
    """Ask the server's metrics (one GET within ``timeout_s``); unknown when it cannot say."""
    url = metrics_url(base_url)
    reply, why = await _probe(url, headers, timeout_s)
    if reply is None:
        return PrefixCache(None, 0, why)
    return parse_prefix_cache(reply.text, url)


def probe_timeout_s(client_timeout: Any) -> float:
    """How long a probe may take: ``PROBE_TIMEOUT_S``, or less where the client's timeout is."""
    if isinstance(client_timeout, (int, float)) and not isinstance(client_timeout, bool) and client_timeout > 0:
        return min(PROBE_TIMEOUT_S, float(client_timeout))
    return PROBE_TIMEOUT_S


async def _probe(url: str, headers: dict[str, Any] | None, timeout_s: float) -> tuple[Any, str]:
    """One GET of ``url`` within ``timeout_s``: ``(reply, "")`` on HTTP 200, else
    ``(None, why not)``."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers or None) as client:
            reply = await client.get(url)
    except httpx.HTTPError as exc:
        return None, f"{url} did not answer ({type(exc).__name__})"
    if reply.status_code != 200:
        return None, f"{url} answered HTTP {reply.status_code}"
    return reply, ""


@dataclass(frozen=True)
class PriorityScheduling:
    """Whether a server orders its waiting requests by their ``priority`` field (None: unknown)."""

    enabled: bool | None
    how: str = ""


def server_info_url(base_url: str) -> str:
    return metrics_url(base_url)[: -len("/metrics")] + "/server_info?config_format=json"


def parse_scheduling(info: Any, url: str) -> PriorityScheduling:
    """The scheduling policy a vLLM ``/server_info`` (JSON config format) reports."""
    config = info.get("vllm_config") if isinstance(info, dict) else None
    scheduler = config.get("scheduler_config") if isinstance(config, dict) else None
    policy = scheduler.get("policy") if isinstance(scheduler, dict) else None
    if not isinstance(policy, str):
        return PriorityScheduling(None, f"{url} names no scheduler policy")
    return PriorityScheduling(policy == "priority", f"{url}: scheduler policy {policy!r}")


async def detect_scheduling(base_url: str, headers: dict[str, Any] | None = None,
                            timeout_s: float = PROBE_TIMEOUT_S) -> PriorityScheduling:
    """Ask the server's ``/server_info`` (one GET within ``timeout_s``); unknown when it cannot say."""
    url = server_info_url(base_url)
    reply, why = await _probe(url, headers, timeout_s)
    if reply is None:
        return PriorityScheduling(None, f"{why} (vLLM serves it with VLLM_SERVER_DEV_MODE=1): requests are "
                                        "ordered by Teola's admission")
    try:
        info = reply.json()
    except ValueError:
        return PriorityScheduling(None, f"{url} answered no JSON")
    return parse_scheduling(info, url)
