"""In-process weight sync: sources yield `(name, tensor)`, the engine consumes them, the probe verifies."""

from .probe import StaleWeightsError, SyncProbe
from .sources import plain_source, weight_source

__all__ = ["StaleWeightsError", "SyncProbe", "plain_source", "weight_source"]
