"""The harness's view of the candidate's process: proxies, calls, and its exceptions.

Everything the candidate sends arrives as plain data (wire.py). Its exceptions are rebuilt
as instances of `Remote` classes that mirror the builtin hierarchy (Remote[IndexError]
derives from Remote[LookupError] ... from Remote[BaseException]; the mirrors of Exception's
subclasses also derive from Exception) but are never instances of a builtin exception. So
no implicit control flow of the interpreter can take them for its own signals: a
candidate's StopIteration cannot end a `map`, `all` or `for`, a GeneratorExit cannot close
a generator, a SystemExit or KeyboardInterrupt cannot end a test. Only an explicit
`except X` (the harness compiles every except clause of the tests through `catch`) or
`pytest.raises(X)` naming the declared type or one of its bases matches them.
"""

import builtins

import wire

BUILTIN_EXC = frozenset(
    v for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException)
)


class Remote(BaseException):
    """An exception raised by the candidate's code; `declared` is its builtin type."""

    declared = BaseException

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class RemoteDied(Remote):
    """The candidate's process is gone or broke the protocol; every later call fails, and
    every test that runs from then on fails whatever it catches."""


_MIRROR = {BaseException: Remote}


def remote_class(cls):
    """The Remote mirror of a builtin exception class."""
    mirror = _MIRROR.get(cls)
    if mirror is None:
        bases = tuple(remote_class(b) for b in cls.__bases__ if issubclass(b, BaseException))
        extra = (Exception,) if cls is Exception else ()
        mirror = type(cls.__name__, bases + extra, {"declared": cls, "__module__": "solution"})
        _MIRROR[cls] = mirror
    return mirror


def _flatten(spec):
    if type(spec) is tuple:
        for item in spec:
            yield from _flatten(item)
    else:
        yield spec


def catch(spec):
    """What an `except spec:` clause of the tests matches: spec, plus the mirrors of the
    builtin exception classes it names."""
    items = list(_flatten(spec))
    extra = tuple(remote_class(c) for c in items if c in BUILTIN_EXC)
    return (*items, *extra) if extra else spec


def make_exception(err, local_exceptions):
    """The Remote instance for an error the candidate's process reported."""
    if type(err) is not dict:
        return Remote("the candidate raised something unreadable")
    tname, base = str(err.get("type"))[:100], str(err.get("base"))[:100]
    msg, local = str(err.get("msg"))[:2000], err.get("local")
    if type(local) is str and local in local_exceptions:
        return local_exceptions[local](msg)
    cls = vars(builtins).get(base)
    cls = cls if cls in BUILTIN_EXC else Exception
    exc = remote_class(cls)(msg)
    exc.remote_type = tname
    return exc


def local_exception_class(name, base):
    """The class standing for an exception class the candidate's module defines."""
    cls = vars(builtins).get(base) if type(base) is str else None
    cls = cls if cls in BUILTIN_EXC else Exception
    return type(name, (remote_class(cls),), {"__module__": "solution"})


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
        value, reply = self._c.request_full({"op": "next", **self._t})
        if reply.get("end") is True:
            raise StopIteration  # the protocol's end of this iterator, not a rebuilt one
        return value

    def __len__(self):
        try:
            n = self._c.request({"op": "len", **self._t})
        except remote_class(TypeError) as exc:  # no len(): a plain TypeError, so that
            raise TypeError(str(exc)) from None  # list() & co. take it as "no length hint"
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


def safe_next(it, *default):
    """`next` as the tests see it: an exhausted candidate iterator raises the mirror of
    StopIteration, so a `next()` inside a `map` or a lambda cannot end an outer loop."""
    if not isinstance(it, Proxy):
        return builtins.next(it, *default)
    try:
        return type(it).__next__(it)
    except StopIteration:
        if default:
            return default[0]
        raise remote_class(StopIteration)("the candidate's iterator is exhausted") from None


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

    def _die(self, why):
        self.dead = self.dead or why
        return RemoteDied(self.dead)

    def recv(self):
        try:
            return wire.recv(self.reply_r)
        except wire.WireError as exc:
            closed = isinstance(exc, wire.ChannelClosed)
            raise self._die(
                f"the solution process {'exited' if closed else 'broke the protocol'}"
            ) from None

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
            raise self._die("the solution process exited") from None
        reply = self.recv()
        if type(reply) is not dict or reply.get("id") != self.next_id:
            raise self._die("the solution process broke the protocol")
        if "err" in reply:
            self.failures += 1
            raise make_exception(reply["err"], self.local_exceptions)
        if reply.get("end") is True and msg["op"] != "next":
            raise self._die("the solution process broke the protocol")
        return self.decode(reply.get("ok")), reply

    def decode(self, tree):
        try:
            return wire.decode(tree, self._proxy)
        except wire.WireError:
            raise self._die("the solution process broke the protocol") from None

    def call(self, target, args, kwargs):
        mutable = (list, dict, set, bytearray)
        msg = {"op": "call", **target, "args": [self.enc(a) for a in args],
               "kwargs": [[str(k), self.enc(v)] for k, v in kwargs.items()]}  # fmt: skip
        mut = any(type(a) in mutable for a in (*args, *kwargs.values()))
        if mut:
            msg["mut"] = True
        value, reply = self.request_full(msg)
        if mut:
            try:
                _copy_back(args, [self.decode(a) for a in as_list(reply.get("args"))])
                after = {k: self.decode(v) for k, v in as_list(reply.get("kwargs"))}
            except (TypeError, ValueError):
                raise self._die("the solution process broke the protocol") from None
            for k, v in kwargs.items():
                if k in after:
                    _copy_back([v], [after[k]])
        return value


def as_list(x):
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
