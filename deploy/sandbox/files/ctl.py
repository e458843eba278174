"""The control channel between the job server and a job's executor (deploy/sandbox/files).

A SOCK_SEQPACKET socket pair: every message is one JSON object, optionally carrying file
descriptors (SCM_RIGHTS). Both ends are trusted processes of the image; the candidate never
holds this socket. Standard library only.
"""

import array
import json
import socket

MAX_MESSAGE = 1 << 16
MAX_FDS = 16


def pair():
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock, obj, fds=()):
    data = json.dumps(obj, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock, flags=0):
    """(message, [fds]); (None, []) when the other end is closed. BlockingIOError with
    flags=socket.MSG_DONTWAIT when nothing is waiting."""
    # not socket.recv_fds: before Python 3.12 it ignores `flags`
    data, ancdata, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_LEN(MAX_FDS * 4), flags)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    fds = list(fds)
    if not data:
        return None, fds
    return json.loads(data), fds
