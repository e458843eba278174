"""The candidate's side of a python_tests job: import `solution`, then serve the harness.

Runs in the candidate's process (forked by the job server, already under the candidate's
uid and limits), so nothing here is trusted: the candidate may patch any of it. That is
fine by design: the harness only ever receives plain data (wire.py) and decides every
verdict itself, in a process the candidate cannot read, signal or write.
"""

import builtins
import contextlib
import importlib.util
import os
import sys
import types

if not hasattr(builtins, "exit"):  # run with -S (no site): keep exit() and quit()
    builtins.exit = builtins.quit = sys.exit

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("_rollstream_wire", os.path.join(_HERE, "wire.py"))
wire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wire)

_objects = {}
_ids = {}


def _register(obj):
    hid = _ids.get(id(obj))
    if hid is None:
        hid = len(_objects) + 1
        _objects[hid] = obj
        _ids[id(obj)] = hid
    if isinstance(obj, type):
        kind = "class"
    elif callable(obj):
        kind = "function"
    elif hasattr(type(obj), "__next__"):
        kind = "iterator"
    else:
        kind = "object"
    try:
        text = f"{type(obj).__name__} {getattr(obj, '__name__', '')}".strip()
    except Exception:
        text = "?"
    return wire.Handle(hid, kind, text)


def _resolve(h):
    obj = _objects.get(h.hid)
    if obj is None and h.hid not in _objects:
        raise LookupError(f"unknown handle {h.hid}")
    return obj


def _builtin_base(cls):
    for k in cls.__mro__:
        if getattr(builtins, k.__name__, None) is k:
            return k.__name__
    return "Exception"


def _error(exc, module):
    cls = type(exc)
    try:
        msg = str(exc)[:2000]
    except BaseException:
        msg = "<unprintable>"
    local = cls.__name__ if getattr(module, cls.__name__, None) is cls else ""
    return {"type": cls.__name__[:100], "base": _builtin_base(cls), "msg": msg, "local": local}


def _load():
    path = os.path.join(os.getcwd(), "solution.py")
    with open(path, "rb") as f:
        source = f.read()
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f"line {getattr(exc, 'lineno', '?')}: " if getattr(exc, "lineno", None) else ""
        return None, {"ready": False, "kind": "syntax", "type": type(exc).__name__,
                      "msg": f"{where}{getattr(exc, 'msg', None) or exc}"[:2000]}  # fmt: skip
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        return None, {"ready": False, "kind": "exit", "type": "SystemExit", "msg": str(exc.code)}
    except BaseException as exc:
        return None, {"ready": False, "kind": "exception", **_error(exc, module)}
    return module, None


def _describe(module):
    names = []
    for name, value in list(vars(module).items()):
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if isinstance(value, type) and issubclass(value, BaseException):
            names.append([name, "exception", _builtin_base(value)])
            continue
        try:
            names.append([name, "value", wire.encode(value)])
        except (TypeError, ValueError, RecursionError):
            kind = "class" if isinstance(value, type) else "function" if callable(value) else ""
            names.append([name, kind or "object", None])
    return names


def _target(msg, module):
    if "n" in msg:
        return getattr(module, msg["n"])
    return _resolve(wire.Handle(msg["h"], "", ""))


def _serve_one(msg, module):
    op = msg["op"]
    obj = _target(msg, module)
    dec = lambda v: wire.decode(v, _resolve)  # noqa: E731
    if op == "call":
        args = [dec(a) for a in msg["args"]]
        kwargs = {k: dec(v) for k, v in msg["kwargs"]}
        out = {"ok": wire.encode(obj(*args, **kwargs), _register)}
        if msg.get("mut"):
            out["args"] = [wire.encode(a, _register) for a in args]
            out["kwargs"] = [[k, wire.encode(v, _register)] for k, v in kwargs.items()]
        return out
    if op == "getattr":
        return {"ok": wire.encode(getattr(obj, msg["name"]), _register)}
    if op == "iter":
        return {"ok": wire.encode(iter(obj), _register)}
    if op == "next":
        try:
            return {"ok": wire.encode(next(obj), _register)}
        except StopIteration:
            return {"end": True}  # the iterator's end, not an exception to rebuild
    if op == "len":
        return {"ok": wire.encode(len(obj))}
    if op == "getitem":
        return {"ok": wire.encode(obj[dec(msg["key"])], _register)}
    if op == "contains":
        return {"ok": wire.encode(dec(msg["key"]) in obj, _register)}
    raise ValueError(f"unknown operation {op!r}")


def _flush():
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def serve(call_fd, reply_fd):
    """Import solution.py from the working directory, then answer calls until the harness
    closes the channel."""
    sys.path.insert(0, os.getcwd())
    try:
        module, failure = _load()
        _flush()
        if failure is not None:
            wire.send(reply_fd, failure)
            return
        wire.send(reply_fd, {"ready": True, "names": _describe(module)})
        while True:
            try:
                msg = wire.recv(call_fd)
            except wire.ChannelClosed:
                return
            try:
                reply = _serve_one(msg, module)
            except BaseException as exc:
                reply = {"err": _error(exc, module)}
            reply["id"] = msg.get("id")
            _flush()
            try:
                wire.send(reply_fd, reply)
            except (TypeError, ValueError, RecursionError, wire.WireError) as exc:
                wire.send(reply_fd, {"id": msg.get("id"), "err": _error(exc, module)})
    finally:
        _flush()
