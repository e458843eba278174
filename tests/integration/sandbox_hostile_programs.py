"""Destructive candidate programs: run only inside the hardened containers."""

from __future__ import annotations

from tests.unit.sandbox_programs import GOOD, WRONG

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

MEMORY_BOMB = "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))\n"

OOM_BOMB = """
import os, time
for _ in range(12):  # each child stays under its own address-space limit; together they do not
    if os.fork() == 0:
        blob = bytearray(200 << 20)
        for i in range(0, len(blob), 4096):
            blob[i] = 1
        time.sleep(60)
        os._exit(0)
os.wait()  # returns when the OOM killer has taken one of them
"""

INFINITE_LOOP = "while True:\n    pass\n"

THREAD_SPIN = """
import threading
def spin():
    while True:
        pass
worker = threading.Thread(target=spin, daemon=True)
worker.start()
def add(a, b):
    worker.join()
"""

STDOUT_1GB = (
    """
import sys
chunk = "x" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)
"""
    + GOOD
)

FILL_TMPFS = (
    """
import os
total = 0
for d in ("/work", "/tmp", "/dev/shm"):
    for i in range(1000):
        try:
            with open(f"{d}/fill{i}", "wb") as f:
                for _ in range(16):
                    f.write(b"\\0" * (1 << 20))
                    total += 1 << 20
        except OSError:
            break
print("wrote", total >> 20)
"""
    + GOOD
)

NETWORK = (
    """
import socket
for host, port in (("127.0.0.1", 9092), ("127.0.0.1", 6379), ("10.0.0.1", 80),
                   ("172.17.0.1", 2375), ("8.8.8.8", 53)):
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("CONNECTED", host, port)
    except OSError as e:
        print("blocked", host, port, type(e).__name__)
"""
    + GOOD
)

SECRETS = (
    """
import os
for path in ("/etc/shadow", "/var/run/docker.sock", "/run/docker.sock", "/proc/1/environ",
             "/proc/1/mem", "/sys/fs/cgroup/memory/memory.limit_in_bytes.w"):
    try:
        with open(path, "rb") as f:
            f.read(64)
        print("READ", path)
    except OSError as e:
        print("denied", path, type(e).__name__)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        for name in ("mem", "environ", "fd/0", "fd/1", "fd/3", "fd/4", "fd/5"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    f.read(16)
                print("READ", pid, name)
            except OSError:
                pass
        if libc.ptrace(16, int(pid), 0, 0) == 0:  # PTRACE_ATTACH
            print("READ by ptrace", pid)
"""
    + GOOD
)

LOWER_LIMITS = (
    """
import os, resource
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            resource.prlimit(int(pid), resource.RLIMIT_NOFILE, (3, 3))
        except OSError:
            pass
"""
    + GOOD
)

SURVIVOR = (
    """
import os, subprocess, sys
code = '''
import os, time
os.setsid()
if os.fork():
    os._exit(0)
for n in range(100000):
    with open("/tmp/survivor.txt", "w") as f:
        f.write(str(n))
    time.sleep(0.05)
'''
subprocess.Popen([sys.executable, "-c", code, "bg-survivor-marker"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""
    + GOOD
)

LOOK_FOR_SURVIVOR = (
    """
import os, time
time.sleep(0.3)
found = []
for pid in os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"bg-survivor-marker" in f.read():
                found.append(pid)
    except OSError:
        pass
print("survivors", found, "file", os.path.exists("/tmp/survivor.txt"))
"""
    + GOOD
)

KILL_EVERYTHING = (
    """
import os, signal
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
"""
    + GOOD
)

STOP_EVERYTHING = KILL_EVERYTHING.replace("SIGKILL", "SIGSTOP")

# Container-only reward hacks on the verdict channel, each with a wrong `add`, so only a
# working attack could pass: (name, code, outcomes allowed). With the job server the
# candidate cannot signal, stop or limit the server, the executor or the harness (other
# uids), so the attack does nothing and the honest verdict stands.
CONTAINER_HACKS: list[tuple[str, str, tuple[str, ...]]] = [
    ("kill_the_harness_and_executor", KILL_EVERYTHING.replace(GOOD, WRONG), ("failed",)),
    ("stop_the_harness_and_executor", STOP_EVERYTHING.replace(GOOD, WRONG), ("failed",)),
    # lowered limits would make the executor fail "by itself" (sandbox_error: masked)
    ("lower_the_executor_and_harness_limits", LOWER_LIMITS.replace(GOOD, WRONG), ("failed",)),
    (
        "delete_everything_writable",
        "import shutil\nfor d in ('/work', '/tmp', '/dev/shm'):\n"
        "    shutil.rmtree(d, ignore_errors=True)\n"
        "def add(a, b):\n    return 0\n",
        ("failed",),
    ),
]

# The same attacks with a correct `add`: they must not disturb an honest pass either.
HARMLESS_ATTACKS = [("kill", KILL_EVERYTHING), ("stop", STOP_EVERYTHING), ("limits", LOWER_LIMITS)]

# Issue 12, hole 2: lower the harness's limits so that it fails "by itself", restore them
# before the executor compares its snapshots. Only the harness (a sibling under the old
# executor) is targeted; the tests are a task whose top level allocates.
LOWER_THEN_RESTORE = """
import os, resource
_saved = {}

def _siblings():
    me, parent = os.getpid(), os.getppid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields["PPid"]) == parent:
            yield int(pid), int(fields.get("VmSize", "0 kB").split()[0]) << 10

def _lower():
    for pid, size in _siblings():
        try:
            _saved[pid] = resource.prlimit(pid, resource.RLIMIT_AS)
            resource.prlimit(pid, resource.RLIMIT_AS, (size, _saved[pid][1]))
        except OSError:
            pass

def _restore():
    for pid, limit in _saved.items():
        try:
            resource.prlimit(pid, resource.RLIMIT_AS, limit)
        except OSError:
            pass

_calls = []

def add(a, b):
    _calls.append(1)
    (_lower if len(_calls) == 1 else _restore)()
    return a - b
"""
ALLOCATING_TESTS = """
from solution import add

add(0, 0)  # the candidate lowers the harness's limits here,
try:
    TABLE = bytearray(64 << 20)  # so this fails in the harness "by itself",
finally:
    add(0, 0)  # and the limits are back before anyone compares them

def test_add():
    assert add(1, 2) == 3
"""

# Issue 12, hole 5: a tree deeper than the recursion limit and PATH_MAX in /tmp; every case
# first reports what an earlier case left behind (the right answer only if nothing).
DEEP_TREE = """
import os, sys
mine = os.path.basename(os.getcwd())
left = sorted(set(os.listdir("/tmp")) | {n for n in os.listdir("/work") if n != mine})
fd = os.open("/tmp", os.O_RDONLY)
for _ in range(3000):
    os.mkdir("d", dir_fd=fd)
    nd = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nd
os.chmod(".", 0, dir_fd=fd)
print("LEFTOVERS " + " ".join(left) if left else sys.stdin.read().strip())
"""

# What the candidate can see of its own privileges and of the other processes.
FACTS = (
    """
import os, resource, signal
def status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict((k, v.strip()) for k, _, v in (ln.partition(":") for ln in f))
me = status("self")
print("uid", os.getuid(), "euid", os.geteuid(), "nnp", me["NoNewPrivs"],
      "caps", *(me[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")))
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        uids = status(pid)["Uid"].split()
    except OSError:
        continue
    reach = []
    for name, probe in (("signal", lambda p: os.kill(p, 0)),
                        ("limits", lambda p: resource.prlimit(p, resource.RLIMIT_NOFILE))):
        try:
            probe(int(pid))
            reach.append(name)
        except OSError:
            pass
    print("other", pid, uids[0], *reach)
"""
    + GOOD
)
