"""Process-level set-up shared by the colocated engine and the server: CPU threads, the process group, TP groups,
and clean-up of the engine's `/dev/shm` segments (named `cgrpo<rank-0 pid>x<token>-...` by `engine.colocated`).

vLLM-free, so it can be imported (and tested) without vLLM installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from ..hardware import cores_per_process


def configure_cpu_runtime(local_world_size: int, kv_cache_gb: int, threads: int | None = None) -> None:
    """Set the vLLM-CPU knobs the user should not have to know about; a no-op when CUDA is available.

    Must run before the engine is built: the vLLM CPU worker makes `torch.set_num_threads` a no-op for the rest
    of the process, so the thread count chosen here is the one the trainer keeps too.

    Args:
        local_world_size (`int`):
            Training processes on this machine; the cores are split evenly so ranks don't oversubscribe them.
        kv_cache_gb (`int`):
            KV-cache size in GiB (vLLM-CPU reads `VLLM_CPU_KVCACHE_SPACE`, not `gpu_memory_utilization`).
        threads (`int`, *optional*):
            Threads for this process; defaults to the cores divided by `local_world_size`.
    """
    if torch.cuda.is_available():
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
    threads = threads or cores_per_process(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


def ensure_process_group() -> None:
    """external_launcher needs torch.distributed; a single unlaunched process gets a private 1-rank gloo group.

    Under torchrun/accelerate the trainer's group must already exist (vLLM would otherwise build its own, with
    a different rank layout), so a multi-process environment without one is an error.
    """
    if dist.is_initialized():
        return
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError(
            "Initialise torch.distributed (e.g. via Accelerator()) before building the engine."
        )
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def local_rank(rank: int, world: int) -> int:
    """This process's index on its machine, which vLLM's external_launcher reads from `LOCAL_RANK` (the GPU it
    drives; on CPU, the cores it binds). The global rank is right only on the first node, so it is never a fallback
    beyond one process."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()  # the trainer already put this rank on its GPU
    if "LOCAL_WORLD_SIZE" in os.environ:
        return rank % int(os.environ["LOCAL_WORLD_SIZE"])
    if world == 1:
        return 0
    raise RuntimeError(
        f"LOCAL_RANK is not set for rank {rank} of {world}: launch with torchrun or accelerate launch (they set it), "
        "or export LOCAL_RANK (this process's index on its machine) yourself."
    )


@contextlib.contextmanager
def preserved_global_state() -> Iterator[None]:
    """Restore the trainer's RNG states and float32 matmul precision after vLLM code ran.

    Building an `LLM` reseeds `random`, numpy and torch (CPU and every CUDA device) with the engine seed and sets
    `torch.set_float32_matmul_precision` from its own environment; unseeded sampling draws from the global
    generators. Without this the trainer's dropout masks and data order would depend on the engine.
    """
    import numpy as np

    precision = torch.get_float32_matmul_precision()
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_states = (
        torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    )
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def make_tp_group(tensor_parallel_size: int) -> dist.ProcessGroup | None:
    """Create the tensor-parallel groups `[0..T-1], [T..2T-1], ...` and return this rank's group.

    Every rank must call this, in the same order, even for groups it is not in (`new_group` is collective).
    """
    if tensor_parallel_size == 1:
        return None
    world = dist.get_world_size()
    groups = [list(range(i, i + tensor_parallel_size)) for i in range(0, world, tensor_parallel_size)]
    group, _ = dist.new_subgroups_by_enumeration(groups)
    return group


def unlink_stale_shm(min_age_s: float = 600.0) -> None:
    """Remove segments a killed job left: named after a rank-0 pid that no longer runs, untouched for 10 min."""
    for path in glob.glob("/dev/shm/cgrpo*x*-cpushm*"):
        pid = os.path.basename(path)[len("cgrpo") :].split("x", 1)[0]
        with contextlib.suppress(OSError, ValueError):
            if time.time() - os.path.getmtime(path) > min_age_s and not os.path.exists(f"/proc/{int(pid)}"):
                os.unlink(path)


def unlink_shm(prefix: str) -> None:
    """Remove this job's `/dev/shm` segments at exit (the mappings of ranks still running stay valid)."""
    for path in glob.glob(f"/dev/shm/{prefix}*"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16); x86 Linux flags, False elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def default_engine_dtype() -> str:
    """The engine dtype when the recipe sets none: vLLM's own `"auto"` on GPU; on CPU the faster of the two, measured
    on SmolLM2-135M decode (docs/PERFORMANCE.md): bfloat16 where the CPU has native bf16 (182 vs 81 tok/s),
    float32 where bf16 is emulated (AVX2 only: 103 vs 27 tok/s)."""
    if torch.cuda.is_available():
        return "auto"
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def nccl_group(host: str, port: int, rank: int, world_size: int, device: int):
    """Join the trainer <-> server NCCL group (vLLM's stateless group: independent of both torch.distributed
    worlds). Rank 0 is the trainer's main process, ranks 1.. the server's TP ranks."""
    from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group

    return stateless_init_process_group(host, port, rank, world_size, device=device)
