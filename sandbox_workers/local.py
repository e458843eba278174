"""A `Runner` with NO isolation: the job server for one job, as a plain subprocess here.

For the benchmark's floor and for fast tests of the verdict logic with well-behaved or
reward-hacking (but not destructive) programs. Never feed it untrusted code: nothing stops
a fork bomb, a memory bomb or a background process here, and cleanup reaches only the
job's own sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from sandbox_workers.protocol import Execution

FILES: Final = Path(__file__).resolve().parent.parent / "deploy" / "sandbox" / "files"
BOOT: Final = f"import sys; sys.path.insert(0, {str(FILES)!r}); import jobserver; jobserver.entry()"
PYCACHE: Final = Path(tempfile.gettempdir()) / "rollstream-pycache"
"""Bytecode of the executor's modules (never next to them: that would change the image
recipe's hash)."""


class LocalRunner:
    """Runs up to `concurrency` executor jobs at once as local subprocesses."""

    image_digest = "local-unisolated"

    def __init__(self, concurrency: int = 2, grace_s: float = 10.0) -> None:
        self._sem = asyncio.Semaphore(concurrency)
        self.grace_s = grace_s

    async def execute(self, job: dict[str, Any], limit_s: float) -> Execution:
        async with self._sem:
            scratch = tempfile.mkdtemp(prefix="rollstream-local-")
            try:
                return await self._run(job, limit_s, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    async def _run(self, job: dict[str, Any], limit_s: float, scratch: str) -> Execution:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-X", f"pycache_prefix={PYCACHE}", "-I", "-S", "-c", BOOT,
            "--local", "--once", "--scratch", scratch,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(json.dumps(job).encode() + b"\n"), limit_s + self.grace_s
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return Execution(None, started=True, timed_out=True, where="local")
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        events = [json.loads(line) for line in out.splitlines() if line.startswith(b"{")]
        result = next((e for e in events if e.get("event") == "result"), None)
        rc = proc.returncode
        return Execution(
            result,
            started=any(e.get("event") == "started" for e in events),
            error="" if result else f"exit code {rc}: {err.decode('utf-8', 'replace')[-300:]}",
            killed=rc is not None and rc < 0,
            where="local",
        )

    async def close(self) -> None:
        return None
