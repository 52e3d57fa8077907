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


def default_tolerance(dtype: torch.dtype | str) -> float:
    """Tolerance on the max |logprob difference| over the probe sequence.

    float32: 1e-3. A correct sync agrees to ~4e-5 on SmolLM2-135M (30 layers), while one skipped sync on the default
    CPU recipe (lr 2e-5) shows 0.026 (measured by `make bench`), so a single missed step is caught.
    Half precision: 0.5. HF and vLLM half-precision kernels legitimately differ by ~0.05-0.2 here, and a small update
    may not even change the rounded weights, so one missed step cannot be told from noise; a sync that stays
    broken is still caught once the policy drifts, and so is a wrong or partial load.
    """
    name = str(dtype).removeprefix("torch.")
    return 1e-3 if name in ("float32", "auto", "float64") else 0.5


class SyncProbe:
    """Compare the trainer's and the engine's log-probabilities of one fixed sequence.

    Args:
        token_ids (`list[int]`):
            The probe sequence, shape `[seq]`; scored at positions `1..seq-1`.
        tolerance (`float`):
            Largest allowed max absolute logprob difference.
    """

    def __init__(self, token_ids: list[int], tolerance: float):
        if len(token_ids) < 2:
            raise ValueError("weight_sync_probe_text must tokenize to at least 2 tokens.")
        self.token_ids = list(token_ids)
        self.tolerance = tolerance

    @classmethod
    def from_text(cls, tokenizer, text: str, tolerance: float) -> SyncProbe:
        return cls(tokenizer(text, add_special_tokens=True)["input_ids"], tolerance)

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
        """Max |logprob difference| over the sequence, reduced (max) over all ranks so every rank agrees.

        Every rank must call this: the reduction is a collective.
        """
        diff = (self.reference_logprobs(model) - engine.prompt_logprobs(self.token_ids)).abs().max()
        if dist.is_initialized():
            diff = diff.to(torch.float32)
            if dist.get_backend() == "nccl":
                diff = diff.cuda()
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        return float(diff)

    def check(self, model: torch.nn.Module, engine, step: int) -> float:
        """`measure`, then raise `StaleWeightsError` on every rank if the difference exceeds the tolerance."""
        diff = self.measure(model, engine)
        if not diff <= self.tolerance:  # also catches NaN
            raise StaleWeightsError(
                f"Weight-sync probe failed at step {step}: the inference engine's log-probabilities differ from the "
                f"trained model's by up to {diff:.3g} (tolerance {self.tolerance:.3g}), so vLLM is serving stale or "
                "wrong weights. Check the weight sync for this backend, or raise `weight_sync_probe_tolerance` if "
                "the dtype legitimately needs it."
            )
        return diff
