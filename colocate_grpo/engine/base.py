"""What an engine is to the rest of the package: the trainer's generation backend and the server rely on these
methods only, so an in-process vLLM (`ColocatedEngine`) and a remote server (`server.remote.RemoteEngine`) are
interchangeable behind them, and nothing outside `colocate_grpo.engine` reaches into vLLM.

Every method is collective over the callers that share the engine (a TP group in colocate mode, every training rank
for `RemoteEngine`): all of them call it, in the same order, with their own arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import torch

from .sampling import Rollouts, SamplingConfig

Bucket = list[tuple[str, torch.Tensor]]


@runtime_checkable
class Engine(Protocol):
    """The interface the trainer's generation backend drives.

    Attributes:
        dtype (`torch.dtype`): the dtype the engine really holds its weights in (after resolving `"auto"`); every
            tolerance and digest derives from it.
        max_model_len (`int`): prompt + completion tokens per sequence.
    """

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def max_model_len(self) -> int: ...

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts:
        """One completion per prompt id list (shape `[batch, prompt_len_i]`) with its sampling logprobs."""
        ...

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Logprob of each token given the ones before it, shape `[len(token_ids) - 1]` (the probe's reading)."""
        ...

    def load_buckets(self, buckets: Iterable[Bucket]) -> tuple[int, int]:
        """Load checkpoint-named weights, bucket by bucket (each `[(name, tensor), ...]`); returns (tensors, bytes)."""
        ...

    def load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> int:
        """Replace the served LoRA adapter with these factors (PEFT names); returns bytes loaded."""
        ...

    def weights_digest(self) -> dict[str, tuple[int, int]]:
        """Per-layer-group digest of the weights held (see `colocate_grpo.weight_sync.digest`)."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory until the next use (a no-op where sleep mode is off)."""
        ...

    def wake_up(self, tags: list[str]) -> None:
        """Bring back `"weights"` and/or `"kv_cache"` if `sleep` put them away."""
        ...


@runtime_checkable
class ServedEngine(Engine, Protocol):
    """What the server (`colocate_grpo.server.app`) needs on top: whole-batch generation (every server rank passes the
    same prompts), weight updates streamed one bucket per request, and a prefix-cache reset."""

    def generate_all(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts: ...

    def load_bucket(self, bucket: Bucket) -> set[str]:
        """Load one bucket of an update in progress; returns the engine parameter names it wrote."""
        ...

    def finish_load(self, loaded: set[str], count: int) -> None:
        """Close an update made of `load_bucket` calls (`loaded`: every name written, `count`: tensors received)."""
        ...

    def reset_prefix_cache(self) -> None: ...
