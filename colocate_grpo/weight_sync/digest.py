"""Exact weight digests: does the engine hold, bit for bit, the weights the trainer sent (cast to the engine dtype)?

The logprob probe (`probe.py`) checks the engine's *computation* but, in reduced precision, cannot see a small
stale update: with a bf16 engine a correct sync already moves its logprobs by 0.1-0.27 (max over the probe) while a
whole skipped step at lr 2e-5 moves the trainer's by 0.004 (measured on SmolLM2-135M; docs/PERFORMANCE.md). The
digest closes that gap exactly, in every dtype: both sides hash the bit patterns of the weights in the engine's
dtype, and any skipped, partial or wrong load changes the hash of the layer it touched.

The hash of a tensor is the pair `(sum b, sum b*b)` over its elements' bit patterns `b` (int32; 16-bit dtypes are
widened), both modulo 2**32. A sum does not depend on element order, so it is the same for a checkpoint tensor and
for the engine's storage of it: vLLM stacks q/k/v into `qkv_proj` and gate/up into `gate_up_proj`, shards them over
tensor-parallel ranks and zero-pads vocabularies, and a sum over the pieces (zeros hash to 0) is the sum over the
whole. The square makes a change that keeps the plain sum (one element +1 ulp, another -1 ulp) visible. What an
order-free hash cannot see (two same-shaped tensors swapped inside one layer, a transposed matrix) moves the probe's
logprobs by orders of magnitude more than its tolerance, so the probe catches it.

Digests are kept per *layer group*: the parameter name without its last two parts (`model.layers.3.self_attn`), the
module level at which vLLM's stacking happens, so a mismatch names the layer that went wrong.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_CHUNK = 1 << 22  # elements hashed at once: bounds the scratch memory to 16 MiB
_MASK = (1 << 32) - 1
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}

Digest = dict[str, tuple[int, int]]
"""Layer group -> `(sum of bits, sum of squared bits)`, both modulo 2**32."""


def group_of(name: str) -> str:
    """The layer group a parameter belongs to: `model.layers.3.self_attn.qkv_proj.weight` -> `model.layers.3.self_attn`;
    `lm_head.weight` -> `""`."""
    parts = name.split(".")
    return ".".join(parts[:-2])


@torch.no_grad()
def tensor_digest(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Hash of `tensor` as stored in `dtype` (default: its own dtype), shape `[2]`, int64, on the tensor's device.

    Args:
        tensor (`torch.Tensor`): any shape; a trainer tensor (cast here, with the same round-to-nearest-even cast the
            engine's `copy_` applies) or an engine parameter.
        dtype (`torch.dtype`, *optional*): the engine's dtype.

    The entries are not yet reduced modulo 2**32 (so digests of many tensors can be added on the device without a
    host sync); `finish` reduces them.
    """
    dtype = dtype or tensor.dtype
    flat = tensor.detach().reshape(-1)
    scratch = torch.empty(min(_CHUNK, flat.numel()), dtype=torch.int32, device=flat.device)
    cast = torch.empty(scratch.numel(), dtype=dtype, device=flat.device) if flat.dtype != dtype else None
    total = torch.zeros(2, dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start : start + _CHUNK]
        if cast is not None:
            chunk = cast[: chunk.numel()].copy_(chunk)
        bits = scratch[: chunk.numel()].copy_(chunk.view(_BITS[chunk.element_size()]))
        # int32 sums wrap, i.e. are exact modulo 2**32 whatever the order of addition.
        total[0] += bits.sum(dtype=torch.int32)
        total[1] += bits.mul_(bits).sum(dtype=torch.int32)
    return total


def add(digests: dict[str, torch.Tensor], name: str, tensor_hash: torch.Tensor) -> None:
    """Accumulate one tensor's hash (from `tensor_digest`) into its layer group."""
    group = group_of(name)
    digests[group] = digests[group] + tensor_hash if group in digests else tensor_hash.clone()


def finish(digests: dict[str, torch.Tensor]) -> Digest:
    """Reduce accumulated hashes modulo 2**32 into plain ints (one host transfer)."""
    if not digests:
        return {}
    names = sorted(digests)
    values = torch.stack([digests[n] for n in names]).cpu().tolist()
    return {n: (v[0] & _MASK, v[1] & _MASK) for n, v in zip(names, values)}


def mismatched_groups(expected: Digest, actual: Digest) -> list[str]:
    """Layer groups whose digests differ. If the two sides group differently (an engine whose module tree does not
    mirror the checkpoint's names), the totals are compared and `["<all weights>"]` is returned on a mismatch."""
    if expected.keys() == actual.keys():
        return [g or "<root>" for g in sorted(expected) if expected[g] != actual[g]]

    def total(d: Digest) -> tuple[int, int]:
        return (sum(v[0] for v in d.values()) & _MASK, sum(v[1] for v in d.values()) & _MASK)

    return [] if total(expected) == total(actual) else ["<all weights>"]


class DigestCheck:
    """The trainer side of the digest: hashes every tensor a sync sends (cast to the engine's dtype) and compares the
    accumulated expectation with the engine's `weights_digest()` after the load.

    Tensors sent once (frozen weights) keep their hash, so the expectation always covers every weight the engine
    should hold, and a later load that overwrote one of them is caught too.

    Args:
        dtype (`torch.dtype`): the engine's real dtype (read from the engine, never from a config string).
    """

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._hashes: dict[str, torch.Tensor] = {}
        self._stream = None

    def track(self, buckets):
        """Pass `buckets` (lists of `(name, full_tensor)`) through unchanged, hashing each tensor while it is valid.
        Whatever the sink leaves unconsumed is hashed by `check` (it was due in the engine all the same)."""
        self._stream = self._hashing(buckets)
        return self._stream

    def _hashing(self, buckets):
        for bucket in buckets:
            for name, tensor in bucket:
                self._hashes[name] = tensor_digest(tensor, self.dtype)
            yield bucket

    def expected(self) -> Digest:
        sums: dict[str, torch.Tensor] = {}
        for name, value in self._hashes.items():
            add(sums, name, value.cpu())
        return finish(sums)

    def check(self, engine, step: int) -> list[str]:
        """Compare with the engine; raise `StaleWeightsError` on every rank if any rank's engine disagrees.

        Every rank must call this after the same load (the engine digest and the agreement are collectives).

        Returns:
            `list[str]`: the mismatched layer groups (empty: the engine holds exactly what was sent).
        """
        from .probe import StaleWeightsError

        if self._stream is not None:
            # A sink that stopped early (or never started) skipped these tensors; the source still gathers them
            # (collectively, on every rank alike) so the expectation is the trainer's whole model.
            for _ in self._stream:
                pass
            self._stream = None
        bad = mismatched_groups(self.expected(), engine.weights_digest())
        flag = torch.tensor([float(len(bad))])
        if dist.is_initialized():
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            where = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
            raise StaleWeightsError(
                f"Weight-sync digest failed at step {step}: the inference engine does not hold the weights that were "
                f"sent (cast to {str(self.dtype).removeprefix('torch.')}); "
                + (
                    f"layers that differ here: {where}. "
                    if bad
                    else "the mismatch was found on another rank. "
                )
                + "A sync skipped, dropped or corrupted tensors: check the weight source and the engine's loader."
            )
        return bad
