"""The reward side of `ColocateGRPOTrainer`: guarded reward functions, DAPO overlong shaping, dynamic sampling.

`prepare_reward_funcs` runs before TRL's `__init__` (it may append the overlong penalty and its weight);
`RewardShapingMixin` overrides two TRL hooks: `_calculate_rewards` (keeps the gathered rewards of the round for
dynamic sampling) and `_generate_and_score_completions` (repeats rounds until the batch is full).
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from ..rewards.robust import guard_reward
from ..rewards.shaping import make_overlong_penalty
from ._trl import metrics_store, tokenizer_of
from .dynamic_sampling import fill_batch


def prepare_reward_funcs(reward_funcs, args) -> list:
    """Guard every plain callable reward (`reward_on_error`) and append the DAPO overlong penalty when
    `overlong_buffer_length > 0`, extending `args.reward_weights` to match."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if args.overlong_buffer_length > 0:
        if args.reward_weights is None:
            args.reward_weights = [1.0] * len(funcs)
        funcs.append(make_overlong_penalty(args.max_completion_length, args.overlong_buffer_length))
        args.reward_weights = [*args.reward_weights, args.overlong_penalty_factor]
    guarded = []
    for func in funcs:
        plain = callable(func) and not isinstance(func, str | torch.nn.Module)
        if plain and not inspect.iscoroutinefunction(func) and not hasattr(func, "__wrapped_reward__"):
            func = guard_reward(func, args.reward_on_error)
        guarded.append(func)
    return guarded


class RewardShapingMixin:
    """Mixed into `ColocateGRPOTrainer` before `trl.GRPOTrainer` in the MRO."""

    _round_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._round_rewards = rewards_per_func  # gathered over processes: [global batch, functions]
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        if not (self.args.dynamic_sampling and self.model.training):
            return super()._generate_and_score_completions(inputs)
        group = self.num_generations
        need = len(inputs) // group
        process, world = self.accelerator.process_index, self.accelerator.num_processes

        def generate_round(index: int):
            batch_inputs = inputs if index == 0 else self._fresh_inputs(len(inputs), index)
            batch = super(RewardShapingMixin, self)._generate_and_score_completions(batch_inputs)
            weights = self.reward_weights.to(self._round_rewards.device)
            totals = (self._round_rewards * weights).nansum(dim=1)
            totals[torch.isnan(self._round_rewards).all(dim=1)] = torch.nan
            local = totals.view(world, -1)[
                process
            ]  # this process's rows, whole groups (checked at parse time)
            return batch, local.cpu()

        def all_full(full: bool) -> bool:
            if world == 1:
                return full
            flag = torch.tensor([1.0 if full else 0.0], device=self.accelerator.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            return bool(flag.item())

        batch, stats = fill_batch(
            generate_round,
            need,
            group,
            self.args.dynamic_sampling_max_rounds,
            all_full,
            pad_token_id=tokenizer_of(self).pad_token_id or 0,
        )
        loss_mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        for name, value in stats.items():
            metrics_store(self)["train"][f"dynamic_sampling/{name}"].append(value)
        return batch

    def _fresh_inputs(self, count: int, round_index: int) -> list[dict]:
        """`count // num_generations` new prompts from the training set, each repeated `num_generations` times,
        drawn with a seed of (seed, step, round, process) so reruns are reproducible and processes differ."""
        group = self.num_generations
        seed = hash((self.args.seed, self.state.global_step, round_index, self.accelerator.process_index))
        generator = torch.Generator().manual_seed(seed % (2**63))
        picks = torch.randint(len(self.train_dataset), (count // group,), generator=generator).tolist()
        return [self.train_dataset[i] for i in picks for _ in range(group)]
