"""Per-token log-probabilities for the loss, without TRL's fused chunked LM head where it does not pay off.

TRL 1.16 scores completions through a fused, chunked LM-head kernel that never materialises the
`[batch, seq, vocab]` logits. On GPUs with large vocabularies that saves memory; on CPU it projects every position
(prompt included, no Triton compaction) and recomputes chunks in backward, which measured ~25% slower per
forward+backward on SmolLM2-135M than plain logits restricted to the completion. `logprob_impl: auto` therefore
uses this plain path on CPU and TRL's kernel on GPU.
"""

from __future__ import annotations

import torch

from ._trl import entropy_from_logits, selective_log_softmax


def plain_token_logps(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    entropy_requires_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the last `logits_to_keep` tokens (and optionally their entropies).

    Args:
        model (`torch.nn.Module`): causal LM (possibly DDP-wrapped) returning `.logits`.
        input_ids (`torch.Tensor`): prompt + completion ids, shape `[batch, seq]`.
        attention_mask (`torch.Tensor`): shape `[batch, seq]`.
        logits_to_keep (`int`): completion length `C`; only those positions are projected through the LM head.
        temperature (`float`): logits are divided by it, as in sampling.
        batch_size (`int`, *optional*): rows per forward (memory cap); all rows at once if `None`.
        compute_entropy (`bool`, *optional*, defaults to `False`): also return per-token entropies.
        entropy_requires_grad (`bool`, *optional*, defaults to `False`): keep entropies in the graph (entropy bonus).

    Returns:
        `tuple[torch.Tensor, torch.Tensor | None]`: logps shape `[batch, C]`, entropies shape `[batch, C]` or None.
    """
    batch_size = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start : start + batch_size]
        logits = model(
            input_ids=ids,
            attention_mask=attention_mask[start : start + batch_size],
            logits_to_keep=logits_to_keep + 1,
            use_cache=False,
        ).logits
        logits = logits[:, :-1].float() / temperature  # position t predicts token t + 1
        logps.append(selective_log_softmax(logits, ids[:, -logits_to_keep:]))
        if compute_entropy:
            with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
                entropies.append(entropy_from_logits(logits))
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None


@torch.no_grad()
def mismatch_sums(
    trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token train-inference mismatch of the sampled tokens, summed for averaging across ranks.

    Args:
        trainer_logps (`torch.Tensor`): the trainer's logprobs of the sampled tokens, shape `[batch, C]`.
        sampling_logps (`torch.Tensor`): the engine's logprobs of the same tokens when it sampled them, `[batch, C]`
            (NaN where the engine gave none).
        mask (`torch.Tensor`): 1 for completion tokens, shape `[batch, C]`.

    Returns:
        `torch.Tensor`: `[sum of KL(engine || trainer) estimates, sum of |logprob difference|, token count]`, float32.
        The KL estimate per token is `r - 1 - log r` with `r = p_trainer / p_engine` (Schulman's k3): unbiased for
        tokens drawn from the engine, never negative, and 0 exactly when the two agree.
    """
    valid = mask.bool() & torch.isfinite(sampling_logps)
    log_ratio = (trainer_logps.detach().float() - sampling_logps.float()).masked_fill(~valid, 0.0)
    kl = torch.exp(log_ratio) - 1 - log_ratio
    return torch.stack([kl.sum(), log_ratio.abs().sum(), valid.sum().float()])
