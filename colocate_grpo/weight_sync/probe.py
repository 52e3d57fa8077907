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

    Measured on SmolLM2-135M (83-token probe; `python -m colocate_grpo.bench.verify` reruns it):
    - float32 on both sides: a correct sync agrees to <= 1e-4 in max |logprob difference| while one skipped step at
      lr 2e-5 shows 0.026, so the **max** is checked against 1e-3 and a single missed step is caught by the probe too.
    - 16-bit engine, float32 trainer: bf16 rounding alone moves the engine's logprobs by a mean of 0.004 to 0.23 per
      token (single tokens by up to 2.1) as the model sharpens and settles, so no fixed tolerance fits. The trainer
      running the same weights under autocast in the engine's dtype shows nearly the same error (0.002 to 0.22 at
      the same steps: the noise is bf16's, not the engine's), so the **ratio** of the engine's mean error to the
      trainer's own plus a kernel floor (0.01 bf16, 0.002 fp16) is checked: <= 1.0 on 34 correct syncs, >= 25
      with two same-shaped tensors swapped. Tolerance 4.
    - 16-bit trainer: no higher-precision reference is at hand, so the **mean** |difference| is checked against a
      fixed 0.5 (bf16) / 0.1 (fp16); correct bf16 syncs stayed <= 0.24, swapped tensors >= 1.0.
    Stale, skipped or partly loaded weights are caught exactly, in every dtype, by the weight digest (`digest.py`).

    Returns:
        `tuple[str, float]`: `("max", 1e-3)`, `("ratio", 4.0)`, `("mean", 0.5)` (bf16) or `("mean", 0.1)` (fp16).
    """
    if trainer_dtype in (torch.bfloat16, torch.float16):
        return "mean", 0.5 if torch.bfloat16 in (engine_dtype, trainer_dtype) else 0.1
    if engine_dtype in (torch.bfloat16, torch.float16):
        return "ratio", 4.0
    return "max", 1e-3


_KERNEL_FLOOR = {torch.bfloat16: 0.01, torch.float16: 0.002}

_DESCRIBE = {
    "max": "max |logprob difference| over the probe",
    "mean": "mean |logprob difference| over the probe",
    "ratio": "mean |logprob difference| over the trainer's own rounding error in the engine's dtype + a kernel floor",
}


class SyncProbe:
    """Compare the trainer's and the engine's log-probabilities of one fixed sequence.

    Args:
        token_ids (`list[int]`):
            The probe sequence, shape `[seq]`; scored at positions `1..seq-1`.
        tolerance (`float`):
            Largest allowed value of the statistic.
        statistic (`str`, *optional*, defaults to `"max"`):
            `"max"` or `"mean"` absolute logprob difference over the sequence, or `"ratio"`: the mean difference
            over the trainer's own mean difference when it runs under autocast in `noise_dtype` (see `probe_settings`).
        noise_dtype (`torch.dtype`, *optional*):
            The engine's dtype, for `"ratio"`.
    """

    def __init__(
        self,
        token_ids: list[int],
        tolerance: float,
        statistic: str = "max",
        noise_dtype: torch.dtype | None = None,
    ):
        if len(token_ids) < 2:
            raise ValueError("weight_sync_probe_text must tokenize to at least 2 tokens.")
        if statistic not in _DESCRIBE:
            raise ValueError(f"statistic must be one of {sorted(_DESCRIBE)}, got {statistic!r}.")
        if statistic == "ratio" and noise_dtype not in _KERNEL_FLOOR:
            raise ValueError(
                f"statistic='ratio' needs a 16-bit noise_dtype (the engine's dtype), got {noise_dtype}."
            )
        self.token_ids = list(token_ids)
        self.tolerance = tolerance
        self.statistic = statistic
        self.noise_dtype = noise_dtype

    @classmethod
    def from_text(
        cls,
        tokenizer,
        text: str,
        tolerance: float,
        statistic: str = "max",
        noise_dtype: torch.dtype | None = None,
    ) -> SyncProbe:
        return cls(tokenizer(text, add_special_tokens=True)["input_ids"], tolerance, statistic, noise_dtype)

    @torch.no_grad()
    def reference_logprobs(self, model: torch.nn.Module, autocast: torch.dtype | None = None) -> torch.Tensor:
        """Log-probabilities of `token_ids[1:]` under the training model, shape `[seq - 1]`, float64; under
        `torch.autocast` to `autocast` if given."""
        module = unwrap(model)
        was_training = module.training
        module.eval()
        try:
            device = next(module.parameters()).device
            ids = torch.tensor([self.token_ids], device=device)
            with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
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
        reference = self.reference_logprobs(model)
        diff = (reference - engine.prompt_logprobs(self.token_ids)).abs()
        noise = ratio = torch.zeros((), dtype=diff.dtype)
        if self.statistic == "ratio":
            # The trainer's own error in the engine's precision, at these very weights. The engine's kernels add a
            # small error of their own (~0.005 in bf16) that autocast does not reproduce; it dominates once the
            # model is sure of the probe's tokens, so it is added to the denominator.
            noise = (reference - self.reference_logprobs(model, autocast=self.noise_dtype)).abs().mean()
            ratio = diff.mean() / (noise + _KERNEL_FLOOR[self.noise_dtype])
        stats = torch.stack([diff.max(), diff.mean(), noise, ratio]).to(torch.float32)
        if dist.is_initialized():
            if dist.get_backend() == "nccl":
                stats = stats.cuda()
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        return dict(zip(("max", "mean", "noise", "ratio"), stats.tolist()))

    def check(self, model: torch.nn.Module, engine, step: int) -> dict[str, float]:
        """`measure`, then raise `StaleWeightsError` on every rank if the statistic exceeds the tolerance."""
        stats = self.stats(model, engine)
        value = stats[self.statistic]
        if not value <= self.tolerance:  # also catches NaN
            raise StaleWeightsError(
                f"Weight-sync probe failed at step {step}: the inference engine's log-probabilities differ from the "
                f"trained model's by {value:.3g} ({_DESCRIBE[self.statistic]}; tolerance {self.tolerance:.3g}), so "
                "vLLM computes with stale or wrong weights. Check the weight sync for this backend, or raise "
                "`weight_sync_probe_tolerance` if the dtype legitimately needs it."
            )
        return stats
