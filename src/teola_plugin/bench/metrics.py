"""Latency statistics and answer quality (SQuAD-style exact match and token F1)."""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import numpy as np


def latency_stats(latencies: Sequence[float]) -> dict[str, float | int | None]:
    if not latencies:
        return {"mean_s": None, "p50_s": None, "p99_s": None, "n": 0}
    xs = np.asarray(latencies, dtype=float)
    return {"mean_s": round(float(xs.mean()), 4), "p50_s": round(float(np.percentile(xs, 50)), 4),
            "p99_s": round(float(np.percentile(xs, 99)), 4), "n": int(len(xs))}


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD evaluation script's rule)."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Best token-overlap F1 of the prediction against the gold answers."""
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        ref = normalize_answer(gold).split()
        common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred), common / len(ref)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best
