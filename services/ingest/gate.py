"""The gate in front of the API routes (an ASGI middleware): bearer-token auth, then the
body size limit, then the content type, in that order, so a caller without a valid token
learns nothing about the body rules and an oversized body is never parsed.

Tokens are compared in constant time: the presented token's SHA-256 against each
configured token's, every one of them compared (hmac.compare_digest), so neither the
position of a mismatch nor which token matched shows in the timing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTECTED = "/v1/"
"""Paths under this prefix need a token; /healthz and the docs do not."""


def digests(tokens: Iterable[str]) -> list[bytes]:
    return [hashlib.sha256(t.encode()).digest() for t in tokens]


def token_ok(presented: str, accepted: list[bytes]) -> bool:
    """Constant-time membership of `presented` in the accepted tokens' digests."""
    digest = hashlib.sha256(presented.encode()).digest()
    ok = False
    for candidate in accepted:
        ok |= hmac.compare_digest(digest, candidate)
    return ok


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    vendor = media.startswith("application/") and media.endswith("+json")
    return media == "application/json" or vendor


class Gate:
    def __init__(self, app: ASGIApp, tokens: list[bytes], max_body_bytes: int) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(PROTECTED):
            await self.app(scope, receive, send)
            return
        headers = list(scope.get("headers") or [])
        presented = bearer(headers)
        if presented is None:
            why = "missing bearer token: send the header `Authorization: Bearer <token>`"
            await _reject(send, 401, why, auth=True)
            return
        if not token_ok(presented, self.tokens):
            why = "invalid bearer token: use one of the tokens configured for this gateway"
            await _reject(send, 401, why, auth=True)
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        await self._body(scope, receive, send, dict(headers))

    async def _body(
        self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, bytes]
    ) -> None:
        limit = self.max_body
        too_big = f"request body over {limit} bytes (ingest.max_body_bytes): send less"
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > limit:
            await _reject(send, 413, too_big)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await _reject(send, 413, too_big)
                return
            if not message.get("more_body", False):
                break
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        if not is_json(content_type):
            why = f"content type {content_type or '(none)'!r}: send application/json"
            await _reject(send, 415, why)
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def inner() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner


async def _reject(send: Send, status: int, why: str, auth: bool = False) -> None:
    from services.ingest.metrics import REFUSED

    REFUSED.labels(str(status)).inc()
    body = json.dumps({"error": why, "problems": []}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth:
        headers.append((b"www-authenticate", b'Bearer realm="rollstream-ingest"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
