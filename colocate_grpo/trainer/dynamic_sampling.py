"""DAPO dynamic sampling: keep only prompt groups whose rewards differ, generating from new prompts until full.

A group whose `num_generations` completions all got the same reward has zero advantage everywhere: it costs a
forward/backward pass and teaches nothing. `fill_batch` runs generation rounds (the first on the batch the
dataloader gave, the next ones on freshly drawn prompts), keeps the informative groups of each round, and stops
when every process has its `need` groups or after `max_rounds` extra rounds; then the batch is topped up with
filtered groups (zero advantage: they add nothing to the loss, but keep the batch shape TRL expects).

Distributed invariant: every process runs the same number of rounds (generation and reward gathering are
collective), so "full" is agreed with `all_full(local_full)` (a MIN all-reduce in the trainer).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LEFT_PADDED = ("prompt_ids", "prompt_mask")  # TRL left-pads prompts, right-pads completions


def informative_groups(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Which groups have reward variance.

    Args:
        rewards (`torch.Tensor` of shape `[groups * num_generations]`): total reward per completion (NaN = no
            reward), groups contiguous.
    Returns:
        `torch.Tensor` of shape `[groups]`, bool.
    """
    grouped = rewards.view(-1, num_generations)
    valid = ~torch.isnan(grouped)  # unscorable completions never make a group informative on their own
    lo = torch.where(valid, grouped, torch.full_like(grouped, float("inf"))).min(dim=1).values
    hi = torch.where(valid, grouped, torch.full_like(grouped, float("-inf"))).max(dim=1).values
    return (valid.sum(dim=1) >= 2) & (hi - lo > 1e-6)


def _rows(batch: dict, rows: torch.Tensor) -> dict:
    n = batch["completion_ids"].shape[0]
    return {
        k: v[rows] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n else v
        for k, v in batch.items()
    }


def _pad(t: torch.Tensor, length: int, left: bool, value: int = 0) -> torch.Tensor:
    """Pad dim 1 of `t` to `length` with `value`, on the left or the right."""
    if t.dim() < 2 or t.shape[1] == length:
        return t
    pad = torch.full((t.shape[0], length - t.shape[1], *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def concat_batches(parts: list[dict], pad_token_id: int) -> dict:
    """Concatenate TRL generation batches (same keys) along the batch dimension, padding prompts on the left and
    completions (and per-token tensors) on the right to the longest part. Scalars come from the first part."""
    first = parts[0]
    n = first["completion_ids"].shape[0]
    out = {}
    for key, value in first.items():
        if not (isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == n):
            out[key] = value
            continue
        tensors = [p[key] for p in parts]
        if value.dim() >= 2:
            length = max(t.shape[1] for t in tensors)
            value = pad_token_id if key in ("prompt_ids", "completion_ids") else 0
            tensors = [_pad(t, length, key in _LEFT_PADDED, value) for t in tensors]
        out[key] = torch.cat(tensors, dim=0)
    return out


def fill_batch(
    generate_round: Callable[[int], tuple[dict, torch.Tensor]],
    need: int,
    num_generations: int,
    max_rounds: int,
    all_full: Callable[[bool], bool],
    pad_token_id: int = 0,
) -> tuple[dict, dict]:
    """Run rounds until `need` informative groups are kept here (and everywhere), or `max_rounds` extra rounds ran.

    Args:
        generate_round (`Callable[[int], tuple[dict, Tensor]]`): round index -> (this process's TRL batch of
            `need * num_generations` rows, their total rewards `[need * num_generations]`).
        need (`int`): groups per process in a full batch.
        all_full (`Callable[[bool], bool]`): whether every process is full, given whether this one is.
    Returns:
        `(batch, stats)`: the merged batch (exactly `need` groups) and metrics: `rounds` (generation rounds run),
        `filtered_groups` (zero-variance groups seen), `filled_with_filtered` (groups padded in at the cap).
    """
    kept: list[dict] = []
    spare: list[dict] = []
    have = filtered = 0
    rounds = 0
    while True:
        batch, rewards = generate_round(rounds)
        rounds += 1
        informative = informative_groups(rewards, num_generations)
        filtered += int((~informative).sum())
        for group in range(informative.numel()):
            rows = torch.arange(group * num_generations, (group + 1) * num_generations)
            if informative[group] and have < need:
                kept.append(_rows(batch, rows))
                have += 1
            elif not informative[group] and len(spare) < need:
                spare.append(_rows(batch, rows))
        if all_full(have >= need) or rounds > max_rounds:
            break
    filled = need - have
    parts = kept + spare[:filled]
    stats = {
        "rounds": float(rounds),
        "filtered_groups": float(filtered),
        "filled_with_filtered": float(filled),
    }
    return concat_batches(parts, pad_token_id), stats
