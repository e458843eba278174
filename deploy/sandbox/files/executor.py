"""The executor of one job: forked by the job server (jobserver.py) before the job arrives.

Reads one job (a JSON line) on stdin, reports on stdout: {"event": "started", ...} as soon as
the job is read, {"event": "result", ...}, then {"event": "clean", "clean": bool} once every
process of the job is dead and every writable directory is empty again. Runs as root in the
container with the server's three capabilities (it forks the harness and the killers); it
never runs candidate code and reads the candidate's output only as bytes.

python_tests: the candidate's process (forked by the server) imports `solution` and serves
calls; the trusted harness (forked here: pre-imported, under the container's harness uid)
runs the tests and reports over an HMAC-authenticated pipe. stdin_stdout: one candidate
process per case, each under a fresh uid in a fresh directory; the whole output is compared
here. Standard library only.
"""

import contextlib
import json
import os
import socket
import time

import ctl
import harness
import jobproc
import judging
import privs
import scrub

MAX_JOB_BYTES = 64 << 20
WIPE_DIRS = ("/work", "/tmp", "/dev/shm")
EXIT_EOF = 3
"""Exit status when stdin closed before a job (the pool went away): the server stops."""
PENDING = object()
"""Context.harness_exit: the harness is still running."""


class Context:
    """Where the job runs: container (uids from the block at `base`) or local."""

    def __init__(self, container, scratch_root, base):
        self.container, self.root = container, scratch_root
        self.killer_uid = base
        self.harness_uid = None if base is None else base + 1
        self.candidates = {}  # pid -> uid, still to reap
        self.harness_pid = None

    def reap(self, pid, wipe=True, last=False):
        """Kill the candidate process `pid` and everything of its uid; wipe what it wrote.
        True when nothing is left. `last`: in this process, which loses its privileges
        (nothing of the job may need them afterwards)."""
        uid = self.candidates.pop(pid, None) if wipe else self.candidates.get(pid)
        if not self.container:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(pid, 9)
            return scrub.wipe([self.root]) if wipe else True
        if uid is None:
            return True
        return privs.reap_uid(uid, self.killer_uid, WIPE_DIRS if wipe else (), here=last)

    def harness_exit(self, timeout):
        """The harness's exit code once it has ended within `timeout`; PENDING if it is
        still running (nothing is killed), None if there is none."""
        pid, end = self.harness_pid, time.monotonic() + timeout
        if pid is None:
            return None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.harness_pid = None
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > end:
                return PENDING
            time.sleep(0.001)

    def wait_harness(self, timeout):
        """The harness's exit code; killed first if it is still running after `timeout`."""
        code = self.harness_exit(timeout)
        if code is not PENDING:
            return code
        pid = self.harness_pid
        if self.container:
            privs.reap_uid(self.harness_uid, self.killer_uid)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        self.harness_pid = None
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def cleanup(self):
        """Every process of the job dead, its files gone; True when nothing is left. Once
        the harness has ended (it has, after a verdict), this process reaps the last
        candidate itself, without forking a killer; otherwise the candidates go first, so
        that nothing of theirs holds the harness up."""
        pids = list(self.candidates)
        clean = all([self.reap(pid) for pid in pids[:-1]])
        code = self.harness_exit(0.2) if self.container and pids else PENDING
        if code is not PENDING:
            clean = self.reap(pids[-1], last=True) and clean
        else:
            clean = (not pids or self.reap(pids[-1])) and clean
            code = self.wait_harness(2.0)
        clean = clean and code in (None, 0)
        if self.container:
            clean = clean and all(not os.listdir(d) for d in WIPE_DIRS)
        return clean


class Spawner:
    """The executor's end of the control socket: candidate processes started by the server,
    and how they ended."""

    def __init__(self, sock):
        self.sock, self.exits = sock, {}

    def spawn(self, kind, limits, fds):
        names = list(fds)
        try:
            ctl.send(self.sock, {"op": "spawn", "kind": kind, "limits": limits, "fds": names},
                     [fds[n] for n in names])  # fmt: skip
        finally:
            for fd in fds.values():
                os.close(fd)
        while True:
            msg = self._take(self._recv(0))
            if msg is not None:
                if "error" in msg:
                    raise OSError(f"the job server could not start the candidate: {msg['error']}")
                return msg["pid"], msg["uid"]

    def _recv(self, flags):
        msg, fds = ctl.recv(self.sock, flags)
        for fd in fds:
            os.close(fd)
        if msg is None:
            raise OSError("the job server closed the control channel")
        return msg

    def _take(self, msg):
        if "exit" in msg:
            self.exits[msg["exit"]] = msg["status"]
            return None
        return msg

    def status(self, pid, timeout=0.0):
        """Exit code of candidate `pid` (negative: killed by that signal), None if running."""
        end = time.monotonic() + timeout
        while pid not in self.exits:
            left = end - time.monotonic()
            self.sock.settimeout(max(left, 0.0) if left > 0 else None)
            try:
                self._take(self._recv(0 if left > 0 else socket.MSG_DONTWAIT))
            except (BlockingIOError, TimeoutError):
                return None
            finally:
                self.sock.settimeout(None)
        return self.exits[pid]


def _where(exc):
    """`Type: message at file:line` of an exception."""
    tb, at = exc.__traceback__, ""
    while tb is not None:
        at = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{at}"[:800]


def emit(obj):
    data = memoryview((json.dumps(obj, separators=(",", ":")) + "\n").encode())
    while data:
        data = data[os.write(1, data) :]


def read_job():
    """One job: a JSON line on stdin. EOFError when stdin closed before any byte."""
    chunks, size = [], 0
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            if not size:
                raise EOFError
            raise ValueError("the job ended without a newline")
        size += len(chunk)
        if size > MAX_JOB_BYTES:
            raise ValueError(f"job larger than {MAX_JOB_BYTES} bytes")
        chunks.append(chunk)
        if b"\n" in chunk:
            if not chunk.endswith(b"\n"):
                raise ValueError("bytes after the job's newline")
            return json.loads(b"".join(chunks))


def fork_harness(ctx, secret, tests, call_w, reply_r, report_w):
    """The trusted harness in a forked, pre-imported child under the harness uid: the
    candidate (another uid) can neither signal, trace nor limit it."""
    pid = os.fork()
    if pid:
        ctx.harness_pid = pid
        return pid
    code = 70
    try:
        keep = {call_w, reply_r, report_w}
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        if ctx.container:
            privs.become(ctx.harness_uid)
        os.chdir("/")
        code = harness.run(secret, tests, call_w, reply_r, report_w)
    except BaseException:
        code = 71
    finally:
        os._exit(code)


def _outputs(out, err, job):
    keep = job["keep_output"]
    return {
        "stdout": out.text(keep),
        "stderr": err.text(keep),
        "truncated": out.truncated or err.truncated or out.total > keep or err.total > keep,
    }


def _pipes(n):
    return [os.pipe() for _ in range(n)]


def python_tests(job, ctx, sp, deadline):
    secret = os.urandom(32)
    (call_r, call_w), (reply_r, reply_w), (report_r, report_w) = _pipes(3)
    (out_r, out_w), (err_r, err_w), (code_r, code_w) = _pipes(3)
    fds = {"stdout": out_w, "stderr": err_w, "code": code_r, "call": call_r, "reply": reply_w}
    feed = jobproc.Feed(code_w, job["code"].encode("utf-8"))
    pid, uid = sp.spawn("tests", jobproc.rlimits(job, ctx.container), fds)
    ctx.candidates[pid] = uid
    fork_harness(ctx, secret, job["tests"], call_w, reply_r, report_w)
    for fd in (call_w, reply_r, report_w):
        os.close(fd)
    out, err = jobproc.Capture(job["keep_output"]), jobproc.Capture(job["keep_output"])
    reports = judging.Reports(secret)
    how = jobproc.pump(
        {out_r: out, err_r: err, report_r: reports}, deadline, output_limit=job["output_limit"],
        counted={out_r, err_r}, feeds=[feed],
        stop=lambda: reports.done is not None or reports.closed,
    )  # fmt: skip
    gone = reports.dead or reports.import_failure is not None
    s_status = sp.status(pid, 0.5 if gone and how == "stop" else 0.0)
    t_status = None
    if reports.done is None:  # nothing may hold the harness up now
        ctx.reap(pid, wipe=False)
        t_status = ctx.wait_harness(2.0)
        s_status = sp.status(pid, 0.5) if s_status is None else s_status
    for fd in (out_r, err_r, report_r):
        os.close(fd)
    result = judging.judge_tests(how, reports, s_status, t_status)
    result.update(_outputs(out, err, job))
    return result


def _run_case(job, ctx, sp, case, deadline, last):
    """One stdin_stdout case in a fresh process; (how, exit code, status, out, err, clean).
    `last`: no case follows, so this process reaps it itself (Context.reap)."""
    (in_r, in_w), (out_r, out_w), (err_r, err_w), (st_r, st_w), (code_r, code_w) = _pipes(5)
    feeds = [jobproc.Feed(code_w, job["code"].encode("utf-8")),
             jobproc.Feed(in_w, case["stdin"].encode("utf-8"))]  # fmt: skip
    fds = {"stdin": in_r, "stdout": out_w, "stderr": err_w, "code": code_r, "status": st_w}
    pid, uid = sp.spawn("program", jobproc.rlimits(job, ctx.container), fds)
    ctx.candidates[pid] = uid
    out, err = jobproc.Capture(job["output_limit"]), jobproc.Capture(job["keep_output"])
    status = jobproc.Capture(4096)
    how = jobproc.pump(
        {out_r: out, err_r: err, st_r: status}, deadline, output_limit=job["output_limit"],
        counted={out_r, err_r}, feeds=feeds, stop=lambda: sp.status(pid) is not None,
    )  # fmt: skip
    code = sp.status(pid)
    if how in ("eof", "stop") and code is None:  # its pipes are closed: it is exiting
        code = sp.status(pid, max(0.001, deadline - time.monotonic()))
        how = "deadline" if code is None else how
    clean = ctx.reap(pid, last=last)  # every process of the case dead, its files gone
    for fd in (out_r, err_r, st_r):
        os.close(fd)
    return how, code, status.text(), out, err, clean


def stdin_stdout(job, ctx, sp, deadline):
    cases = judging.Cases(len(job["cases"]))
    last = (jobproc.Capture(0), jobproc.Capture(0))
    for n, case in enumerate(job["cases"], 1):
        last_case = n == len(job["cases"])
        how, code, status, out, err, clean = _run_case(job, ctx, sp, case, deadline, last_case)
        last = (out, err)
        if cases.add(how, code, status, out.text(), case["stdout"]) == "stop":
            break
        if not clean:  # never run a case on what an earlier one left behind
            if n < len(job["cases"]):
                cases.abort(f"case {n}: its processes or files could not be removed; "
                            "the remaining cases were not run")  # fmt: skip
            break
    result = cases.result()
    result.update(_outputs(*last, job))
    return result


MODES = {"python_tests": python_tests, "stdin_stdout": stdin_stdout}


def _run(job, ctx, sp):
    cpu0, oom0 = jobproc.counters() if ctx.container else (None, None)
    emit({"event": "started", "oom_kill": oom0, "pid": os.getpid()})
    t0 = time.monotonic()
    try:
        result = MODES[job["mode"]](job, ctx, sp, t0 + float(job["timeout_s"]))
    except Exception as exc:
        result = {"outcome": "sandbox_error", "detail": "executor: " + _where(exc)}
    duration = time.monotonic() - t0
    cpu1, oom1 = jobproc.counters() if ctx.container else (None, None)
    forged = result.pop("forged", False)
    if oom0 is not None and oom1 is not None and oom1 > oom0 and not forged:
        was = f"{result['outcome']}: {result.get('detail', '')}".rstrip(": ")
        result.update(outcome="memory_limit", detail=f"an OOM kill in the container (then {was})")
    result["duration_s"] = round(duration, 6)
    if cpu0 is not None and cpu1 is not None:
        result["cpu_s"] = round(cpu1 - cpu0, 6)
    else:
        usage = os.times()
        result["cpu_s"] = round(usage.children_user + usage.children_system, 6)
    return result


def run_one(ctx, sock):
    """The executor process: one job from stdin to the `clean` event. Exit status 0, or
    EXIT_EOF when no job came."""
    try:
        job = read_job()
    except EOFError:
        return EXIT_EOF
    except ValueError as exc:
        emit({"event": "started", "oom_kill": None, "pid": os.getpid()})
        emit({"event": "result", "outcome": "sandbox_error", "detail": f"bad job: {exc}"[:500]})
        emit({"event": "clean", "clean": False})
        return 0
    result = _run(job, ctx, Spawner(sock))
    emit({"event": "result", **result})
    try:
        clean = ctx.cleanup()
    except Exception:  # the pool destroys an unclean container; the verdict still stands
        clean = False
    emit({"event": "clean", "clean": clean})
    return 0
