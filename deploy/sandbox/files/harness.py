"""The trusted test harness of a python_tests job (forked by the executor, pre-imported).

It never executes candidate code. The tests import a stand-in module `solution` whose
functions forward each call to the candidate's process over a pipe as plain data
(wire.py, remote.py); the asserts then run here, on plain builtin values, so no object of
the candidate's can take part in a comparison, and no exception of the candidate's can
steer the tests' control flow (remote.py: only an except clause or `pytest.raises` naming
its declared type matches it). Verdicts go to the executor on a separate pipe, each line
authenticated with the job's secret (HMAC-SHA256 with a sequence number). The process runs
under the container's harness uid, not the candidate's, so the candidate can neither
signal, trace, limit nor read it.
"""

import ast
import builtins
import hashlib
import hmac
import json
import os
import sys
import types

import pytest_shim
import remote
import wire
from remote import Conn, Proxy, Remote, as_list

TESTS_FILE = "test_solution.py"
NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
MAX_ERROR = 600
CATCH = "__rollstream_catch__"


class Reporter:
    """HMAC-authenticated, sequenced event lines to the executor."""

    def __init__(self, fd, secret):
        self.fd, self.key, self.seq = fd, secret, 0

    def send(self, event):
        self.seq += 1
        body = json.dumps({"seq": self.seq, **event}, separators=(",", ":"))
        mac = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
        view = memoryview(f"{mac} {body}\n".encode())
        while view:
            view = view[os.write(self.fd, view) :]


class _Catch(ast.NodeTransformer):
    """Every `except X` of the tests becomes `except CATCH(X)` (remote.catch): the
    candidate's exceptions match the except clauses that name their declared type."""

    def visit_ExceptHandler(self, node):
        self.generic_visit(node)
        if node.type is not None:
            call = ast.Call(ast.Name(CATCH, ast.Load()), [node.type], [])
            node.type = ast.copy_location(call, node.type)
        return node


def _solution_module(conn, hello):
    """The stand-in `solution` module the tests import."""
    mod = types.ModuleType("solution")
    names = []
    for item in as_list(hello.get("names")) if hello.get("ready") else []:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str:
            continue
        name, kind, extra = item[0][:200], str(item[1])[:20], item[2]
        if not name.isidentifier() or name.startswith("__"):
            continue
        if kind == "exception":
            conn.local_exceptions[name] = remote.local_exception_class(name, extra)
            setattr(mod, name, conn.local_exceptions[name])
        elif kind == "value":
            try:
                setattr(mod, name, wire.decode(extra, None))
            except wire.WireError:
                continue
        else:
            setattr(mod, name, Proxy(conn, {"n": name}, kind, name))
        names.append(name)

    def __getattr__(name):
        if name == "__all__":  # `from solution import *`: never shadow builtins or test names
            frame = sys._getframe(1)
            taken = set(frame.f_globals) | set(vars(builtins))
            return [n for n in names if not n.startswith(("_", "test", "Test")) and n not in taken]
        if name.startswith("__"):
            raise AttributeError(name)
        return Proxy(conn, {"n": name}, "attribute", name)

    mod.__getattr__ = __getattr__
    return mod


def _collect(ns, tree):
    """(id, callable or None, why) for every test the tests file defines, in file order."""
    items = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test"
        ):
            items.extend(_expand(node.name, ns.get(node.name), ns))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            cls = ns.get(node.name)
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith(
                    "test"
                ):
                    fn = getattr(cls, sub.name, None) if isinstance(cls, type) else None
                    bound = _bind(cls, fn) if type(fn) is types.FunctionType else None
                    items.extend(_expand(f"{node.name}::{sub.name}", bound, ns, fn))
    seen, out = set(), []
    for item in items:
        if item[0] not in seen:
            seen.add(item[0])
            out.append(item)
    return out


def _bind(cls, fn):
    return lambda **kw: fn(cls(), **kw)


def _expand(name, obj, ns, raw=None):
    fn = raw or obj
    if not (type(fn) is types.FunctionType and fn.__code__.co_filename == TESTS_FILE):
        return [(name, None, "the test function was replaced after its definition")]
    if fn.__code__.co_flags & NOT_PLAIN:
        return [(name, None, "async and generator tests are not supported")]
    if pytest_shim.skipped(fn):
        return []
    cases = pytest_shim.parametrizations(fn)
    return [(f"{name}{suffix}", (obj, kwargs), "") for suffix, kwargs in cases]


def _estimate(tree):
    """Tests the file defines, before parametrization (known before the candidate loads)."""
    n = 0
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n += node.name.startswith("test")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            n += sum(isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and sub.name.startswith("test") for sub in node.body)  # fmt: skip
    return n


def _failure_text(exc, source_lines):
    tb, line = exc.__traceback__, ""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TESTS_FILE and 0 < tb.tb_lineno <= len(source_lines):
            line = source_lines[tb.tb_lineno - 1].strip()
        tb = tb.tb_next
    try:
        msg = str(exc)
    except Exception:
        msg = "<unprintable>"
    text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    return (f"{line} -> {text}" if line else text)[:MAX_ERROR]


def _compile(tests_src):
    tree = ast.parse(tests_src, TESTS_FILE)
    guarded = ast.fix_missing_locations(_Catch().visit(ast.parse(tests_src, TESTS_FILE)))
    return tree, compile(guarded, TESTS_FILE, "exec", dont_inherit=True)


def _hello(conn, rep):
    """The candidate's import, as its process reported it; an `import` event if it failed."""
    try:
        hello = conn.recv()
    except remote.RemoteDied:
        hello = {"ready": False, "kind": "exited", "type": "", "msg": "exited during import"}
    if type(hello) is not dict:
        hello = {"ready": False, "kind": "protocol", "type": "", "msg": "malformed hello"}
    if not hello.get("ready"):
        conn.dead = f"the solution failed to import: {hello.get('type')}: {hello.get('msg')}"
        event = {"ev": "import", "kind": str(hello.get("kind"))[:20]}
        event.update(type=str(hello.get("type"))[:100], msg=str(hello.get("msg"))[:MAX_ERROR])
        rep.send(event)
    return hello


def _tests_module():
    mod = types.ModuleType("test_solution")
    mod.__file__ = TESTS_FILE
    mod.__dict__[CATCH] = remote.catch
    mod.__dict__["next"] = remote.safe_next
    sys.modules["test_solution"] = mod
    return mod


def _import_tests(code, mod, conn, rep, lines):
    """Run the tests file's top level; False (and an `error` event) when it fails. The
    candidate is to blame when its code raised, its process died or misbehaved, or its
    import had already failed; otherwise the tests are (the task's fault)."""
    failures_before = conn.failures
    try:
        exec(code, mod.__dict__)
        return True
    except BaseException as exc:
        theirs = isinstance(exc, Remote) or conn.failures > failures_before or bool(conn.dead)
        rep.send({"ev": "error", "blame": "candidate" if theirs else "tests",
                  "exc": type(exc).__name__,
                  "msg": f"importing the tests failed: {_failure_text(exc, lines)}"})  # fmt: skip
        return False


def _run_tests(items, conn, rep, lines):
    """Run every collected test. A test passes only when it returns and the candidate's
    process is still alive: a dead process fails every test from then on, whatever the
    test catches (`pytest.raises(Exception)` included)."""
    passed = 0
    for name, target, why in items:
        ok, error, exc_type = False, why, ""
        if target is not None and not conn.dead:
            fn, kwargs = target
            try:
                fn(**kwargs)
                ok = True
            except BaseException as exc:
                error, exc_type = _failure_text(exc, lines), type(exc).__name__
        if conn.dead:
            ok, error = False, error or conn.dead
        passed += ok
        rep.send({"ev": "test", "name": name[:200], "ok": ok, "error": error, "exc": exc_type,
                  "dead": bool(conn.dead)})  # fmt: skip
    return passed


def run(secret, tests_src, call_w, reply_r, report_w):
    """Run the tests against the candidate; report every result; return an exit code."""
    rep, conn = Reporter(report_w, secret), Conn(call_w, reply_r)
    try:
        tree, code = _compile(tests_src)
    except (SyntaxError, ValueError) as exc:
        rep.send({"ev": "error", "msg": f"the tests do not compile: {exc}"[:MAX_ERROR]})
        return 0
    rep.send({"ev": "plan", "total": _estimate(tree)})  # exact count follows collection
    hello = _hello(conn, rep)
    sys.modules["solution"] = _solution_module(conn, hello)
    sys.modules["pytest"] = pytest_shim
    lines = tests_src.splitlines()
    mod = _tests_module()
    if not _import_tests(code, mod, conn, rep, lines):
        return 0
    items = _collect(mod.__dict__, tree)
    if not items:
        rep.send({"ev": "error", "blame": "tests", "msg": "the tests define no test_* function"})
        return 0
    rep.send({"ev": "plan", "total": len(items)})
    passed = _run_tests(items, conn, rep, lines)
    rep.send({"ev": "done", "passed": passed, "total": len(items)})
    return 0
