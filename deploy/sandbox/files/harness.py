"""The trusted test harness of a python_tests job (runs in a child the executor forks).

It never executes candidate code. The tests import a stand-in module `solution` whose
functions forward each call to the candidate's process over a pipe as plain data
(wire.py); the asserts then run here, on plain builtin values, so no object of the
candidate's can take part in a comparison. Verdicts go to the executor on a separate pipe,
each line authenticated with the job's secret (HMAC-SHA256 with a sequence number). The
process is non-dumpable (inherited from the executor), so the candidate, running under the
same uid, can neither read its memory nor open its file descriptors through /proc.
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
import wire

TESTS_FILE = "test_solution.py"
NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
MAX_ERROR = 600


class RemoteError(Exception):
    """An exception of the candidate's code that has no builtin counterpart here."""


class RemoteDied(RemoteError):
    """The candidate's process is gone or broke the protocol; every later call fails."""


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


class Proxy:
    """Stand-in for a function, class or object that lives in the candidate's process.
    Equality is identity and truth-testing is refused: only plain values are compared."""

    __slots__ = ("_c", "_kind", "_t", "_text")

    def __init__(self, conn, target, kind, text):
        self._c, self._t, self._kind, self._text = conn, target, kind, text

    def __call__(self, *args, **kwargs):
        return self._c.call(self._t, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._c.request({"op": "getattr", **self._t, "name": name})

    def __iter__(self):
        it = self._c.request({"op": "iter", **self._t})
        if not isinstance(it, Proxy):
            raise TypeError("the candidate's iterator is not an iterator")
        return it

    def __next__(self):
        return self._c.request({"op": "next", **self._t})

    def __len__(self):
        n = self._c.request({"op": "len", **self._t})
        if type(n) is not int or n < 0:
            raise TypeError("the candidate's __len__ did not return a non-negative int")
        return n

    def __getitem__(self, key):
        return self._c.request({"op": "getitem", **self._t, "key": self._c.enc(key)})

    def __contains__(self, key):
        found = self._c.request({"op": "contains", **self._t, "key": self._c.enc(key)})
        if type(found) is not bool:
            raise TypeError("the candidate's __contains__ did not return a bool")
        return found

    def __bool__(self):
        raise TypeError("the truth value of a candidate object is not plain data")

    def __repr__(self):
        return f"<candidate {self._kind} {self._text}>"


class Conn:
    """Calls into the candidate's process. Every answer is decoded to plain data."""

    def __init__(self, call_w, reply_r):
        self.call_w, self.reply_r = call_w, reply_r
        self.next_id, self.dead, self.failures = 0, "", 0
        self.local_exceptions = {}

    def enc(self, value):
        return wire.encode(value, self._handle_of)

    @staticmethod
    def _handle_of(obj):
        if isinstance(obj, Proxy) and "h" in obj._t:
            return wire.Handle(obj._t["h"], "", "")
        raise TypeError(f"cannot pass a {type(obj).__name__} to the candidate's code")

    def _proxy(self, h):
        return Proxy(self, {"h": h.hid}, h.kind, h.text)

    def recv(self):
        try:
            return wire.recv(self.reply_r)
        except wire.WireError as exc:
            closed = isinstance(exc, wire.ChannelClosed)
            self.dead = f"the solution process {'exited' if closed else 'broke the protocol'}"
            raise RemoteDied(self.dead) from None

    def request(self, msg):
        return self.request_full(msg)[0]

    def request_full(self, msg):
        """Send one call; return (plain value, whole reply) or raise what the candidate did."""
        if self.dead:
            raise RemoteDied(self.dead)
        self.next_id += 1
        msg["id"] = self.next_id
        try:
            wire.send(self.call_w, msg)
        except OSError:
            self.dead = "the solution process exited"
            raise RemoteDied(self.dead) from None
        reply = self.recv()
        if type(reply) is not dict or reply.get("id") != self.next_id:
            self.dead = "the solution process broke the protocol"
            raise RemoteDied(self.dead)
        if "err" in reply:
            self.failures += 1
            raise self.exception(reply["err"])
        return wire.decode(reply.get("ok"), self._proxy), reply

    def call(self, target, args, kwargs):
        mutable = (list, dict, set, bytearray)
        msg = {"op": "call", **target, "args": [self.enc(a) for a in args],
               "kwargs": [[str(k), self.enc(v)] for k, v in kwargs.items()]}  # fmt: skip
        mut = any(type(a) in mutable for a in (*args, *kwargs.values()))
        if mut:
            msg["mut"] = True
        value, reply = self.request_full(msg)
        if mut:
            _copy_back(args, [wire.decode(a, self._proxy) for a in _as_list(reply.get("args"))])
            after = {k: wire.decode(v, self._proxy) for k, v in _as_list(reply.get("kwargs"))}
            for k, v in kwargs.items():
                if k in after:
                    _copy_back([v], [after[k]])
        return value

    def exception(self, err):
        if type(err) is not dict:
            return RemoteError("the candidate raised something unreadable")
        tname, base = str(err.get("type"))[:100], str(err.get("base"))[:100]
        msg, local = str(err.get("msg"))[:2000], err.get("local")
        if type(local) is str and local in self.local_exceptions:
            return self.local_exceptions[local](msg)
        cls = vars(builtins).get(base)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(msg)
            except Exception:
                exc = None
            if exc is not None:
                return exc
        return RemoteError(f"{tname}: {msg}")


def _as_list(x):
    return x if type(x) is list else []


def _copy_back(originals, updated):
    for orig, new in zip(originals, updated, strict=False):
        if type(orig) is not type(new):
            continue
        if type(orig) in (list, bytearray):
            orig[:] = new
        elif type(orig) in (dict, set):
            orig.clear()
            orig.update(new)


def _solution_module(conn, hello):
    """The stand-in `solution` module the tests import."""
    mod = types.ModuleType("solution")
    names = []
    for item in _as_list(hello.get("names")) if hello.get("ready") else []:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str:
            continue
        name, kind, extra = item[0][:200], str(item[1])[:20], item[2]
        if not name.isidentifier() or name.startswith("__"):
            continue
        if kind == "exception":
            base = vars(builtins).get(extra) if type(extra) is str else None
            base = base if isinstance(base, type) and issubclass(base, Exception) else Exception
            conn.local_exceptions[name] = type(name, (base,), {"__module__": "solution"})
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


def run(secret, tests_src, call_w, reply_r, report_w):
    """Run the tests against the candidate; report every result; return an exit code."""
    rep, conn = Reporter(report_w, secret), Conn(call_w, reply_r)
    try:
        tree = ast.parse(tests_src, TESTS_FILE)
        code = compile(tree, TESTS_FILE, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        rep.send({"ev": "error", "msg": f"the tests do not compile: {exc}"[:MAX_ERROR]})
        return 0
    rep.send({"ev": "plan", "total": _estimate(tree)})  # exact count follows collection
    try:
        hello = conn.recv()
    except RemoteDied:
        hello = {"ready": False, "kind": "exited", "type": "", "msg": "exited during import"}
    if type(hello) is not dict:
        hello = {"ready": False, "kind": "protocol", "type": "", "msg": "malformed hello"}
    if not hello.get("ready"):
        conn.dead = f"the solution failed to import: {hello.get('type')}: {hello.get('msg')}"
        event = {"ev": "import", "kind": str(hello.get("kind"))[:20]}
        event.update(type=str(hello.get("type"))[:100], msg=str(hello.get("msg"))[:MAX_ERROR])
        rep.send(event)
    sys.modules["solution"] = _solution_module(conn, hello)
    sys.modules["pytest"] = pytest_shim
    lines = tests_src.splitlines()
    tests_mod = types.ModuleType("test_solution")
    tests_mod.__file__ = TESTS_FILE
    sys.modules["test_solution"] = tests_mod
    failures_before = conn.failures
    try:
        exec(code, tests_mod.__dict__)
    except BaseException as exc:
        remote = isinstance(exc, RemoteError) or conn.failures > failures_before
        blame = "candidate" if remote else "tests"  # a call into the solution failed, or not
        rep.send({"ev": "error", "blame": blame, "exc": type(exc).__name__,
                  "msg": f"importing the tests failed: {_failure_text(exc, lines)}"})  # fmt: skip
        return 0
    items = _collect(tests_mod.__dict__, tree)
    if not items:
        rep.send({"ev": "error", "blame": "tests", "msg": "the tests define no test_* function"})
        return 0
    rep.send({"ev": "plan", "total": len(items)})
    passed = 0
    for name, target, why in items:
        ok, error, exc_type = False, why, ""
        if target is not None:
            fn, kwargs = target
            try:
                fn(**kwargs)
                ok = True
            except BaseException as exc:
                error, exc_type = _failure_text(exc, lines), type(exc).__name__
        passed += ok
        rep.send({"ev": "test", "name": name[:200], "ok": ok, "error": error, "exc": exc_type,
                  "dead": bool(conn.dead)})  # fmt: skip
    rep.send({"ev": "done", "passed": passed, "total": len(items)})
    return 0
