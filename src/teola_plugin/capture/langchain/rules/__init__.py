"""The built-in lowering rules; importing this package registers them."""

from . import composite_retrievers, composition, dynamic, models, parsers, prompts, retrievers  # noqa: F401
