"""Runs the candidate's program (solution.py in the working directory) as __main__.

Called in the candidate's process (forked by the job server, already under the candidate's
uid and limits) with STATUS_FD: before any candidate code runs, writes "ok" (or
"compile:<reason>") on it; if an exception escapes the program, adds "exc:<type name>".
The descriptor is the candidate's to scribble on afterwards, which can only change how its
own failure is labelled: the pass/fail verdict is the executor's comparison of the output.
"""

import atexit
import builtins
import contextlib
import os
import sys
import traceback
import types

if not hasattr(builtins, "exit"):  # run with -S (no site): keep exit() and quit()
    builtins.exit = builtins.quit = sys.exit

STATUS_FD = 4


def _status(text):
    with contextlib.suppress(OSError):
        os.write(STATUS_FD, text.encode("utf-8", "replace")[:4000])


def main():
    path = os.path.join(os.getcwd(), "solution.py")
    with open(path, "rb") as f:
        source = f.read()
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None)
        _status(f"compile:{f'line {line}: ' if line else ''}{getattr(exc, 'msg', None) or exc}\n")
        return 1
    _status("ok\n")
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        _status(f"exc:{type(exc).__name__}\n")
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    return 0


def _flush():
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def run(status_fd):
    """The exit status of the program, as `python3 solution.py` would give it."""
    global STATUS_FD
    STATUS_FD = status_fd
    os.set_inheritable(status_fd, False)
    try:
        code = main()
    except SystemExit as exc:
        code = _exit_code(exc.code)
    with contextlib.suppress(BaseException):  # as at interpreter exit: threads, then atexit
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        atexit._run_exitfuncs()
    _flush()
    return code


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1
