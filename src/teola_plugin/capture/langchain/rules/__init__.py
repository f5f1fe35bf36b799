"""The built-in lowering rules; importing this package registers them."""

from . import composition, models, prompts, retrievers  # noqa: F401
