"""Reward-side options of `ColocateGRPOConfig` (a mixin, so `config/trainer.py` stays about the engine): error handling,
DAPO overlong shaping and dynamic sampling. Checked at parse time by `check_reward_options`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class RewardOptions:
    """
    Args:
        reward_on_error (`Literal["raise", "skip"]`, *optional*, defaults to `"raise"`):
            A reward function that raises: `raise` stops with an error naming the function and the sample; `skip`
            gives that sample no reward from that function (None: excluded from its normalisation).
        overlong_buffer_length (`int`, *optional*, defaults to `0`):
            DAPO soft overlong punishment (eq. 13) with this cache length L_cache; 0 turns it off. Completions longer
            than `max_completion_length - L_cache` tokens get a penalty growing linearly to -1 at
            `max_completion_length` (added as the reward `overlong_penalty`).
        overlong_penalty_factor (`float`, *optional*, defaults to `1.0`):
            Weight of the overlong penalty among the rewards.
        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            DAPO dynamic sampling: drop prompt groups whose rewards are all equal (no learning signal) and generate
            from new prompts until the batch is full again, at most `dynamic_sampling_max_rounds` extra rounds.
        code_timeout_s (`float`, *optional*, defaults to `10`):
            `code` rewards: wall-clock seconds per program run (CPU seconds are capped at the same value).
        code_memory_mb (`int`, *optional*, defaults to `1024`):
            `code` rewards: address-space limit per process of a program, MiB.
        code_max_workers (`int`, *optional*):
            `code` rewards: programs run at once per training process (default: the cores / local processes).
        dynamic_sampling_max_rounds (`int`, *optional*, defaults to `3`):
            Extra generation rounds per batch; when they run out the batch is filled with filtered groups (whose
            advantages are zero, so they add nothing to the loss).
    """

    reward_on_error: Literal["raise", "skip"] = field(
        default="raise",
        metadata={"help": "A reward function that raises: raise (name it) or skip the sample."},
    )
    overlong_buffer_length: int = field(
        default=0, metadata={"help": "DAPO soft overlong punishment cache length (tokens); 0 = off."}
    )
    overlong_penalty_factor: float = field(default=1.0, metadata={"help": "Weight of the overlong penalty."})
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "DAPO: replace zero-variance groups by groups from new prompts."}
    )
    dynamic_sampling_max_rounds: int = field(
        default=3, metadata={"help": "Most extra generation rounds per batch for dynamic sampling."}
    )

    code_timeout_s: float = field(
        default=10.0, metadata={"help": "Code rewards: wall seconds per program run."}
    )
    code_memory_mb: int = field(
        default=1024, metadata={"help": "Code rewards: memory per program process, MiB."}
    )
    code_max_workers: int | None = field(
        default=None,
        metadata={"help": "Code rewards: programs at once per process (default: cores / processes)."},
    )

    def check_reward_options(self) -> None:
        if not self.code_timeout_s > 0 or self.code_memory_mb < 64:
            raise ValueError(
                f"code_timeout_s must be > 0 and code_memory_mb >= 64, got {self.code_timeout_s} / {self.code_memory_mb}."
            )
        if self.code_max_workers is not None and self.code_max_workers < 1:
            raise ValueError(f"code_max_workers must be >= 1, got {self.code_max_workers}.")
        if self.overlong_buffer_length < 0:
            raise ValueError(f"overlong_buffer_length must be >= 0, got {self.overlong_buffer_length}.")
        if self.overlong_buffer_length >= self.max_completion_length:
            raise ValueError(
                f"overlong_buffer_length={self.overlong_buffer_length} must be below max_completion_length="
                f"{self.max_completion_length} (DAPO uses e.g. 4096 of 20480)."
            )
        if self.overlong_penalty_factor < 0:
            raise ValueError(f"overlong_penalty_factor must be >= 0, got {self.overlong_penalty_factor}.")
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(
                f"dynamic_sampling_max_rounds must be >= 1, got {self.dynamic_sampling_max_rounds}."
            )
        local = self.per_device_train_batch_size * (self.steps_per_generation or 1)
        if self.dynamic_sampling and local % self.num_generations:
            raise ValueError(
                f"dynamic_sampling needs whole prompt groups on each process: per_device_train_batch_size x "
                f"steps_per_generation = {local} must be a multiple of num_generations={self.num_generations}."
            )
