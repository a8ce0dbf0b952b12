"""The worker's OS sandbox: candidate code runs where it can touch nothing that matters.

``command(policy, argv)`` is what the engine runs instead of ``argv``: this module, as a fresh
single-threaded process (the launcher), sets the sandbox up and then executes ``argv`` (the
worker) inside it. What the worker gets, on Linux, by what the engine may do:

- **root** (containers, CI machines, most GPU boxes): new mount, PID and network namespaces, and
  an unprivileged uid of its own (``policy.uid``, 61000 + the worker's index): the engine's
  environment (/proc/<pid>/environ) and files are other users', the engine's processes are not
  even visible, and there is no network (only a loopback that is down).
- **user** (an ordinary account with unprivileged user namespaces): the same namespaces inside a
  new user namespace, as a non-root uid there, so no capability survives into the worker.
- **none** (namespaces refused): resource limits, a session of its own and parent-death only.
  The run records which mode it got (engine/judge.py reports it in the worker's hello).

In the first two modes the worker's file system is the machine's, read-only, with the project's
folder, the database's folder, the engine user's home, /home, /root, /tmp, /var/tmp, /dev/shm,
/run, /mnt, /media and /srv covered by empty file systems; the code it imports (the project's
engine/ and kernels/, the Python installation and its site-packages) is put back read-only, the
compile caches (Triton's, inductor's) read-write; its working directory, HOME and TMPDIR are a
private tmpfs.
Its process is PID 1 of its namespace: when it dies, the kernel kills every process it started,
so no child survives it or holds its pipes; the launcher kills it when the engine dies (a
lifeline pipe the engine holds closes) and PID 1 dies with the launcher (parent-death signal). Limits: processes, file size, open files, core dumps,
CPU time, and (without a GPU, where CUDA's address-space reservations do not apply) address
space; with a GPU the judge watches the worker's resident memory and PyTorch's allocator is capped.

What it does not do: it is not a seccomp filter (system calls are not filtered), it does not hide
the machine's world-readable system files (/etc, /usr), and in mode "none" it is no sandbox at
all: candidate code then runs as the engine's user, guarded only by the static allow list and
the runtime guard. GPU device nodes stay usable (a candidate may crash or hang its GPU context;
the judge replaces the worker).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
_MOUNT_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
                "strictatime": MS_STRICTATIME}
BASE_UID = 61000
HIDDEN = ("/home", "/root", "/var/tmp", "/run", "/mnt", "/media", "/srv")   # and /tmp, /dev/shm
SKIP_RO = ("/proc", "/sys", "/dev")     # pseudo file systems: left as they are


@dataclass
class Policy:
    """What one sandbox gets. Paths are absolute; missing ones are ignored."""
    uid: int = BASE_UID                   # root mode: the worker's own unprivileged uid
    hide: list = field(default_factory=list)
    keep: list = field(default_factory=list)       # put back read-only inside hidden folders
    writable: list = field(default_factory=list)   # read-write (Triton's and inductor's caches)
    workdir: str = "/tmp/work"            # inside the private /tmp
    address_space_bytes: int | None = None
    nproc: int = 4096
    file_size_bytes: int = 8 << 30
    open_files: int = 4096
    cpu_seconds: int = 24 * 3600
    lifeline_fd: int = -1                 # read end of a pipe the engine holds: EOF = it is gone
    enabled: bool = True                  # False: limits only (NIGHTSHIFT_SANDBOX=off)


def default_policy(index: int = 0, db_path: str | None = None, gpu: bool = False,
                   address_space_bytes: int | None = None) -> Policy:
    """The policy for worker ``index``: hide the project, the database's folder and the homes;
    keep the code the worker imports; per-uid compile caches."""
    uid = BASE_UID + index
    home = os.path.expanduser("~")
    hide = [str(ROOT), home, *HIDDEN]
    if db_path:
        hide.append(str(Path(db_path).resolve().parent))
    keep = [str(ROOT / "engine"), str(ROOT / "kernels")]
    hide = _dedupe(hide)
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
              os.path.dirname(os.path.realpath(sys.executable)), *sys.path,
              os.environ.get("CUDA_HOME", ""), os.environ.get("ROCM_PATH", "")]:
        if not (p and os.path.isabs(p) and os.path.exists(p)):
            continue
        p = os.path.normpath(p)
        # never a folder that holds something hidden (it would put it back), nor anything of
        # the project beside its code
        if any(h == p or h.startswith(p.rstrip("/") + "/") for h in hide) or _under(p, [str(ROOT)]):
            continue
        if p not in keep:
            keep.append(p)
    if os.geteuid() == 0:
        cache = f"/var/tmp/nightshift-sandbox/{uid}"
    else:
        cache = os.path.join(home, ".cache", "nightshift", "sandbox", str(uid))
    limit = address_space_bytes if not gpu else None
    return Policy(uid=uid, hide=_dedupe(hide), keep=_dedupe(keep), writable=[cache],
                  address_space_bytes=limit,
                  enabled=os.environ.get("NIGHTSHIFT_SANDBOX", "on").lower() not in ("off", "0"))


def _dedupe(paths) -> list:
    out = []
    for p in paths:
        p = os.path.normpath(p)
        if p not in out:
            out.append(p)
    return out


def cache_env(policy: Policy) -> dict:
    """Where Triton and inductor keep compiled kernels inside the sandbox (they persist across
    workers of the same uid), and who the worker says it is: its uid has no passwd entry, and
    PyTorch names cache folders after the user."""
    root = policy.writable[0] if policy.writable else policy.workdir
    return {"TRITON_CACHE_DIR": os.path.join(root, "triton"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
            "USER": f"nightshift{policy.uid}", "LOGNAME": f"nightshift{policy.uid}"}


def lifeline() -> tuple[int, int]:
    """(read end for the policy, write end the engine keeps open while the worker may live).
    The engine's death closes the write end, whichever of its threads started the worker: the
    launcher then kills the sandbox (a parent-death signal would follow the starting thread)."""
    r, w = os.pipe()
    return r, w


def command(policy: Policy, argv: list[str]) -> list[str]:
    """The command that runs ``argv`` inside the sandbox (pass ``policy.lifeline_fd`` to it)."""
    return [sys.executable, "-S", str(Path(__file__).resolve()), json.dumps(asdict(policy)), "--",
            *argv]


# ---------------------------------------------------------------------------------------------
# the launcher (a fresh process: ``python -m engine.sandbox POLICY -- ARGV``)
# ---------------------------------------------------------------------------------------------
_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags):
    _check(_c().unshare(ctypes.c_int(flags)), "unshare")


def _mount(src, target, fstype, flags, data=None):
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_c().mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


def _prctl(option, arg):
    _c().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))


def _die_with_parent(parent_pid: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    ppid = os.getppid()     # 0: the parent is outside this PID namespace (PID 1's launcher)
    if parent_pid and ppid not in (parent_pid, 0):    # it died before the signal was armed
        os._exit(137)


def _mounts():
    """(mount point, per-mount option flags) from /proc/self/mountinfo, outermost first."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mp = parts[4].replace("\\040", " ")
            flags = 0
            for opt in parts[5].split(","):
                flags |= _MOUNT_FLAGS.get(opt, 0)
            out.append((mp, flags))
    return sorted(out, key=lambda m: m[0].count("/"))


def _under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _read_only_everything(skip) -> int:
    """Remount every mount read-only (keeping its locked flags); returns how many refused."""
    refused = 0
    for mp, flags in _mounts():
        if _under(mp, SKIP_RO) or _under(mp, skip):
            continue
        try:
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            refused += 1
    return refused


def _setup(policy: Policy, mode: str) -> dict:
    """Inside the new namespaces (as PID 1): mounts, then limits. Returns what it did."""
    report = {"mode": mode, "pid_namespace": True, "network": "none", "hidden": [], "kept": []}
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        report["proc"] = "own"
    except OSError as e:
        report["proc"] = f"shared ({e.strerror})"
    # open what is put back before anything is covered: bind mounts take them from the fds
    keep = [(p, os.open(p, os.O_PATH), False) for p in policy.keep if os.path.exists(p)]
    for p in policy.writable:
        os.makedirs(p, exist_ok=True)
        if mode == "root" and p.startswith("/var/tmp/nightshift-sandbox/"):
            os.chown(p, policy.uid, policy.uid)
            os.chmod(p, 0o700)
        keep.append((p, os.open(p, os.O_PATH), True))
    # what lives under /tmp or /dev/shm is hidden by the private scratch mounted there below
    # (a tmpfs over /tmp itself, made read-only with the hidden ones, would take the scratch)
    scratch = ["/tmp", "/dev/shm"]
    hide = [h for h in policy.hide if os.path.isdir(h) and not _under(h, scratch)]
    report["read_only_refused"] = _read_only_everything(skip=())
    covered = []
    for h in sorted(hide, key=len):
        if _under(h, covered):
            continue
        _mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
        covered.append(h)
        report["hidden"].append(h)
    # the worker's own scratch: a fresh /tmp (its working directory in it) and /dev/shm; before
    # anything is put back, since what is put back may live under /tmp (a Ray job's code does)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=4g")
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=1g")
    for p, fd, writable in sorted(keep, key=lambda k: len(k[0])):
        if not _under(p, covered + scratch):
            os.close(fd)
            continue
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
        _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
        # a bind mount starts with its source's flags, and every source is read-only by now
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
        try:
            _mount(None, p, None, flags)
        except OSError:
            if writable:
                raise
        os.close(fd)
        report["kept"].append(p)
    for h in covered:                 # nothing may be written beside what was put back
        try:
            _mount(None, h, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            pass
    os.makedirs(policy.workdir, exist_ok=True)
    if mode == "root":
        os.chown(policy.workdir, policy.uid, policy.uid)
    os.chmod(policy.workdir, 0o700)
    return report


def _device_groups() -> list[int]:
    """Groups that own GPU device nodes the worker could not open otherwise (/dev/nvidia* and
    /dev/dri/* on NVIDIA, /dev/kfd on AMD), so the unprivileged uid keeps its GPU."""
    import glob
    import stat
    gids = set()
    for path in glob.glob("/dev/nvidia*") + glob.glob("/dev/dri/*") + ["/dev/kfd"]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not (st.st_mode & stat.S_IROTH and st.st_mode & stat.S_IWOTH) and st.st_gid != 0:
            gids.add(st.st_gid)
    return sorted(gids)


def _limits(policy: Policy) -> None:
    import resource
    lims = [(resource.RLIMIT_NPROC, policy.nproc), (resource.RLIMIT_FSIZE, policy.file_size_bytes),
            (resource.RLIMIT_NOFILE, policy.open_files), (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_CPU, policy.cpu_seconds)]
    if policy.address_space_bytes:
        lims.append((resource.RLIMIT_AS, policy.address_space_bytes))
    for what, value in lims:
        try:
            soft, hard = resource.getrlimit(what)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            pass


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _enter(policy: Policy) -> str:
    """Create the namespaces; returns the mode obtained ("root", "user" or "none")."""
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET
    if os.geteuid() == 0:
        try:
            _unshare(flags)
            return "root"
        except OSError:
            pass
    uid, gid = os.geteuid(), os.getegid()
    try:
        _unshare(flags | CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"1000 {uid} 1")
        _write("/proc/self/gid_map", f"1000 {gid} 1")
        return "user"
    except OSError:
        return "none"


def _exit_like(status: int) -> None:
    """Exit as a child with wait status ``status`` did: by the same signal, or the same code."""
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else (
        code - 128 if 128 < code < 128 + signal.NSIG else None)   # PID 1 reports it as 128 + sig
    if sig:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(code)


def _init(worker: int) -> None:
    """PID 1 of the namespace: reap whatever the worker leaves behind until the worker itself
    exits; then exit, which makes the kernel kill every other process in the namespace."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == worker:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _wait_or_lifeline(child: int, lifeline_fd: int) -> int:
    """Wait for ``child``; kill it first if the lifeline closes (the engine died)."""
    import select
    while True:
        if lifeline_fd >= 0:
            ready, _, _ = select.select([lifeline_fd], [], [], 0.5)
            if ready and not os.read(lifeline_fd, 1):
                os.kill(child, signal.SIGKILL)
                lifeline_fd = -1
        try:
            pid, status = os.waitpid(child, 0 if lifeline_fd < 0 else os.WNOHANG)
        except InterruptedError:
            continue
        if pid == child:
            return status


def main(argv: list[str]) -> None:
    policy = Policy(**json.loads(argv[0]))
    target = argv[argv.index("--") + 1:]
    env = dict(os.environ)
    mode = _enter(policy) if policy.enabled else "none"
    if mode == "none":
        _limits(policy)
        if policy.lifeline_fd >= 0:
            os.close(policy.lifeline_fd)
        env["NIGHTSHIFT_SANDBOX_REPORT"] = json.dumps(
            {"mode": "none", "why": "namespaces unavailable" if policy.enabled else "disabled"})
        os.execvpe(target[0], target, env)
    launcher = os.getpid()
    child = os.fork()
    if child:
        # the launcher: outside the namespaces, waits for PID 1 and exits as its worker did
        signal.signal(signal.SIGTERM, lambda *a: os.kill(child, signal.SIGKILL))
        _exit_like(_wait_or_lifeline(child, policy.lifeline_fd))
    try:
        if policy.lifeline_fd >= 0:
            os.close(policy.lifeline_fd)
        _die_with_parent(launcher)
        report = _setup(policy, mode)
        _limits(policy)
        if mode == "root":
            os.setgroups(_device_groups())
            os.setgid(policy.uid)
            os.setuid(policy.uid)
        _die_with_parent(launcher)             # changing credentials clears the signal
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.chdir(policy.workdir)
        report.update(uid=os.getuid(), limits={"nproc": policy.nproc,
                                               "address_space": policy.address_space_bytes})
        env.update(HOME=policy.workdir, TMPDIR="/tmp", NIGHTSHIFT_SANDBOX_REPORT=json.dumps(report),
                   **cache_env(policy))
        init = os.getpid()
        worker = os.fork()
        if worker == 0:
            _die_with_parent(init)
            os.execvpe(target[0], target, env)
        _init(worker)
    except BaseException as e:   # never run the worker unsandboxed by accident
        sys.stderr.write(f"sandbox setup failed: {type(e).__name__}: {e}\n")
        os._exit(70)


if __name__ == "__main__":
    main(sys.argv[1:])
