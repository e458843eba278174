"""Wiping a job's writable directories without recursion (standard library only).

A candidate may leave a tree far deeper than Python's recursion limit or PATH_MAX, with
directories it made unreadable. `wipe` walks it iteratively through directory file
descriptors (one open at a time, names kept on an explicit stack), never follows a symlink,
makes its own directories searchable again, and gives up at a deadline. It runs as the
owner of what it removes, after every process of that owner is dead, so nothing moves
under it.
"""

import os
import stat
import time

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name, dir_fd):
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)  # ours: make it listable again
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _is_dir(name, dir_fd):
    return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)


def _empty(top, deadline):
    """Remove everything inside the directory `top` (a path); False on failure or timeout."""
    fd = os.open(top, _DIR_FLAGS)
    stack = [os.listdir(fd)]  # names still to remove, one list per open level
    try:
        while stack:
            if time.monotonic() > deadline:
                return False
            names = stack[-1]
            if not names:
                stack.pop()
                if not stack:
                    return True
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(stack[-1].pop(), dir_fd=fd)  # the child we just emptied
                continue
            name = names[-1]
            if not _is_dir(name, fd):
                os.unlink(name, dir_fd=fd)
                names.pop()
                continue
            try:
                os.rmdir(name, dir_fd=fd)
                names.pop()
                continue
            except OSError:
                pass
            child = _open_dir(name, fd)
            os.close(fd)
            fd = child
            os.fchmod(fd, 0o700)  # ours: writable again, so its entries can go
            stack.append(os.listdir(fd))
        return True
    finally:
        os.close(fd)


def wipe(dirs, deadline=None):
    """Empty every directory in `dirs`; True when all of them end up empty."""
    deadline = time.monotonic() + 10.0 if deadline is None else deadline
    clean = True
    for d in dirs:
        try:
            clean = _empty(d, deadline) and not os.listdir(d) and clean
        except (OSError, ValueError):
            clean = False
    return clean
