"""PID 1 of a sandbox: run by `sandbox.py` inside fresh user/pid/mount/network namespaces (`unshare`), as a plain
script (`python -I _sandbox_init.py CONFIG_JSON`), importing only the standard library.

In order: read the program while the host's files are still visible; make every mount read-only; put fresh,
size-capped tmpfs mounts on /tmp, /var/tmp and /dev/shm (so the only writable place is the program's own
directory, /tmp/sandbox, gone when the namespace goes); fork the program with resource limits, an unprivileged
uid (as real root) or no capabilities (in a user namespace), and a clean environment; wait for it; exit with its
status (128 + signal if killed). When this process exits the kernel kills everything left in the pid namespace,
so no background child outlives the sandbox.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
SETUP_FAILED = 125  # the parent reports this as status "sandbox_error"

libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None) -> None:
    args = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def _make_everything_read_only() -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we do here propagates back to the host
    with open("/proc/self/mountinfo") as fh:
        mounts = [line.split() for line in fh]
    for fields in sorted(mounts, key=lambda f: f[4].count("/")):
        target, options = fields[4].replace("\\040", " "), fields[5].split(",")
        keep = sum(flag for name, flag in _FLAGS.items() if name in options)  # locked flags must be kept
        try:
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            if target == "/":
                raise  # fail closed: never run a program on a writable root


def _drop_capabilities() -> None:
    """No capabilities at all (user-namespace root otherwise keeps them over its namespace)."""
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP; EINVAL past the last capability is fine
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def _child(config: dict) -> None:
    limits = config["limits"]
    mb = 1 << 20
    for name, soft, hard in (
        ("RLIMIT_CPU", limits["cpu_s"], limits["cpu_s"] + 1),
        ("RLIMIT_AS", limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        ("RLIMIT_FSIZE", limits["file_mb"] * mb, limits["file_mb"] * mb),
        ("RLIMIT_NOFILE", 64, 64),
        ("RLIMIT_CORE", 0, 0),
        ("RLIMIT_NPROC", config["nproc"], config["nproc"]),
    ):
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if config["uid"] is not None:  # real root: become an unprivileged uid of our own (drops every capability)
        os.setgroups([])
        os.setgid(config["uid"])
        os.setuid(config["uid"])
    else:
        _drop_capabilities()
    os.chdir("/tmp/sandbox")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp/sandbox",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
    }
    os.execve(config["python"], [config["python"], "-I", "-B", "main.py"], env)


def main() -> None:
    config = json.loads(sys.argv[1])
    try:
        with open(config["program"], "rb") as fh:
            program = fh.read()
        _make_everything_read_only()
        size = f"size={config['limits']['file_mb'] * 4}m,mode=1777"
        for target in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(target):
                _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size)
        os.mkdir("/tmp/sandbox", 0o777)
        os.chmod("/tmp/sandbox", 0o777)
        with open("/tmp/sandbox/main.py", "wb") as fh:
            fh.write(program)
    except OSError as exc:
        print(f"sandbox set-up failed: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _child(config)
        except BaseException as exc:  # noqa: BLE001 - report and never fall through into the parent's code
            print(f"sandbox set-up failed: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
