"""How the executor turns what it observed into an outcome. Standard library only.

python_tests: the verdict is what the trusted harness reported on the authenticated
channel; the candidate's own exit status and output only ever make it worse.
stdin_stdout: the whole output of each case, compared here under the whitespace rule of
`normalize` (trailing spaces/tabs of every line and trailing empty lines are ignored;
everything else, including leading spaces, blank lines in between and case, must match).
"""

import hashlib
import hmac
import json
import signal

MAX_REPORT_BYTES = 32 << 20
DETAIL = 600


def _signame(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class Reports:
    """The harness's event lines: each `<hex hmac> <json>`, sequence-numbered from 1."""

    def __init__(self, secret):
        self.key, self.buf, self.size, self.seq = secret, b"", 0, 0
        self.bad, self.closed, self.done, self.total = "", False, None, None
        self.passed, self.counted, self.first_failure, self.memory_error = 0, 0, "", False
        self.dead, self.import_failure, self.error = False, None, None

    def __call__(self, chunk):
        if not chunk:
            self.closed = True
            if self.buf and not self.bad:
                self.bad = "a partial line on the verdict channel"
            return
        self.size += len(chunk)
        if self.size > MAX_REPORT_BYTES:
            self.bad = self.bad or "the verdict channel carried too much data"
            return
        self.buf += chunk
        while not self.bad:
            idx = self.buf.find(b"\n")
            if idx < 0:
                return
            line, self.buf = self.buf[:idx], self.buf[idx + 1 :]
            self._line(line)

    def _line(self, line):
        mac, _, body = line.partition(b" ")
        want = hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()
        if not hmac.compare_digest(mac, want):
            self.bad = "an unauthenticated line on the verdict channel"
            return
        try:
            ev = json.loads(body)
        except ValueError:
            self.bad = "an unreadable line on the verdict channel"
            return
        if type(ev) is not dict or ev.get("seq") != self.seq + 1 or self.done is not None:
            self.bad = "an out-of-sequence line on the verdict channel"
            return
        self.seq += 1
        self._event(ev)

    def _event(self, ev):
        kind = ev.get("ev")
        if kind == "test":
            self.counted += 1
            self.passed += ev.get("ok") is True
            self.memory_error |= ev.get("exc") == "MemoryError"
            self.dead |= ev.get("dead") is True
            if ev.get("ok") is not True and not self.first_failure:
                self.first_failure = f"{ev.get('name')}: {ev.get('error')}"[:DETAIL]
        elif kind == "plan":
            self.total = ev.get("total")
        elif kind == "import":
            self.import_failure = ev
        elif kind == "error":
            self.error = ev
        elif kind == "done":
            if ev.get("passed") != self.passed or ev.get("total") != self.counted:
                self.bad = "the verdict does not add up"
                return
            self.done = ev


def _result(outcome, passed, total, detail):
    return {"outcome": outcome, "passed": passed, "total": total, "detail": detail[:DETAIL]}


def judge_tests(how, rep, s_rc, t_rc):
    """Outcome of a python_tests job. how: what ended the wait (jobproc.pump);
    s_rc / t_rc: return codes of the candidate's process and of the harness (negative:
    killed by that signal; None: still running when the job ended)."""
    total = rep.total if type(rep.total) is int else rep.counted
    passed = rep.passed
    if rep.bad:  # a forged verdict stays tamper whatever else happened
        return {**_result("tamper", 0, total, rep.bad), "forged": True}
    if how == "output":
        return _result("output_limit", passed, total, "output over the limit; job killed")
    if how == "deadline":
        return _result("timeout", passed, total, f"wall time limit after {rep.counted} tests")
    if rep.import_failure is not None:  # the model's failure, whatever the tests did next
        return _import_failed(rep.import_failure, total, s_rc)
    if rep.error is not None:
        msg = str(rep.error.get("msg"))
        if rep.error.get("blame") == "candidate":
            mem = rep.error.get("exc") == "MemoryError"
            return _result("memory_limit" if mem else "runtime_error", 0, total, msg)
        return _result("sandbox_error", 0, 0, f"task error: {msg}")
    if rep.done is None:
        if t_rc is not None and t_rc < 0:
            return _result("tamper", 0, total, f"the test harness was killed ({_signame(t_rc)})")
        return _result("sandbox_error", 0, 0, f"the test harness ended without a verdict ({t_rc})")
    return _judge_done(rep, passed, total, s_rc)


def _import_failed(imp, total, s_rc):
    what = f"{imp.get('type')}: {imp.get('msg')}"
    if imp.get("kind") == "syntax":
        return _result("compile_error", 0, total, what)
    if imp.get("type") == "MemoryError":
        return _result("memory_limit", 0, total, what)
    if s_rc == -signal.SIGXCPU:
        return _result("timeout", 0, total, "CPU time limit while importing")
    if imp.get("kind") == "exit":
        why = f"the solution called sys.exit({imp.get('msg')}) while importing"
        return _result("runtime_error", 0, total, why)
    if imp.get("kind") == "exited":
        code = "" if s_rc is None else f" (exit code {s_rc})"
        return _result("runtime_error", 0, total, f"the solution exited while importing{code}")
    return _result("runtime_error", 0, total, f"importing the solution failed: {what}")


def _judge_done(rep, passed, total, s_rc):
    if s_rc == -signal.SIGXCPU:
        return _result("timeout", passed, total, "CPU time limit")
    if rep.memory_error:
        return _result("memory_limit", passed, total, rep.first_failure)
    if passed == total and total > 0:
        return _result("passed", passed, total, "")
    if rep.dead:
        why = "" if s_rc is None else f" ({_signame(s_rc) if s_rc < 0 else f'exit code {s_rc}'})"
        return _result("runtime_error", passed, total, f"the solution process died{why}; "
                       + rep.first_failure)  # fmt: skip
    return _result("failed", passed, total, rep.first_failure)


def normalize(text):
    """Lines of `text` with trailing spaces/tabs/CR/FF/VT cut and trailing empty lines dropped."""
    lines = [ln.rstrip(" \t\r\f\v") for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def difference(got, want):
    """'' when equal under `normalize`, else where they first differ."""
    g, w = normalize(got), normalize(want)
    if g == w:
        return ""
    for i, (a, b) in enumerate(zip(g, w, strict=False)):
        if a != b:
            return f"line {i + 1}: expected {b[:80]!r}, got {a[:80]!r}"
    if len(g) < len(w):
        return f"output ended after {len(g)} lines; expected {len(w)}"
    return f"{len(g) - len(w)} extra lines after the expected {len(w)}"


class Cases:
    """Outcome of a stdin_stdout job, one case at a time."""

    def __init__(self, total):
        self.total, self.index, self.passed, self.crashed = total, 0, 0, 0
        self.stopped, self.first_failure = None, ""

    def add(self, how, rc, status, output, expected):
        """Judge one case; "stop" when the job ends here."""
        self.index += 1
        where = f"case {self.index}/{self.total}"
        exc = status.partition("exc:")[2].split("\n")[0] if "exc:" in status else ""
        if status.startswith("compile:"):
            self.stopped = ("compile_error", status[len("compile:") :].strip())
        elif how == "output":
            self.stopped = ("output_limit", f"{where}: output over the limit")
        elif how == "deadline" or rc == -signal.SIGXCPU:
            self.stopped = ("timeout", f"{where}: time limit")
        elif exc == "MemoryError":
            self.stopped = ("memory_limit", f"{where}: MemoryError")
        if self.stopped is not None:
            return "stop"
        if rc != 0:
            self.crashed += 1
            why = _signame(rc) if rc is not None and rc < 0 else f"exit code {rc}"
            self._fail(f"{where}: {why}" + (f" ({exc})" if exc else ""))
            return "next"
        diff = difference(output, expected)
        if diff:
            self._fail(f"{where}: wrong answer: {diff}")
        else:
            self.passed += 1
        return "next"

    def abort(self, reason):
        """End the job here: the cases not run yet count as failed."""
        if self.stopped is None:
            self.stopped = ("failed", reason)

    def _fail(self, text):
        if not self.first_failure:
            self.first_failure = text

    def result(self):
        if self.stopped is not None:
            return _result(self.stopped[0], self.passed, self.total, self.stopped[1])
        if self.total == 0:
            return _result("sandbox_error", 0, 0, "task error: no cases")
        if self.passed == self.total:
            return _result("passed", self.passed, self.total, "")
        if self.passed == 0 and self.crashed:
            return _result("runtime_error", 0, self.total, self.first_failure)
        return _result("failed", self.passed, self.total, self.first_failure)
