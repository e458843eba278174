"""Privilege handling of the job server (standard library only, runs inside the image).

The server runs as root in the container with CAP_SETUID, CAP_SETGID and CAP_SETPCAP and
nothing else (hardening.py). Every process it starts for a job drops all of that for good:
`become` clears the capability bounding set, sets no_new_privs, and switches every uid and
gid to one unprivileged id, so permitted and effective capabilities are gone as well.

Killing a job's processes: `reap_uid` forks a killer whose real and saved uid are the
container's killer uid and whose effective uid is the job's. kill(2) lets it signal every
process of the job uid (kill(-1) reaches all of them at once, a fork bomb included), while
no process of the job can signal the killer back (the kernel compares the sender's ids with
the target's real and saved uid, which are not the job's).
"""

import contextlib
import errno
import os
import signal
import time

import scrub

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_LAST = 63
_libc = []


def _prctl(option, arg):
    import ctypes  # only where privileges are dropped (not in local mode): it is slow to import

    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    if _libc[0].prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg}): {os.strerror(err)}")


def set_nondumpable():
    """No ptrace, no /proc/<pid>/mem or /fd for other processes (prctl(2))."""
    _prctl(PR_SET_DUMPABLE, 0)


def no_new_privs():
    _prctl(PR_SET_NO_NEW_PRIVS, 1)


def drop_bounding_set():
    """Empty the capability bounding set (needs CAP_SETPCAP; EINVAL past the last cap).
    Only the capabilities still in it are dropped (the server's three, in a container)."""
    held = capabilities().get("CapBnd", (1 << (CAP_LAST + 1)) - 1)
    for cap in range(CAP_LAST + 1):
        if not held >> cap & 1:
            continue
        try:
            _prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise


def capabilities():
    """{field: hex mask} of CapInh/CapPrm/CapEff/CapBnd/CapAmb of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.startswith("Cap"):
                out[key] = int(value.strip(), 16)
    return out


def become(uid, real=None):
    """Drop to `uid` for good: no capabilities (bounding set cleared), no_new_privs, no
    supplementary groups. `real`: a different real and saved uid (the killer's), so that
    processes of `uid` cannot signal this one."""
    drop_bounding_set()
    keep = uid if real is None else real
    os.setgroups([])
    os.setresgid(keep, keep, keep)
    os.setresuid(keep, uid, keep)
    no_new_privs()
    caps = capabilities()
    if any(caps.get(k) for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb", "CapInh")):
        raise OSError(errno.EPERM, f"capabilities left after the switch: {caps}")
    if os.geteuid() != uid or 0 in os.getresuid() or 0 in os.getresgid():
        raise OSError(errno.EPERM, "the uid switch did not take")


def _status_fields(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "State"):
            fields[key] = value.split()
    return fields


def live_pids_of(uid):
    """Processes (not zombies) with `uid` among their real/effective/saved/fs uids."""
    me, out = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        fields = _status_fields(name)
        if fields and str(uid) in fields.get("Uid", []) and fields.get("State", ["?"])[0] != "Z":
            out.append(int(name))
    return out


def _killer(target, killer_uid, dirs, budget_s):
    """Body of the killer process: kill every process of `target`, then wipe `dirs`."""
    become(target, real=killer_uid)
    deadline = time.monotonic() + budget_s
    gone = False
    for n in range(2000):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        if not live_pids_of(target):
            gone = True
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.0005 * min(n, 20))
    clean = scrub.wipe(dirs, deadline) if gone and dirs else gone
    return 0 if clean else 1


def reap_uid(target, killer_uid, dirs=(), budget_s=10.0, here=False):
    """Kill every process of `target` and wipe what it left in `dirs`; True when none is
    left and the directories are empty. Needs CAP_SETUID/SETGID/SETPCAP (the server's).
    `here`: this process becomes the killer instead of forking one, and keeps no privilege
    afterwards (the executor's last reap of a job: one process fewer per job)."""
    if here:
        try:
            return _killer(target, killer_uid, dirs, budget_s) == 0
        except Exception:
            return False
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = _killer(target, killer_uid, dirs, budget_s)
        except BaseException:
            code = 71
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
