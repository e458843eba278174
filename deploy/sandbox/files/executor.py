"""The job executor: one run per job, started by the pool with `docker exec`.

Reads one JSON job on stdin; writes JSON lines on stdout: {"event": "started", ...} as
soon as the job is read, then {"event": "result", ...}. Standard library only.

Per job: a fresh scratch directory; the candidate in fresh processes under rlimits (AS,
CPU, FSIZE, NOFILE, NPROC, CORE) in sessions of their own; output read here, capped;
wall and CPU time enforced; afterwards every process of the job killed and every
writable directory wiped. The executor is non-dumpable and ignores every catchable
signal, so the candidate (same uid) can stop or kill it but never read or impersonate
it; the pool scores a vanished executor as tamper (or memory_limit after an OOM kill).

Modes: python_tests (verdicts from the trusted harness, harness.py, over an
HMAC-authenticated pipe) and stdin_stdout (whole-output comparison done here).
`--local` runs without a container (tests and benchmarks only: no isolation, and
cleanup is limited to the job's sessions).
"""

import contextlib
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402
import jobproc  # noqa: E402
import judging  # noqa: E402

MAX_JOB_BYTES = 64 << 20
WIPE_DIRS = ("/work", "/tmp", "/dev/shm")


class Context:
    def __init__(self, container, scratch_root):
        self.container = container
        self.root = scratch_root
        self.leaders = []
        self.limits = jobproc.limits_of()

    def scratch(self):
        path = os.path.join(self.root, "job-" + os.urandom(8).hex())
        os.mkdir(path, 0o700)
        return path


def _where(exc):
    """`Type: message at file:line` of an exception, without importing anything."""
    tb, at = exc.__traceback__, ""
    while tb is not None:
        at = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{type(exc).__name__}: {exc}{at}"[:800]


def emit(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def read_job():
    chunks, size = [], 0
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_JOB_BYTES:
            raise ValueError(f"job larger than {MAX_JOB_BYTES} bytes")
        chunks.append(chunk)
    return json.loads(b"".join(chunks))


def fork_harness(secret, tests, call_w, reply_r, report_w):
    """The trusted harness in a forked child: it inherits non-dumpability and the blocked
    signals, and receives the secret and the tests in memory (never on disk)."""
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        keep = {call_w, reply_r, report_w}
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        for fd in range(3, 1024):
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.chdir("/")
        code = harness.run(secret, tests, call_w, reply_r, report_w)
    except BaseException:
        code = 71
    finally:
        os._exit(code)


def python_tests(job, ctx, deadline):
    scratch = ctx.scratch()
    with open(os.path.join(scratch, "solution.py"), "w", encoding="utf-8") as f:
        f.write(job["code"])
    secret = os.urandom(32)
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()
    report_r, report_w = os.pipe()
    t_pid = fork_harness(secret, job["tests"], call_w, reply_r, report_w)
    host = f"import sys; sys.path.insert(0, {HERE!r}); import solution_host; solution_host.entry()"
    s = jobproc.spawn(
        [sys.executable, "-B", "-I", "-S", "-c", host, str(call_r), str(reply_w)],
        scratch, jobproc.rlimits(job, ctx.container), pass_fds=(call_r, reply_w),
    )  # fmt: skip
    ctx.leaders += [t_pid, s.pid]
    for fd in (call_r, call_w, reply_r, reply_w, report_w):
        os.close(fd)
    out, err = jobproc.Capture(job["keep_output"]), jobproc.Capture(job["keep_output"])
    reports = judging.Reports(secret)
    how = jobproc.pump(
        {s.stdout.fileno(): out, s.stderr.fileno(): err, report_r: reports}, deadline,
        output_limit=job["output_limit"], counted={s.stdout.fileno(), s.stderr.fileno()},
        stop=lambda: reports.done is not None or reports.closed,
    )  # fmt: skip
    s_status = s.poll()
    t_limits = jobproc.limits_of(t_pid)
    clean, statuses = jobproc.kill_all(ctx.container, ctx.leaders)
    t_status = _wait(t_pid, statuses)
    if s_status is None:
        s.wait()
    for f in (s.stdout, s.stderr):
        f.close()
    os.close(report_r)
    result = judging.judge_tests(how, reports, s_status, t_status)
    if t_limits is not None and t_limits != ctx.limits:
        result.update(outcome="tamper", passed=0, detail="the harness's resource limits changed")
        result["forged"] = True
    result.update(_outputs(out, err, job))
    return result, clean


def _wait(pid, statuses):
    """The return code of a child (negative: killed by that signal), reaped if need be."""
    status = statuses.get(pid)
    if status is None:
        try:
            status = os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None
    return os.waitstatus_to_exitcode(status)


def _outputs(out, err, job):
    keep = job["keep_output"]
    return {
        "stdout": out.text(keep),
        "stderr": err.text(keep),
        "truncated": out.truncated or err.truncated or out.total > keep or err.total > keep,
    }


def stdin_stdout(job, ctx, deadline):
    cases = judging.Cases(len(job["cases"]))
    clean = True
    last = (jobproc.Capture(0), jobproc.Capture(0))
    for case in job["cases"]:
        scratch = ctx.scratch()  # a fresh directory per case: no state carried between them
        with open(os.path.join(scratch, "solution.py"), "w", encoding="utf-8") as f:
            f.write(job["code"])
        status_r, status_w = os.pipe()
        p = jobproc.spawn(
            [sys.executable, "-B", "-I", "-S", os.path.join(HERE, "program.py"), str(status_w)],
            scratch, jobproc.rlimits(job, ctx.container), pass_fds=(status_w,),
            stdin=jobproc.subprocess.PIPE,
        )  # fmt: skip
        os.close(status_w)
        out, err = jobproc.Capture(job["output_limit"]), jobproc.Capture(job["keep_output"])
        status = jobproc.Capture(4096)
        how = jobproc.pump(
            {p.stdout.fileno(): out, p.stderr.fileno(): err, status_r: status}, deadline,
            output_limit=job["output_limit"], counted={p.stdout.fileno(), p.stderr.fileno()},
            feed=(p.stdin, case["stdin"].encode("utf-8")),
            stop=lambda p=p: p.poll() is not None,
        )  # fmt: skip
        exit_status = p.poll()
        if how in ("eof", "stop") and exit_status is None:
            try:  # its pipes are closed: it is exiting, or it must finish within the limit
                exit_status = p.wait(timeout=max(0.001, deadline - time.monotonic()))
            except jobproc.subprocess.TimeoutExpired:
                how = "deadline"
        ok, _ = jobproc.kill_all(ctx.container, [p.pid])
        clean = clean and ok and jobproc.wipe(WIPE_DIRS if ctx.container else [ctx.root])
        p.wait()
        for f in (p.stdin, p.stdout, p.stderr):
            with contextlib.suppress(OSError):
                f.close()
        os.close(status_r)
        last = (out, err)
        verdict = cases.add(how, exit_status, status.text(), out.text(), case["stdout"])
        if verdict == "stop":
            break
    result = cases.result()
    result.update(_outputs(*last, job))
    return result, clean


MODES = {"python_tests": python_tests, "stdin_stdout": stdin_stdout}


def main(argv):
    container = "--container" in argv
    scratch_root = argv[argv.index("--scratch") + 1] if "--scratch" in argv else "/work"
    try:
        jobproc.set_nondumpable()
    except OSError:
        if container:
            raise
    jobproc.block_signals()
    job = read_job()
    cpu0, oom0 = jobproc.counters() if container else (None, None)
    emit({"event": "started", "oom_kill": oom0, "pid": os.getpid()})
    ctx = Context(container, scratch_root)
    t0 = time.monotonic()
    clean = False
    try:
        result, clean = MODES[job["mode"]](job, ctx, t0 + float(job["timeout_s"]))
    except Exception as exc:  # no imports here: the candidate may have exhausted our fds
        result = {"outcome": "sandbox_error", "detail": "executor: " + _where(exc)}
    duration = time.monotonic() - t0
    try:
        if ctx.container:
            ok, _ = jobproc.kill_all(True)
            clean = clean and ok and jobproc.wipe(WIPE_DIRS)
        else:
            jobproc.kill_all(False, ctx.leaders)
            clean = jobproc.wipe([scratch_root]) and clean
    except Exception:  # the pool destroys an unclean container; the verdict still stands
        clean = False
    cpu1, oom1 = jobproc.counters() if container else (None, None)
    if jobproc.limits_of() != ctx.limits:  # lowered by the candidate to make us fail
        result.update(outcome="tamper", passed=0, detail="the executor's resource limits changed")
        result["forged"] = True
    forged = result.pop("forged", False)
    if oom0 is not None and oom1 is not None and oom1 > oom0 and not forged:
        was = f"{result['outcome']}: {result.get('detail', '')}".rstrip(": ")
        result.update(outcome="memory_limit", detail=f"an OOM kill in the container (then {was})")
    result.update(duration_s=round(duration, 6), clean=clean)
    if cpu0 is not None and cpu1 is not None:
        result["cpu_s"] = round(cpu1 - cpu0, 6)
    else:
        usage = os.times()
        result["cpu_s"] = round(usage.children_user + usage.children_system, 6)
    emit({"event": "result", **result})
    return 0


def boot(here):
    """argv for `python3 -c`: run `main` from the byte-compiled module (a script given by
    path would be compiled again on every job)."""
    return f"import sys; sys.path.insert(0, {here!r}); import executor; executor.entry()"


def entry():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    entry()
