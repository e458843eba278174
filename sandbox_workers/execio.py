"""`docker exec` with the job on stdin, through the engine API's hijacked connection.

docker cp / put_archive cannot write into a tmpfs mount, and an argv element is limited to
128 KiB, so the job travels on the exec's stdin: write it all, half-close, then read the
multiplexed stdout/stderr frames (8-byte header: stream, 3 zero bytes, big-endian size)
until EOF or the deadline. Blocking; the pool runs it in a thread.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

MAX_STDOUT = 8 << 20
"""The executor's own report is small; more than this is a broken executor."""
MAX_STDERR = 64 << 10


@dataclass
class ExecRun:
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: bytes = b""
    exit_code: int | None = None
    timed_out: bool = False
    error: str = ""


def _raw_socket(sock: Any) -> socket.socket:
    raw = getattr(sock, "_sock", sock)
    if not isinstance(raw, socket.socket):
        raise TypeError(f"unexpected exec socket {type(sock).__name__}")
    return raw


def run(
    api: Any,
    container_id: str,
    argv: list[str],
    user: str,
    payload: bytes,
    timeout_s: float,
) -> ExecRun:
    """Run argv in the container as `user` with `payload` on stdin; parse JSON lines."""
    out = ExecRun()
    deadline = time.monotonic() + timeout_s
    exec_id = api.exec_create(
        container_id, argv, stdin=True, stdout=True, stderr=True, user=user, workdir="/work"
    )["Id"]
    wrapper = api.exec_start(exec_id, socket=True)
    sock = _raw_socket(wrapper)
    stdout = bytearray()
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        _read_frames(sock, deadline, stdout, out)
    except TimeoutError:
        out.timed_out = True
    except OSError as exc:
        out.error = f"exec stream: {type(exc).__name__}: {exc}"
    finally:
        wrapper.close()
    out.events = _parse(bytes(stdout), out)
    reported = any(e.get("event") == "result" for e in out.events)
    if not out.timed_out and not reported:  # the exit code only matters without a report
        try:
            out.exit_code = api.exec_inspect(exec_id).get("ExitCode")
        except Exception as exc:
            out.error = out.error or f"exec inspect: {type(exc).__name__}: {exc}"
    return out


def _read_frames(sock: socket.socket, deadline: float, stdout: bytearray, out: ExecRun) -> None:
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(1 << 16)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 8:
            stream, size = buf[0], struct.unpack(">I", buf[4:8])[0]
            if len(buf) < 8 + size:
                break
            body, buf = buf[8 : 8 + size], buf[8 + size :]
            if stream == 1:
                stdout += body
                if len(stdout) > MAX_STDOUT:
                    raise OSError("the executor wrote more than expected")
            elif len(out.stderr) < MAX_STDERR:
                out.stderr += body[: MAX_STDERR - len(out.stderr)]


def _parse(data: bytes, out: ExecRun) -> list[dict[str, Any]]:
    events = []
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            out.error = out.error or f"unreadable executor output: {line[:200]!r}"
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
