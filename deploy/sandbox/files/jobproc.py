"""Process plumbing of the executor: rlimits, pipes with output caps, cgroup counters.

Standard library only (runs inside the sandbox image).
"""

import os
import resource
import select
import time

CGROUP_V1 = ("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/memory/memory.oom_control")
CGROUP_V2 = ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/memory.events")


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def counters():
    """(cpu seconds of the whole container, OOM kills so far) from its cgroup, or (None,
    None) where not readable (local mode)."""
    cpu, oom = None, None
    text = _read(CGROUP_V1[0]).strip()
    if text.isdigit():
        cpu = int(text) / 1e9
    for line in (_read(CGROUP_V2[0]) if cpu is None else "").splitlines():
        if line.startswith("usage_usec "):
            cpu = int(line.split()[1]) / 1e6
    for line in (_read(CGROUP_V1[1]) or _read(CGROUP_V2[1])).splitlines():
        if line.startswith("oom_kill "):
            oom = int(line.split()[1])
    return cpu, oom


def rlimits(job, container):
    """The candidate's rlimits from the job as [resource, soft, hard] (NPROC only where the
    uid is the job's own)."""
    cpu = int(job["timeout_s"]) + 1
    out = [
        (resource.RLIMIT_AS, job["memory_mb"] << 20, job["memory_mb"] << 20),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, job["fsize_mb"] << 20, job["fsize_mb"] << 20),
        (resource.RLIMIT_NOFILE, job["nofile"], job["nofile"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if container:
        out.append((resource.RLIMIT_NPROC, job["nproc"], job["nproc"]))
    return [list(x) for x in out]


def apply_rlimits(limits):
    for res, soft, hard in limits:
        resource.setrlimit(res, (soft, hard))


class Capture:
    """Keeps the first `keep` bytes of a stream and counts all of them."""

    def __init__(self, keep):
        self.keep, self.data, self.total = keep, bytearray(), 0

    def __call__(self, chunk):
        self.total += len(chunk)
        room = self.keep - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def truncated(self):
        return self.total > len(self.data)

    def text(self, limit=None):
        data = self.data if limit is None else self.data[:limit]
        return bytes(data).decode("utf-8", "replace")


class Feed:
    """Bytes written to a pipe (write end `fd`, owned here) as the reader allows."""

    def __init__(self, fd, data):
        self.fd, self.pending = fd, memoryview(data)
        os.set_blocking(fd, False)

    def write(self):
        """Write what fits; True when finished (the fd is then closed)."""
        try:
            n = os.write(self.fd, self.pending[: 1 << 16])
            self.pending = self.pending[n:]
        except BlockingIOError:
            return False
        except OSError:  # the reader is gone: the rest is dropped
            self.pending = self.pending[:0]
        if not self.pending:
            os.close(self.fd)
            self.fd = -1
            return True
        return False

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def pump(readers, deadline, output_limit=None, counted=(), feeds=(), stop=None):
    """Read every fd in `readers` ({fd: callback(bytes)}; b"" means EOF) until all reach
    EOF, `stop()` is true (what is already in the pipes is still read), the deadline
    passes, or the bytes read from the `counted` fds exceed output_limit; meanwhile write
    the `feeds`. Returns "eof", "stop", "deadline" or "output"."""
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    writing = {}
    for feed in feeds:
        if feed.pending:
            writing[feed.fd] = feed
            poller.register(feed.fd, select.POLLOUT)
        else:
            feed.close()
    state = {"open": set(readers), "total": 0}
    draining = 0
    try:
        while state["open"]:
            if draining == 0 and stop is not None and stop():
                draining = 1
            left = deadline - time.monotonic()
            if left <= 0:
                return "deadline"
            wait = 0 if draining else max(1, min(int(left * 1000), 200))
            events = poller.poll(wait)
            if draining and (not events or draining > 64):
                return "stop"
            draining += bool(draining)
            for fd, ev in events:
                if fd in writing:
                    if writing[fd].write():
                        poller.unregister(fd)
                        del writing[fd]
                elif _handle(fd, ev, readers, poller, state, counted, output_limit):
                    return "output"
        return "stop" if stop is not None and stop() else "eof"
    finally:
        for feed in feeds:
            feed.close()


def _handle(fd, ev, readers, poller, state, counted, output_limit):
    chunk = os.read(fd, 1 << 16) if ev & (select.POLLIN | select.POLLHUP | select.POLLERR) else b""
    readers[fd](chunk)
    if not chunk:
        poller.unregister(fd)
        state["open"].discard(fd)
        return False
    if fd in counted:
        state["total"] += len(chunk)
        return output_limit is not None and state["total"] > output_limit
    return False
