"""re.fullmatch with a time limit: the match runs in a helper process that is killed when
it takes too long (Python's `re` cannot be interrupted, and a thread cannot be killed).

One helper per guard, started on first use, serving one match at a time over JSON lines;
address space capped at 512 MiB; restarted after a timeout or a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Final

HELPER: Final = r"""
import json, re, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
for line in sys.stdin:
    req = json.loads(line)
    try:
        out = {"ok": re.fullmatch(req["p"], req["s"]) is not None}
    except re.error as exc:
        out = {"err": f"invalid pattern: {exc}"}
    except (MemoryError, RecursionError, OverflowError) as exc:
        out = {"err": f"pattern cannot be matched: {type(exc).__name__}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
"""


class RegexGuard:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def _helper(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", HELPER,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, limit=1 << 16,
            )  # fmt: skip
        return self._proc

    async def fullmatch(self, pattern: str, text: str, timeout_s: float) -> bool:
        """True/False; TimeoutError after timeout_s; ValueError for a bad pattern."""
        async with self._lock:
            proc = await self._helper()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps({"p": pattern, "s": text}) + "\n").encode())
                await proc.stdin.drain()
                line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
            except (TimeoutError, ConnectionError) as exc:
                await self._kill()
                if isinstance(exc, TimeoutError):
                    raise
                raise ValueError("the regex helper died") from exc
            if not line:
                await self._kill()
                raise ValueError("the regex helper died (pattern too costly?)")
            reply = json.loads(line)
            if "err" in reply:
                raise ValueError(str(reply["err"]))
            return bool(reply["ok"])

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def close(self) -> None:
        async with self._lock:
            await self._kill()
