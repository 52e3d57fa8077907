"""Run untrusted, model-written Python programs safely: one sandboxed process per program, many in parallel.

Each program runs as PID 1's child in fresh user, pid, mount and network namespaces (`unshare`, util-linux), see
`_sandbox_init.py`:
- no network (a new network namespace has only a down loopback);
- every mount read-only; the only writable place is its own fresh tmpfs directory (also /tmp, /var/tmp, /dev/shm are
  fresh and empty), size-capped, gone afterwards;
- an unprivileged uid of its own (when the trainer runs as root) or no capabilities (user namespace otherwise);
- limits: wall clock (enforced here), CPU seconds, address space, file size, open files, processes;
- a clean environment (no tokens or secrets of the trainer) and its own /proc (it cannot see the trainer);
- stdout/stderr capped at `max_output_bytes` (the program is killed when it writes more);
- when it ends, for whatever reason, everything it started is killed with its pid namespace.

Machines where unprivileged user namespaces are disabled (and the trainer is not root) cannot build this; the
first run then raises `SandboxUnavailable` naming the fix, rather than running untrusted code unconfined.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ..hardware import cores_per_process

_INIT = str(Path(__file__).with_name("_sandbox_init.py"))
_SETUP_FAILED = 125
_UIDS = itertools.count()
_UID_BASE = 2_100_000_000  # far above real users (and below 2^31 - 10^7, the largest this adds)


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate programs (no `unshare`, or user namespaces disabled)."""


@dataclass
class SandboxLimits:
    """Resource limits of one program run.

    Args:
        wall_s (`float`, defaults to `10`): wall-clock seconds before the program (and its children) are killed.
        cpu_s (`int`, defaults to `10`): CPU seconds per process.
        memory_mb (`int`, defaults to `1024`): address space per process, MiB.
        file_mb (`int`, defaults to `16`): largest file it may write, MiB (its tmpfs holds 4x this).
        max_processes (`int`, defaults to `32`): processes and threads it may run at once.
        max_output_bytes (`int`, defaults to `1 MiB`): stdout + stderr kept; writing more kills it.
    """

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    max_processes: int = 32
    max_output_bytes: int = 1 << 20


@dataclass
class RunResult:
    """Outcome of one program.

    `status` is one of `ok` (exit 0), `error` (non-zero exit, e.g. a failed assert), `timeout` (wall clock),
    `cpu_limit`, `memory_limit`, `output_limit`, `killed` (another signal), `sandbox_error` (set-up failed).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


@lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """The `unshare` invocation that works here (checked once per process), or `SandboxUnavailable`."""
    exe = shutil.which("unshare")
    if exe is None:
        raise SandboxUnavailable("The code sandbox needs `unshare` (util-linux): install util-linux.")
    base = ("--net", "--pid", "--fork", "--kill-child", "--mount-proc")
    prefix = (exe, *base) if os.geteuid() == 0 else (exe, "--user", "--map-root-user", *base)
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SandboxUnavailable(
            f"The code sandbox cannot create namespaces here ({probe.stderr.strip()}). Enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0) or run as root "
            "in a container that allows unshare."
        )
    return prefix


@lru_cache(maxsize=1)
def sandbox_python() -> str:
    """The interpreter programs run with: the first candidate that really runs inside the sandbox.

    As root the program runs under an unprivileged uid, which cannot reach an interpreter installed under a
    private home (pyenv in /root); system interpreters come first then. `COLOCATE_GRPO_SANDBOX_PYTHON` overrides.
    Programs get the standard library only (`-I`: no site-packages of the trainer).
    """
    override = os.environ.get("COLOCATE_GRPO_SANDBOX_PYTHON")
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    candidates = [override] if override else ["/usr/bin/python3", "/usr/local/bin/python3", base]
    if os.geteuid() != 0 and not override:
        candidates = [base, *candidates[:2]]
    tried = []
    for python in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        result = _run(python, "print(6 * 7)", "", SandboxLimits(wall_s=60))
        if result.status == "ok" and result.stdout.strip() == "42":
            return python
        tried.append(f"{python}: {result.status} {result.stderr.strip()[-300:]}")
    raise SandboxUnavailable(
        "No Python interpreter runs inside the code sandbox (tried " + "; ".join(tried) + "). Set "
        "COLOCATE_GRPO_SANDBOX_PYTHON to an interpreter every user can execute."
    )


def _user_process_count() -> int:
    uid = os.getuid()
    return sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def run_program(program: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
    """Run `program` (Python source) in a fresh sandbox with `stdin` as its input; never raises for anything the
    program does (only `SandboxUnavailable` on machines that cannot sandbox)."""
    return _run(sandbox_python(), program, stdin, limits or SandboxLimits())


def _run(python: str, program: str, stdin: str, limits: SandboxLimits) -> RunResult:
    prefix = _unshare_prefix()
    root = os.geteuid() == 0
    with tempfile.TemporaryDirectory(prefix="cgrpo-sandbox-") as host_dir:
        source = Path(host_dir, "main.py")
        source.write_text(program)
        os.chmod(host_dir, 0o755)
        config = {
            "program": str(source),
            "python": python,
            "limits": asdict(limits),
            # One uid per concurrent program, distinct across trainer processes too (RLIMIT_NPROC counts per uid).
            "uid": _UID_BASE + (os.getpid() % 10_000) * 1_000 + next(_UIDS) % 1_000 if root else None,
            # RLIMIT_NPROC counts the real user's processes: in a user namespace that includes the trainer's own.
            "nproc": limits.max_processes if root else limits.max_processes + _user_process_count(),
        }
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        cmd = [*prefix, sys.executable, "-I", "-B", _INIT, json.dumps(config)]
        return _supervise(cmd, env, stdin, limits)


def _supervise(cmd: list[str], env: dict, stdin: str, limits: SandboxLimits) -> RunResult:
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    budget = {"left": limits.max_output_bytes, "over": False}
    lock = threading.Lock()
    out: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def kill() -> None:
        try:
            os.killpg(
                proc.pid, signal.SIGKILL
            )  # unshare and PID 1 (its --kill-child takes the namespace down)
        except ProcessLookupError:
            pass

    def drain(stream, key: str) -> None:
        while chunk := stream.read1(65536):
            with lock:
                keep = chunk[: budget["left"]]
                out[key] += keep
                budget["left"] -= len(keep)
                if len(keep) < len(chunk):
                    budget["over"] = True
            if budget["over"]:
                kill()
                break

    readers = [threading.Thread(target=drain, args=(getattr(proc, k), k), daemon=True) for k in out]
    for reader in readers:
        reader.start()

    def feed() -> None:  # in a thread: a program that never reads a large input must not block the clock
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it exited (or closed stdin) without reading its input

    threading.Thread(target=feed, daemon=True).start()
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill()
        proc.wait()
    for reader in readers:
        reader.join(timeout=5)
    code = proc.returncode
    stderr = out["stderr"].decode(errors="replace")
    status = _status(code, timed_out, budget["over"], stderr, time.monotonic() - start, limits)
    return RunResult(status, code, out["stdout"].decode(errors="replace"), stderr, time.monotonic() - start)


def _status(
    code: int, timed_out: bool, over: bool, stderr: str, seconds: float, limits: SandboxLimits
) -> str:
    if over:
        return "output_limit"
    if timed_out:
        return "timeout"
    if code == 0:
        return "ok"
    if code == _SETUP_FAILED and "sandbox set-up failed" in stderr:
        return "sandbox_error"
    if code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL) and seconds >= limits.cpu_s * 0.9:
        return "cpu_limit"
    if "MemoryError" in stderr or code == 128 + signal.SIGSEGV and "memory" in stderr.lower():
        return "memory_limit"
    if code is not None and code > 128:
        return "killed"
    return "error"


def run_programs(
    jobs: list[tuple[str, str]], limits: SandboxLimits | None = None, max_workers: int | None = None
) -> list[RunResult]:
    """Run many `(program, stdin)` pairs in parallel (default: this process's share of the cores), results in order."""
    if not jobs:
        return []
    workers = max_workers or cores_per_process()
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(lambda job: run_program(job[0], job[1], limits), jobs))
