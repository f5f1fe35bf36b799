"""Where one query's wall time went: each instant charged to what was running then.

A timeline's spans nest (an opaque ``synthesize`` step contains the prefill and decode it
runs) and overlap (two engines at once), so summing span lengths counts time twice. Here
the query's wall time is cut at every span boundary, and each piece is charged to the
spans running through it, split evenly, except that a *container* (a step that runs others:
an opaque step, a framework's retrieve / synthesize call) is charged only while no span
inside it runs. Containers are named by the caller: time alone cannot tell a step that
contains another from one that merely runs beside it (a pipelined embed during a decode).
A piece with nothing running is ``idle``. The charges add up to the query's latency, so
they read as a profile: "embed 3.2 s of 4.4 s".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

IDLE = "idle"


def breakdown(spans: Iterable[tuple[str, float, float]], latency_s: float,
              is_container: Callable[[str], bool] = lambda label: False) -> dict[str, float]:
    """``spans``: (label, start, end) in seconds from the query's start. Returns seconds per
    label (and ``idle``), largest first, summing to ``latency_s``."""
    if latency_s <= 0:
        return {}
    spans = [(label, max(0.0, start), min(end, latency_s)) for label, start, end in spans]
    spans = [s for s in spans if s[2] > s[1]]
    cuts = sorted({0.0, latency_s, *(t for _, start, end in spans for t in (start, end))})
    charged: Counter[str] = Counter()
    for a, b in zip(cuts, cuts[1:]):
        running = [s for s in spans if s[1] <= a and s[2] >= b]
        working = [s for s in running
                   if not (is_container(s[0]) and any(o is not s and s[1] <= o[1] and o[2] <= s[2]
                                                      and (o[1], o[2]) != (s[1], s[2]) for o in running))]
        if not working:
            charged[IDLE] += b - a
        for label, _, _ in working:
            charged[label] += (b - a) / len(working)
    return dict(charged.most_common())


def describe(profile: dict[str, float], latency_s: float, top: int = 4) -> str:
    """``embed@embedder 3.21 s (73%), llm_prefill@llm 0.73 s (17%), ...``: the largest
    ``top`` entries of at least 1% of the latency, the rest summed as ``other``."""
    if latency_s <= 0:
        return "nothing recorded"
    items = list(profile.items())
    shown = [(k, v) for k, v in items[:top] if v >= 0.01 * latency_s]
    rest = sum(profile.values()) - sum(v for _, v in shown)
    parts = [f"{k} {v:.2f} s ({v / latency_s:.0%})" for k, v in shown]
    if rest >= 0.005:
        parts.append(f"other {rest:.2f} s")
    return ", ".join(parts)
