"""The job server: one long-lived trusted process per warm container, started with it.

The pool writes one job per line on its stdin (attached through the engine API) and reads
JSON lines from its stdout: `started`, `result`, then `clean` once the job's processes are
dead and its directories wiped (or `lost` when an executor died without a result). Per job:

- the server (root in the container, with CAP_SETUID, CAP_SETGID and CAP_SETPCAP only)
  forks an executor (executor.py) that reads the job; the server itself never reads a job,
  so its memory, which every later process of the container inherits, holds no tests, no
  expected output and no other candidate's code;
- on the executor's request it forks each candidate process from this clean, pre-imported
  state: its own session, a fresh unprivileged uid (cycled through the container's block),
  no capabilities, no_new_privs, rlimits, a fresh scratch directory it creates itself, and
  the candidate's code read from a pipe (never through this process);
- it reaps those processes and tells the executor how they ended.

Standard library only. `--local`: no uid switching (tests and benchmarks only, no
isolation). `--once`: serve one job and exit (the `docker exec` and `docker run` modes).
"""

import contextlib
import fcntl
import gc
import io
import json
import os
import select
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import ctl  # noqa: E402
import executor  # noqa: E402
import jobproc  # noqa: E402
import privs  # noqa: E402
import program  # noqa: E402
import solution_host  # noqa: E402

UID_BLOCK = 1024
"""Uids per container: base = killer, base+1 = harness, the rest cycle over the jobs."""
PRELOAD = ("re", "math", "collections", "itertools", "functools", "heapq", "bisect", "string",
           "random", "operator", "copy", "fractions", "decimal", "statistics", "dataclasses",
           "typing", "enum", "array", "struct", "json", "io", "time")  # fmt: skip
"""Imported once here, so a candidate's `import` of them costs nothing (fork shares them)."""
OURS = ("ctl", "executor", "harness", "jobproc", "jobserver", "judging", "privs", "program",
        "pytest_shim", "remote", "scrub", "solution_host", "wire")  # fmt: skip
JOB_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "2"}  # fmt: skip


def emit(obj):
    data = memoryview((json.dumps(obj, separators=(",", ":")) + "\n").encode())
    while data:
        data = data[os.write(1, data) :]


class Server:
    def __init__(self, container, base_uid, scratch_root):
        self.container, self.base, self.root = container, base_uid, scratch_root
        self.jobs = 0
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def context(self):
        base = self.base if self.container else None
        return executor.Context(self.container, self.root, base)

    def next_uid(self):
        if not self.container:
            return os.getuid()
        self.jobs += 1
        return self.base + 2 + self.jobs % (UID_BLOCK - 2)

    def serve(self, once):
        while True:
            ours, theirs = ctl.pair()
            pid = os.fork()
            if pid == 0:
                code = 72
                try:
                    ours.close()
                    self._quiet_signals()
                    code = executor.run_one(self.context(), theirs)
                finally:
                    os._exit(code)
            theirs.close()
            status = self.attend(pid, ours)
            ours.close()
            if status == executor.EXIT_EOF:
                return 0
            if status != 0:
                oom = jobproc.counters()[1] if self.container else None
                emit({"event": "lost", "detail": f"the executor ended with status {status}",
                      "oom_kill": oom})  # fmt: skip
            if once:
                return 0

    def _quiet_signals(self):
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.wake_r)
        os.close(self.wake_w)

    def attend(self, e_pid, sock):
        """Serve the executor's spawn requests and report exits until it ends."""
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        status = None
        while status is None:
            for fd, ev in poller.poll(1000):
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                    continue
                try:
                    msg, fds = ctl.recv(sock) if ev & select.POLLIN else (None, [])
                except OSError:  # the executor is gone (ECONNRESET: it left exits unread)
                    msg, fds = None, []
                if msg is None:
                    poller.unregister(fd)
                else:
                    self.spawn(msg, fds, sock)
            status = self.reap(e_pid, sock)
        return status

    def reap(self, e_pid, sock):
        status = None
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                return status
            code = os.waitstatus_to_exitcode(st)
            if pid == e_pid:
                status = code
                continue
            with contextlib.suppress(OSError):
                ctl.send(sock, {"exit": pid, "status": code})

    def spawn(self, msg, fds, sock):
        uid = self.next_uid()
        try:
            pid = os.fork()
        except OSError as exc:
            pid = -1
            error = f"fork: {exc}"
        if pid == 0:
            code = 73
            try:
                sock.detach()
                code = self.candidate(msg, fds, uid)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        ctl.send(sock, {"pid": pid, "uid": uid} if pid > 0 else {"error": error})

    def candidate(self, msg, fds, uid):
        """The candidate's process, forked from this clean state. Trusted until the
        candidate's code starts (solution_host.serve / program.run)."""
        _place_fds(dict(zip(msg["fds"], fds, strict=True)), msg["kind"])
        os.setsid()
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer takes the candidate first
        if self.container:
            privs.become(uid)
        os.umask(0o077)
        scratch = os.path.join(self.root, "job-" + os.urandom(8).hex())
        os.mkdir(scratch, 0o700)
        os.chdir(scratch)
        _write_code(scratch)
        jobproc.apply_rlimits(msg["limits"])
        _fresh_state(scratch)
        if msg["kind"] == "tests":
            solution_host.serve(4, 5)
            return 0
        return program.run(4)


def _place_fds(fdmap, kind):
    """stdin/stdout/stderr on 0-2 (/dev/null where not given), then code on 3 and the
    mode's own (tests: call 4, reply 5; program: status 4); every other fd closed."""
    order = ["code", "call", "reply"] if kind == "tests" else ["code", "status"]
    high = {name: fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for name, fd in fdmap.items()}
    null = fcntl.fcntl(os.open(os.devnull, os.O_RDWR), fcntl.F_DUPFD, 10)
    for target, name in enumerate(["stdin", "stdout", "stderr", *order]):
        os.dup2(high.get(name, null), target)
    keep = 3 + len(order)
    for name in os.listdir("/proc/self/fd"):
        if int(name) >= keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _write_code(scratch):
    chunks = []
    while True:
        chunk = os.read(3, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(3)
    fd = os.open(os.path.join(scratch, "solution.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    data = memoryview(b"".join(chunks))
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)


def _fresh_state(scratch):
    """What a fresh interpreter would have: default signals, the job's environment, its
    own buffered std streams, none of our modules importable by name."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.environ.clear()
    os.environ.update(JOB_ENV, HOME=scratch)
    sys.argv = [os.path.join(scratch, "solution.py")]
    sys.path[:] = [scratch, *(p for p in sys.path if p != HERE)]
    for name in OURS:
        sys.modules.pop(name, None)
    sys.dont_write_bytecode = True
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False))
    )
    out = io.BufferedWriter(io.FileIO(1, "w", closefd=False))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(out, write_through=False)
    err = io.BufferedWriter(io.FileIO(2, "w", closefd=False))
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        err, errors="backslashreplace", line_buffering=True
    )


def _preload():
    """Import PRELOAD, then move every object so far out of the collector's reach
    (gc.freeze): a forked child's full collections then never write to the pages it shares
    with this process, so those are not copied. A child allocating enough to run one costs
    about half as much (1.4 against 2.9 ms of CPU in a micro-benchmark here); the small
    jobs of benchmarks/jobserver.py do not reach that and did not change."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    gc.collect()
    gc.freeze()


def main(argv):
    container = "--container" in argv
    base = int(argv[argv.index("--base-uid") + 1]) if container else 0
    root = argv[argv.index("--scratch") + 1] if "--scratch" in argv else "/work"
    if container:
        privs.set_nondumpable()
    srv = Server(container, base, root)
    once = "--once" in argv
    if not once:  # a one-shot server would pay for the imports and never reuse them
        _preload()
    signal.set_wakeup_fd(srv.wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return srv.serve(once)


def boot(here):
    """argv for `python3 -c`: run from the byte-compiled modules (a script given by path
    would be compiled again on every start)."""
    return f"import sys; sys.path.insert(0, {here!r}); import jobserver; jobserver.entry()"


def entry():
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entry()
