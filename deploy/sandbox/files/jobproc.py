"""Process plumbing of the executor: rlimits, pipes with output caps, kill-all, wipe.

Standard library only (runs inside the sandbox image). Container mode assumes what the
pool guarantees: the executor runs under a uid of its own that nothing else in the
container uses, in the container's PID namespace, with init as PID 1 (it reaps orphans).
"""

import contextlib
import ctypes
import errno
import os
import resource
import select
import shutil
import signal
import subprocess
import time

PR_SET_DUMPABLE = 4
CATCHABLE = set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}
CGROUP_V1 = ("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/memory/memory.oom_control")
CGROUP_V2 = ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/memory.events")


def set_nondumpable():
    """No ptrace, no /proc/<pid>/mem or /fd for processes of the same uid (prctl(2))."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def block_signals():
    """Only SIGKILL and SIGSTOP can still reach us (the candidate shares our uid)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, CATCHABLE)


RLIMITS = tuple(getattr(resource, n) for n in sorted(dir(resource)) if n.startswith("RLIMIT_"))


def limits_of(pid=0):
    """Every resource limit of a process (0: this one). The candidate shares our uid, so it
    may lower ours with prlimit(2) to make us fail; callers compare snapshots. None when the
    process is gone."""
    try:
        return tuple(resource.prlimit(pid, res) for res in RLIMITS)
    except (ProcessLookupError, PermissionError):
        return None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def counters():
    """(cpu seconds of the whole container, OOM kills so far) from its cgroup, or (None,
    None) where not readable (local mode)."""
    cpu, oom = None, None
    text = _read(CGROUP_V1[0]).strip()
    if text.isdigit():
        cpu = int(text) / 1e9
    for line in (_read(CGROUP_V2[0]) if cpu is None else "").splitlines():
        if line.startswith("usage_usec "):
            cpu = int(line.split()[1]) / 1e6
    for line in (_read(CGROUP_V1[1]) or _read(CGROUP_V2[1])).splitlines():
        if line.startswith("oom_kill "):
            oom = int(line.split()[1])
    return cpu, oom


def _preexec(limits):
    def setup():
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for res, value in limits:
            soft, hard = value if isinstance(value, tuple) else (value, value)
            resource.setrlimit(res, (soft, hard))
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # the OOM killer takes the candidate first
        except OSError:
            pass

    return setup


def rlimits(job, container):
    """The candidate's rlimits from the job (NPROC only where the uid is the job's own)."""
    cpu = int(job["timeout_s"]) + 1
    out = [
        (resource.RLIMIT_AS, job["memory_mb"] << 20),
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_FSIZE, job["fsize_mb"] << 20),
        (resource.RLIMIT_NOFILE, job["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ]
    if container:
        out.append((resource.RLIMIT_NPROC, job["nproc"]))
    return out


def spawn(argv, cwd, limits, pass_fds=(), stdin=subprocess.DEVNULL):
    """Start the candidate's process in a session of its own."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": cwd,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MALLOC_ARENA_MAX": "2",
    }
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=pass_fds, close_fds=True, start_new_session=True,
        preexec_fn=_preexec(limits),
    )  # fmt: skip


class Capture:
    """Keeps the first `keep` bytes of a stream and counts all of them."""

    def __init__(self, keep):
        self.keep, self.data, self.total = keep, bytearray(), 0

    def __call__(self, chunk):
        self.total += len(chunk)
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def truncated(self):
        return self.total > len(self.data)

    def text(self, limit=None):
        data = self.data if limit is None else self.data[:limit]
        return bytes(data).decode("utf-8", "replace")


def pump(readers, deadline, output_limit=None, counted=(), feed=None, stop=None):
    """Read every fd in `readers` ({fd: callback(bytes)}; b"" means EOF) until all reach
    EOF, `stop()` is true (what is already in the pipes is still read), the deadline
    passes, or the bytes read from the `counted` fds exceed output_limit. `feed` is
    (file object, bytes) written to a pipe as the reader allows. Returns "eof", "stop",
    "deadline" or "output"."""
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    state = {"open": set(readers), "total": 0, "pending": b""}
    if feed is not None:  # (file object, bytes): closed through the object, never by fd
        os.set_blocking(feed[0].fileno(), False)
        state["pending"] = feed[1]
        if feed[1]:
            poller.register(feed[0].fileno(), select.POLLOUT)
        else:
            feed[0].close()
    draining = 0
    while state["open"]:
        if draining == 0 and stop is not None and stop():
            draining = 1
        left = deadline - time.monotonic()
        if left <= 0:
            return "deadline"
        wait = 0 if draining else max(1, min(int(left * 1000), 200))
        events = poller.poll(wait)
        if draining and (not events or draining > 64):
            return "stop"
        draining += bool(draining)
        for fd, ev in events:
            if _handle(fd, ev, readers, poller, feed, state, counted, output_limit):
                return "output"
    return "stop" if stop is not None and stop() else "eof"


def _handle(fd, ev, readers, poller, feed, state, counted, output_limit):
    if feed is not None and not feed[0].closed and fd == feed[0].fileno():
        state["pending"] = _write_some(feed[0], state["pending"], poller)
        return False
    chunk = os.read(fd, 1 << 16) if ev & (select.POLLIN | select.POLLHUP | select.POLLERR) else b""
    readers[fd](chunk)
    if not chunk:
        poller.unregister(fd)
        state["open"].discard(fd)
        return False
    if fd in counted:
        state["total"] += len(chunk)
        return output_limit is not None and state["total"] > output_limit
    return False


def _write_some(f, pending, poller):
    fd = f.fileno()
    try:
        n = os.write(fd, pending[: 1 << 16])
        pending = pending[n:]
    except BlockingIOError:
        return pending
    except OSError:  # the program closed its stdin: the rest is dropped
        pending = b""
    if not pending:
        poller.unregister(fd)
        f.close()
    return pending


def reap():
    """Collect every exited child of ours; {pid: wait status}."""
    out = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out[pid] = status


def _live_pids_of(uid):
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (me, 1):  # kill(-1) never reaches init
            continue
        fields = {}
        for line in _read(f"/proc/{name}/status").splitlines():
            key, _, value = line.partition(":")
            if key in ("Uid", "State"):
                fields[key] = value.split()
        uids, state = fields.get("Uid", []), fields.get("State", ["?"])
        if str(uid) in uids and state[0] != "Z":
            out.append(int(name))
    return out


def kill_all(container, leaders=(), rounds=400):
    """Kill every process the job started; True when none is left. Container mode:
    kill(-1, SIGKILL) from our uid reaches every process of the job (a background process
    that setsid()s included) and nothing else; repeated until /proc shows none alive.
    Local mode: the job's sessions only (no isolation there, so no kill(-1))."""
    statuses = {}
    if not container:
        for pid in leaders:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, signal.SIGKILL)
        return True, statuses
    uid = os.getuid()
    for n in range(rounds):
        if not _live_pids_of(uid):
            statuses.update(reap())
            return True, statuses
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                raise
        statuses.update(reap())
        time.sleep(0.001 * min(n, 20))
    return False, statuses


def _force_remove(path):
    def onerror(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p) or ".", 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            func(p)

    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
        shutil.rmtree(path, onerror=onerror)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def wipe(dirs):
    """Remove everything inside each directory; True when all of them are empty."""
    clean = True
    for d in dirs:
        try:
            for entry in os.listdir(d):
                _force_remove(os.path.join(d, entry))
            clean = clean and not os.listdir(d)
        except (OSError, RecursionError):
            clean = False
    return clean
