"""The ``parts`` of a prompt only the framework's own code renders, for the optimizer.

A lowered call's ``format`` keeps the framework's render (a chat template and the model's own
request body: prompts stay byte-identical), so its template is not written down anywhere
the optimizer can read. Rendering it once at trace time with every variable as a mark
(``ir.semantics.var_mark``) shows where each variable lands; those ``parts`` let
``split_prefill`` see which text comes before the late variables (retrieved context), and
its warm-up is then rendered by the same code, cut before them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..ir.semantics import parts_from_marks, var_mark

log = logging.getLogger(__name__)


def marked_parts(render: Callable[..., Any], names: Iterable[str]) -> list[Any] | None:
    """``render``'s template as parts, or None when rendering marks does not describe it (a
    variable that must be a list of messages, a format spec, a render that fails)."""
    names = list(names)
    try:
        prompt = render(**{n: var_mark(n) for n in names})
    except Exception as exc:  # noqa: BLE001 - a template that takes only real values: no parts
        log.debug("no parts for the prompt: rendering marks failed (%s)", exc)
        return None
    return parts_from_marks(prompt, names)
