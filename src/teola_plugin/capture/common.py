"""What both frameworks' capture code shares (one vocabulary for LlamaIndex and LangChain).

``NotLowerable``: the one way a lowering rule declines. Raised before the rule emits
anything, it makes the component run unchanged as one opaque step; its message is the
reason ``explain()`` gives.
"""

from __future__ import annotations


class NotLowerable(Exception):
    """A rule cannot lower this component instance: it runs unchanged, for the message's reason."""
