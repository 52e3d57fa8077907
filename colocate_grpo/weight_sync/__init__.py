"""In-process weight sync: sources yield `(name, tensor)`, the engine consumes them, the probe verifies."""

from .probe import StaleWeightsError, SyncProbe
from .sources import adapter_source, weight_buckets, weight_source

__all__ = ["StaleWeightsError", "SyncProbe", "adapter_source", "weight_buckets", "weight_source"]
