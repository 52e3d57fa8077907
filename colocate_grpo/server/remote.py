"""`RemoteEngine`: the server-mode stand-in for `ColocatedEngine`, called collectively by every training rank.

Only the main process (global rank 0) holds a `ServerClient` and talks to the server. Each method is entered by
every rank in the same order (TRL calls the generation backend on every rank), and its outcome is agreed on with one
collective: prompts are gathered to rank 0 and each rank gets back exactly its own rollouts; a server error on rank
0 is broadcast and raised on every rank, so all ranks stop together with the same message instead of the others
waiting in a collective forever. Weight buckets are produced on every rank (sharded sources gather collectively)
and sent by rank 0; after each bucket the ranks agree on whether the server took it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from ..engine.sampling import Rollouts, SamplingConfig
from .client import ServerClient, ServerError


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RemoteEngine:
    """Engine interface (`generate`, `prompt_logprobs`, `load_buckets`, `load_adapter`) over a remote server.

    Args:
        client (`ServerClient`, *optional*):
            The client; required on global rank 0, ignored (may be `None`) on the other ranks.
    """

    # The server's weight dtype and sequence length, known once `wait_until_ready` answered.
    dtype: torch.dtype | None = None
    max_model_len: int | None = None

    def __init__(self, client: ServerClient | None):
        self.rank, self.world = _world()
        self.client = client if self.rank == 0 else None
        if self.rank == 0 and client is None:
            raise ValueError("RemoteEngine needs a ServerClient on rank 0.")

    def on_main(self, fn: Callable[[ServerClient], object]):
        """Run `fn(client)` on rank 0 and return its result on every rank; any error on rank 0 is raised on all."""
        outcome: list = [None, None]
        error: BaseException | None = None
        if self.client is not None:
            try:
                outcome[0] = fn(self.client)
            except Exception as exc:  # every rank must learn about it, whatever it is
                error, outcome = exc, [None, str(exc) if isinstance(exc, ServerError) else repr(exc)]
        if self.world > 1:
            dist.broadcast_object_list(outcome, src=0)
        if error is not None:
            raise error
        if outcome[1] is not None:
            raise ServerError(f"[rank {self.rank}] {outcome[1]}")
        return outcome[0]

    def wait_until_ready(self, timeout: float) -> dict:
        """Rank 0 polls the server's health; every rank gets its info (or the start-up error)."""
        info = self.on_main(lambda client: client.wait_until_ready(timeout))
        self.dtype, self.max_model_len = getattr(torch, info["dtype"]), info["max_model_len"]
        return info

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts:
        """Rollouts for this rank's prompts (`[batch, prompt_len_i]`; batch may differ between ranks)."""
        if self.world == 1:
            return self.on_main(lambda client: client.generate(prompt_ids, sampling))
        gathered: list | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(prompt_ids, gathered, dst=0)
        parts: list | None = None
        if self.rank == 0:
            try:
                out = self.client.generate([p for chunk in gathered for p in chunk], sampling)
                parts, start = [], 0
                for chunk in gathered:  # hand each rank exactly its own slice, in its own order
                    end = start + len(chunk)
                    rollouts = Rollouts(
                        out.prompt_ids[start:end], out.completion_ids[start:end], out.logprobs[start:end]
                    )
                    parts.append((rollouts, None))
                    start = end
            except Exception as exc:
                message = str(exc) if isinstance(exc, ServerError) else repr(exc)
                parts = [(None, message)] * self.world
        received: list = [None]
        dist.scatter_object_list(received, parts, src=0)
        rollouts, message = received[0]
        if message is not None:
            raise ServerError(f"[rank {self.rank}] {message}")
        return rollouts

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """The server's logprobs of `token_ids[1:]`, shape `[len - 1]`, on every rank."""
        return self.on_main(lambda client: client.prompt_logprobs(token_ids))

    def load_buckets(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> tuple[int, int]:
        """Every rank iterates `buckets` (sharded sources gather collectively); rank 0 sends each one.

        Returns:
            `tuple[int, int]`: tensors and bytes sent.
        """
        self.on_main(lambda client: client.begin_update())
        count = nbytes = 0
        for bucket in buckets:
            nbytes += self.on_main(lambda client, b=bucket: client.send_bucket(b)) or 0
            count += len(bucket)
        self.on_main(lambda client: client.end_update())
        return count, nbytes

    def load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> int:
        """Replace the server's LoRA adapter; returns bytes sent."""
        return self.on_main(lambda client: client.send_adapter(tensors, peft_config))

    def weights_digest(self) -> dict[str, tuple[int, int]]:
        """The server's per-layer-group weight digest (see `ColocatedEngine.weights_digest`), on every rank."""
        return self.on_main(lambda client: client.weights_digest())

    def sleep(self, level: int = 1) -> None:
        """The server manages its own memory."""

    def wake_up(self, tags: list[str]) -> None:
        """The server manages its own memory."""
