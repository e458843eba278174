"""Talking to the job server in a container, through the engine API's hijacked streams.

Two transports, one wire format (jobs in as JSON lines on the server's stdin, events out as
JSON lines on its stdout, multiplexed by the engine: 8-byte header of stream, 3 zero bytes,
big-endian size):

- `Session`: the long-lived attach stream of a container whose main process is the job
  server (the warm pool's default: no process is started per job);
- `run`: one `docker exec` of a one-shot server (`--once`) with the job on its stdin (the
  benchmark's comparison mode).

docker cp / put_archive cannot write into a tmpfs mount and an argv element is limited to
128 KiB, which is why jobs travel on stdin. Blocking; the pool runs these in threads.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

MAX_STDOUT = 8 << 20
"""The server's own reports are small; more than this is a broken server."""
MAX_STDERR = 64 << 10


@dataclass
class ExecRun:
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: bytes = b""
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""


def raw_socket(sock: Any) -> socket.socket:
    raw = getattr(sock, "_sock", sock)
    if not isinstance(raw, socket.socket):
        raise TypeError(f"unexpected attach socket {type(sock).__name__}")
    return raw


class Demux:
    """Splits the engine's multiplexed stream into stdout lines (JSON events) and a
    stderr tail."""

    def __init__(self) -> None:
        self.buf = b""
        self.stdout = b""
        self.stderr = b""
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while len(self.buf) >= 8:
            stream, size = self.buf[0], struct.unpack(">I", self.buf[4:8])[0]
            if len(self.buf) < 8 + size:
                return
            body, self.buf = self.buf[8 : 8 + size], self.buf[8 + size :]
            if stream == 1:
                self.total += len(body)
                if self.total > MAX_STDOUT:
                    raise OSError("the job server wrote more than expected")
                self.stdout += body
            elif len(self.stderr) < MAX_STDERR:
                self.stderr = (self.stderr + body)[-MAX_STDERR:]

    def events(self) -> list[dict[str, Any]]:
        """The complete lines so far, parsed; unreadable lines become `garbled` events."""
        *lines, self.stdout = self.stdout.split(b"\n")
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            out.append(event if isinstance(event, dict) else {"event": "garbled"})
        return out


class Session:
    """The attach stream of one job-server container."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper
        self.sock = raw_socket(wrapper)
        self.demux = Demux()
        self.pending: list[dict[str, Any]] = []
        self.closed = False

    def send(self, payload: bytes) -> None:
        self.sock.settimeout(30.0)
        self.sock.sendall(payload)

    def next_event(self, deadline: float) -> dict[str, Any] | None:
        """The next event; None when the stream ended; TimeoutError at the deadline."""
        while not self.pending:
            if self.closed:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                self.closed = True
                continue
            self.demux.feed(chunk)
            self.pending += self.demux.events()
        return self.pending.pop(0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.wrapper.close()


def run(
    api: Any, container_id: str, argv: list[str], user: str, payload: bytes, timeout_s: float
) -> ExecRun:
    """Run argv in the container as `user` with `payload` on stdin; parse its events."""
    out = ExecRun()
    deadline = time.monotonic() + timeout_s
    exec_id = api.exec_create(
        container_id, argv, stdin=True, stdout=True, stderr=True, user=user, workdir="/work"
    )["Id"]
    wrapper = api.exec_start(exec_id, socket=True)
    sock = raw_socket(wrapper)
    demux = Demux()
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            demux.feed(chunk)
    except TimeoutError:
        out.timed_out = True
    except OSError as exc:
        out.error = f"exec stream: {type(exc).__name__}: {exc}"
    finally:
        wrapper.close()
    demux.stdout += b"\n"
    out.events = demux.events()
    out.stderr = demux.stderr
    if not out.timed_out and not any(e.get("event") == "result" for e in out.events):
        try:
            out.exit_code = api.exec_inspect(exec_id).get("ExitCode")
        except Exception as exc:
            out.error = out.error or f"exec inspect: {type(exc).__name__}: {exc}"
    return out
