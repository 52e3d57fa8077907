"""How weights and requests travel between the trainer and `python -m colocate_grpo.serve` (no vLLM engine here).

Two weight transports, both one message per byte-capped bucket (never one per parameter):
- HTTP: a bucket is one safetensors body (`pack_bucket` / `unpack_bucket`); works on CPU and across hosts.
- NCCL (GPU): a bucket is announced over HTTP (`bucket_layout`: names, dtypes, shapes) and its bytes are
  broadcast from the trainer's main process (rank 0 of a small NCCL group) to every server rank, which rebuild
  the tensors from one flat buffer (`unflatten_bucket`).
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import asdict

import torch

from .sampling import SamplingConfig

Bucket = list[tuple[str, torch.Tensor]]


def pack_bucket(bucket: Bucket, metadata: dict[str, str] | None = None) -> bytes:
    """Serialize `(name, tensor)` pairs (any device) into safetensors bytes.

    Tensors that share storage (a tied embedding) are copied, since safetensors refuses aliases.
    """
    from safetensors.torch import save

    seen: set[tuple[int, int]] = set()
    tensors = {}
    for name, tensor in bucket:
        t = tensor.detach().to("cpu").contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        tensors[name] = t.clone() if key in seen else t
        seen.add(key)
    return save(tensors, metadata)


def unpack_bucket(data: bytes) -> tuple[Bucket, dict[str, str]]:
    """Inverse of `pack_bucket`: the `(name, tensor)` pairs (CPU) and the string metadata."""
    from safetensors.torch import load

    (header_len,) = struct.unpack("<Q", data[:8])
    metadata = json.loads(data[8 : 8 + header_len]).get("__metadata__", {})
    return list(load(data).items()), metadata


def sampling_to_json(sampling: SamplingConfig) -> dict:
    return asdict(sampling)


def sampling_from_json(payload: dict) -> SamplingConfig:
    return SamplingConfig(**payload)


def bucket_layout(bucket: Bucket) -> list[dict]:
    """What the server needs to rebuild a flattened bucket: name, dtype and shape of each tensor, in order."""
    return [
        {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        for name, t in bucket
    ]


def flatten_bucket(bucket: Bucket, device: torch.device) -> torch.Tensor:
    """All tensors' bytes in one uint8 buffer on `device`, shape `[total_bytes]`, in bucket order."""
    return torch.cat([t.detach().contiguous().view(-1).view(torch.uint8).to(device) for _, t in bucket])


def unflatten_bucket(buffer: torch.Tensor, layout: list[dict]) -> Bucket:
    """Views into `buffer` (uint8, `[total_bytes]`) for each tensor of `layout`."""
    out, offset = [], 0
    for entry in layout:
        dtype = getattr(torch, entry["dtype"])
        nbytes = _numel(entry["shape"]) * torch.empty((), dtype=dtype).element_size()
        out.append((entry["name"], buffer[offset : offset + nbytes].view(dtype).view(entry["shape"])))
        offset += nbytes
    return out


def layout_bytes(layout: list[dict]) -> int:
    return sum(
        torch.empty((), dtype=getattr(torch, e["dtype"])).element_size() * _numel(e["shape"]) for e in layout
    )


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def nccl_group(host: str, port: int, rank: int, world_size: int, device: int):
    """Join the trainer <-> server NCCL group (vLLM's stateless group: independent of both torch.distributed
    worlds). Rank 0 is the trainer's main process, ranks 1.. the server's TP ranks."""
    from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

    return stateless_init_process_group(host, port, rank, world_size, device=device)


def wait_for_stream(timeout: float, what: str) -> None:
    """Wait for the current CUDA stream with a deadline: an NCCL broadcast whose peer died never completes."""
    event = torch.cuda.Event()
    event.record()
    deadline = time.monotonic() + timeout
    while not event.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not complete within {timeout:.0f} s (NCCL peer gone?)")
        time.sleep(0.005)


def local_address_towards(host: str, port: int) -> str:
    """This machine's address on the interface that reaches `host` (what the server must connect back to)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((host, port))  # UDP: no packet is sent, only the route is chosen
        return sock.getsockname()[0]
