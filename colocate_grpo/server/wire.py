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
from collections.abc import Iterator
from dataclasses import asdict

import torch

from ..engine.sampling import SamplingConfig

Bucket = list[tuple[str, torch.Tensor]]


_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}


def split_bucket(bucket: Bucket, max_bytes: int) -> Iterator[Bucket]:
    """Cut a bucket into consecutive pieces of at most `max_bytes` (a piece holds at least one tensor).

    A source's bucket can be far larger than one request should be (unsharded models come as one bucket of views:
    nothing is gathered, so nothing caps it); every message to the server goes through this.
    """
    piece: Bucket = []
    size = 0
    for name, tensor in bucket:
        nbytes = tensor.numel() * tensor.element_size()
        if piece and size + nbytes > max_bytes:
            yield piece
            piece, size = [], 0
        piece.append((name, tensor))
        size += nbytes
    if piece:
        yield piece


def encode_bucket(bucket: Bucket, metadata: dict[str, str] | None = None) -> tuple[int, list]:
    """A bucket as safetensors bytes without joining them: `(total_bytes, chunks)`, where chunks are the header
    and each tensor's own memory (CPU tensors are not copied; others are copied to CPU once).

    Sending the chunks one after the other is the same byte stream `safetensors.torch.save` would produce.
    """
    header: dict = {"__metadata__": metadata} if metadata else {}
    chunks: list = []
    offset = 0
    for name, tensor in bucket:
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()  # bytes of any dtype, bf16 included, no copy
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + raw.nbytes],
        }
        chunks.append(memoryview(raw))
        offset += raw.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
    first = struct.pack("<Q", len(head)) + head
    return len(first) + offset, [first, *chunks]


def pack_bucket(bucket: Bucket, metadata: dict[str, str] | None = None) -> bytes:
    """`encode_bucket` joined into one `bytes` (safetensors format)."""
    return b"".join(encode_bucket(bucket, metadata)[1])


def unpack_bucket(data: bytes | bytearray | memoryview) -> tuple[Bucket, dict[str, str]]:
    """Inverse of `pack_bucket`: the `(name, tensor)` pairs and the string metadata. With a writable buffer
    (`bytearray`) the tensors are views into it, not copies."""
    view = memoryview(data)
    (header_len,) = struct.unpack("<Q", view[:8])
    header = json.loads(bytes(view[8 : 8 + header_len]))
    metadata = header.pop("__metadata__", {})
    base = 8 + header_len
    if view.readonly:
        view = memoryview(bytearray(view))
    bucket = []
    for name, entry in header.items():
        start, end = entry["data_offsets"]
        raw = (
            torch.frombuffer(view, dtype=torch.uint8, count=end - start, offset=base + start)
            if end > start
            else torch.empty(0, dtype=torch.uint8)
        )
        bucket.append((name, raw.view(_TORCH_DTYPES[entry["dtype"]]).reshape(entry["shape"])))
    return bucket, metadata


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


def _padded(nbytes: int) -> int:
    return nbytes + (-nbytes % 8)  # every tensor starts 8-byte aligned, so any dtype can view its slice


def flatten_bucket(bucket: Bucket, device: torch.device) -> torch.Tensor:
    """All tensors' bytes in one uint8 buffer on `device`, shape `[total_bytes]`, in bucket order, each tensor
    padded to a multiple of 8 bytes."""
    parts = []
    for _, t in bucket:
        raw = t.detach().contiguous().view(-1).view(torch.uint8).to(device)
        parts.append(raw)
        if raw.numel() % 8:
            parts.append(torch.zeros(-raw.numel() % 8, dtype=torch.uint8, device=device))
    return torch.cat(parts)


def unflatten_bucket(buffer: torch.Tensor, layout: list[dict]) -> Bucket:
    """Views into `buffer` (uint8, `[total_bytes]`, from `flatten_bucket`) for each tensor of `layout`."""
    out, offset = [], 0
    for entry in layout:
        dtype = getattr(torch, entry["dtype"])
        nbytes = _numel(entry["shape"]) * torch.empty((), dtype=dtype).element_size()
        out.append((entry["name"], buffer[offset : offset + nbytes].view(dtype).view(entry["shape"])))
        offset += _padded(nbytes)
    return out


def layout_bytes(layout: list[dict]) -> int:
    """Size of the `flatten_bucket` buffer for `layout` (padding included)."""
    return sum(
        _padded(torch.empty((), dtype=getattr(torch, e["dtype"])).element_size() * _numel(e["shape"]))
        for e in layout
    )


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


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
