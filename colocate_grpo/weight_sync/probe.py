"""The sync probe: after every weight sync, check that the engine computes what the trainer's model computes.

A missed or partial sync is silent otherwise: generation keeps working, only with old weights, and the
importance-sampling ratio quietly absorbs the mismatch. The probe scores one fixed token sequence with both the
training model and the engine and compares the per-token log-probabilities; the max absolute difference is logged
every sync and, above `tolerance`, training stops with `StaleWeightsError`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .sources import unwrap

DEFAULT_PROBE_TEXT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer: In May she sold 48 / 2 = 24 clips, "
    "so altogether she sold 48 + 24 = 72 clips. The answer is 72."
)


class StaleWeightsError(RuntimeError):
    """The inference engine's log-probabilities disagree with the trained model's: it serves stale or wrong weights."""


def probe_settings(
    engine_dtype: torch.dtype, trainer_dtype: torch.dtype = torch.float32
) -> tuple[str, float]:
    """The statistic the probe checks and its tolerance, from the engine's real dtype and the trainer's.

    Measured on SmolLM2-135M (83-token probe, 8 correct syncs each; `make bench` reruns it on every dtype):
    - float32 on both sides: a correct sync agrees to <= 1e-4 in max |logprob difference|, one skipped step at lr 2e-5
      shows 0.026: the **max** is checked against 1e-3, so a single missed step is caught here too.
    - 16-bit on either side: kernel rounding alone moves single tokens by up to 0.27 (bf16) / 0.03 (fp16), so the
      **mean** |difference| over the sequence is checked: correct syncs 0.024-0.035 (bf16) / 0.003-0.004 (fp16),
      while swapping two same-shaped tensors of one layer gives >= 0.92 and a wrong norm >= 7. Tolerances 0.15 /
      0.03 sit 4-7x above the noise and 6x below the mildest such error. Stale or partly loaded weights are caught
      exactly, in every dtype, by the weight digest (`digest.py`), not by this probe.

    Returns:
        `tuple[str, float]`: `("max", 1e-3)`, `("mean", 0.15)` (bf16) or `("mean", 0.03)` (fp16).
    """
    dtypes = {engine_dtype, trainer_dtype}
    if torch.bfloat16 in dtypes:
        return "mean", 0.15
    if torch.float16 in dtypes:
        return "mean", 0.03
    return "max", 1e-3


class SyncProbe:
    """Compare the trainer's and the engine's log-probabilities of one fixed sequence.

    Args:
        token_ids (`list[int]`):
            The probe sequence, shape `[seq]`; scored at positions `1..seq-1`.
        tolerance (`float`):
            Largest allowed value of the statistic.
        statistic (`str`, *optional*, defaults to `"max"`):
            `"max"` or `"mean"` absolute logprob difference over the sequence (see `probe_settings`).
    """

    def __init__(self, token_ids: list[int], tolerance: float, statistic: str = "max"):
        if len(token_ids) < 2:
            raise ValueError("weight_sync_probe_text must tokenize to at least 2 tokens.")
        if statistic not in ("max", "mean"):
            raise ValueError(f"statistic must be 'max' or 'mean', got {statistic!r}.")
        self.token_ids = list(token_ids)
        self.tolerance = tolerance
        self.statistic = statistic

    @classmethod
    def from_text(cls, tokenizer, text: str, tolerance: float, statistic: str = "max") -> SyncProbe:
        return cls(tokenizer(text, add_special_tokens=True)["input_ids"], tolerance, statistic)

    @torch.no_grad()
    def reference_logprobs(self, model: torch.nn.Module) -> torch.Tensor:
        """Log-probabilities of `token_ids[1:]` under the training model, shape `[seq - 1]`, float64."""
        module = unwrap(model)
        was_training = module.training
        module.eval()
        try:
            device = next(module.parameters()).device
            ids = torch.tensor([self.token_ids], device=device)
            logits = module(input_ids=ids).logits[0, :-1].double()
        finally:
            module.train(was_training)
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None].to(logits.device))[:, 0].cpu()

    def measure(self, model: torch.nn.Module, engine) -> float:
        """Max |logprob difference| over the sequence and all ranks (collective; see `stats`)."""
        return self.stats(model, engine)["max"]

    def stats(self, model: torch.nn.Module, engine) -> dict[str, float]:
        """Max and mean |logprob difference| over the sequence, each reduced (max) over all ranks so every rank
        agrees. Every rank must call this: the reduction is a collective."""
        diff = (self.reference_logprobs(model) - engine.prompt_logprobs(self.token_ids)).abs()
        stats = torch.stack([diff.max(), diff.mean()]).to(torch.float32)
        if dist.is_initialized():
            if dist.get_backend() == "nccl":
                stats = stats.cuda()
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        return {"max": float(stats[0]), "mean": float(stats[1])}

    def check(self, model: torch.nn.Module, engine, step: int) -> dict[str, float]:
        """`measure`, then raise `StaleWeightsError` on every rank if the statistic exceeds the tolerance."""
        stats = self.stats(model, engine)
        value = stats[self.statistic]
        if not value <= self.tolerance:  # also catches NaN
            raise StaleWeightsError(
                f"Weight-sync probe failed at step {step}: the inference engine's log-probabilities differ from the "
                f"trained model's by {value:.3g} ({self.statistic} over the probe; tolerance {self.tolerance:.3g}), so "
                "vLLM computes with stale or wrong weights. Check the weight sync for this backend, or raise "
                "`weight_sync_probe_tolerance` if the dtype legitimately needs it."
            )
        return stats
