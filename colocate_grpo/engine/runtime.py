"""Process-level set-up shared by the colocated engine and the server: CPU threads, the process group, TP groups,
and clean-up of the engine's `/dev/shm` segments (named `cgrpo<rank-0 pid>x<token>-...` by `engine.colocated`).

vLLM-free, so it can be imported (and tested) without vLLM installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time

import torch
import torch.distributed as dist


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
    threads = threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
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
