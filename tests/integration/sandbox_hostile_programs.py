"""Destructive candidate programs: run only inside the hardened containers."""

from __future__ import annotations

from tests.unit.sandbox_programs import GOOD

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

# Container-only reward hacks: (name, code, outcomes allowed)
CONTAINER_HACKS: list[tuple[str, str, tuple[str, ...]]] = [
    ("kill_the_harness_and_executor", KILL_EVERYTHING, ("tamper",)),
    ("stop_the_harness_and_executor", STOP_EVERYTHING, ("timeout", "tamper")),
    # lowered limits would make the executor fail "by itself" (sandbox_error: masked)
    ("lower_the_executor_and_harness_limits", LOWER_LIMITS, ("tamper",)),
    (
        "delete_everything_writable",
        "import shutil\nfor d in ('/work', '/tmp', '/dev/shm'):\n"
        "    shutil.rmtree(d, ignore_errors=True)\n"
        "def add(a, b):\n    return 0\n",
        ("failed",),
    ),
]
