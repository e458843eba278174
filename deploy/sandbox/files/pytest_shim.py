"""The small part of pytest's API that tests files commonly use, for the trusted harness.

`import pytest` in a tests file gets this module: raises (which matches the candidate's
exceptions by their declared type, remote.py), approx, fail, mark.parametrize
(each parameter set is one counted test, named like pytest's `test_x[0]`), mark.skip and
mark.skipif (the test is not collected), and any other mark as a no-op.
"""

import itertools
import math

import remote


class RaisesContext:
    def __init__(self, expected, match=None):
        self.expected, self.match, self.value, self.type = expected, match, None, None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            raise AssertionError(f"DID NOT RAISE {self.expected}")
        if not issubclass(exc_type, remote.catch(self.expected)):
            return False
        if self.match is not None and not __import__("re").search(self.match, str(exc)):
            raise AssertionError(f"{str(exc)!r} does not match {self.match!r}")
        self.value, self.type = exc, getattr(exc_type, "declared", exc_type)
        return True


def raises(expected, *args, match=None, **kwargs):
    """`with raises(E):` or `raises(E, fn, *args)`."""
    ctx = RaisesContext(expected, match)
    if not args:
        return ctx
    with ctx:
        args[0](*args[1:], **kwargs)
    return ctx


class _Approx:
    def __init__(self, expected, rel, abs_):
        self.expected, self.rel, self.abs = expected, rel, abs_

    def _close(self, a, b):
        if type(a) in (list, tuple) and type(b) in (list, tuple):
            return len(a) == len(b) and all(self._close(x, y) for x, y in zip(a, b, strict=True))
        if type(a) is dict and type(b) is dict:
            return a.keys() == b.keys() and all(self._close(a[k], b[k]) for k in a)
        if type(a) in (int, float, bool) and type(b) in (int, float, bool):
            if a == b:
                return True
            if math.isinf(a) or math.isinf(b):
                return False
            return abs(a - b) <= max(self.rel * abs(b), self.abs)
        return a == b

    def __eq__(self, other):
        return self._close(other, self.expected)

    __hash__ = None

    def __repr__(self):
        return f"approx({self.expected!r})"


def approx(expected, rel=None, abs=None):
    """Equal within rel (default 1e-6) or abs (default 1e-12) of the expected value."""
    return _Approx(expected, 1e-6 if rel is None else rel, 1e-12 if abs is None else abs)


def fail(reason=""):
    raise AssertionError(reason or "failed")


class _Mark:
    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, args, kwargs or {}

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            fn = args[0]
            fn.__dict__.setdefault("_rs_marks", []).append(self)
            return fn
        return _Mark(self.name, args, kwargs)


class _MarkGenerator:
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Mark(name)


mark = _MarkGenerator()


def skipped(fn):
    for m in getattr(fn, "_rs_marks", ()):
        if m.name == "skip" or (m.name == "skipif" and m.args and m.args[0]):
            return True
    return False


def parametrizations(fn):
    """[(id suffix, kwargs)] for a test function: one item unless parametrized."""
    axes = []
    for m in reversed(getattr(fn, "_rs_marks", ())):
        if m.name != "parametrize" or len(m.args) < 2:
            continue
        names, values = m.args[0], list(m.args[1])
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for v in values:
            v = getattr(v, "values", v)  # pytest.param(...) style objects
            rows.append(dict(zip(names, v if len(names) > 1 else (v,), strict=False)))
        axes.append(rows)
    if not axes:
        return [("", {})]
    out = []
    for n, combo in enumerate(itertools.product(*axes)):
        kwargs = {}
        for part in combo:
            kwargs.update(part)
        out.append((f"[{n}]", kwargs))
    return out


def param(*values, id=None, marks=()):
    class _P:
        pass

    p = _P()
    p.values = values
    return p
