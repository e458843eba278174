"""Runs the candidate's program (solution.py in the working directory) as __main__.

argv: STATUS_FD. Before any candidate code runs, writes "ok" (or "compile:<reason>") on
that descriptor; if an exception escapes the program, adds "exc:<type name>". The
descriptor is the candidate's to scribble on afterwards, which can only change how its own
failure is labelled: the pass/fail verdict is the executor's comparison of the output.
"""

import builtins
import contextlib
import os
import sys
import traceback
import types

if not hasattr(builtins, "exit"):  # run with -S (no site): keep exit() and quit()
    builtins.exit = builtins.quit = sys.exit

STATUS_FD = int(sys.argv[1])
os.set_inheritable(STATUS_FD, False)


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
    sys.path.insert(0, os.getcwd())
    try:
        exec(code, module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        _status(f"exc:{type(exc).__name__}\n")
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
