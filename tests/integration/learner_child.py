"""A learner process for the kill tests: `python learner_child.py [--slow-publish N] KEY=VALUE...`

Runs `services.learner_service.run_service` with the settings overrides given, logging to stderr.
With ``--slow-publish N`` the N-th weight publication (1-based) of this process writes
half of its blob, prints ``HALF-WRITTEN <version>`` on stdout and then stalls, so a test
can SIGKILL it in the middle of a publication.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from learner import weights
from services.learner_service import run_service
from services.settings import load


class _SlowRedisClient:
    """Proxy of a redis client whose pipelines stall after their first execute()."""

    def __init__(self, inner: Any, version: int) -> None:
        self._inner, self._version = inner, version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._inner.pipeline(*args, **kwargs)
        real = pipe.execute
        version = self._version

        def execute() -> Any:
            out = real()
            print(f"HALF-WRITTEN {version}", flush=True)
            time.sleep(3600)
            return out

        pipe.execute = execute
        return pipe


def _slow_write(version: int) -> Any:
    """`weights.write_state` that streams half of the blob into the store's temporary file,
    then stalls."""
    real = weights.write_state

    def write(f: Any, state: Mapping[str, Tensor], metadata: Any = None) -> tuple[str, int]:
        whole = io.BytesIO()
        real(whole, state, metadata)
        data = whole.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        print(f"HALF-WRITTEN {version}", flush=True)
        time.sleep(3600)
        raise AssertionError("unreachable")

    return write


class SlowNth:
    def __init__(self, inner: Any, nth: int) -> None:
        self.inner, self.nth, self.calls = inner, nth, 0

    def put(self, version: int, state: Mapping[str, Tensor]) -> weights.StoredWeights:
        self.calls += 1
        if self.calls == self.nth:
            if isinstance(self.inner, weights.RedisWeightStore):
                self.inner.chunk_bytes = 4096  # many chunks: the first pipeline is partial
                self.inner.r = _SlowRedisClient(self.inner.r, version)
            else:
                weights.write_state = _slow_write(version)  # type: ignore[assignment]
        return self.inner.put(version, state)  # type: ignore[no-any-return]

    def get(self, uri: str, sha256: str) -> dict[str, Tensor]:
        return self.inner.get(uri, sha256)  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-publish", type=int, default=0)
    parser.add_argument("--idle-exit", type=float, default=None)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    settings = load(args.overrides)
    hook = (lambda s: SlowNth(s, args.slow_publish)) if args.slow_publish else None
    summary = asyncio.run(
        run_service(
            settings, idle_exit_s=args.idle_exit, max_seconds=args.max_seconds, store_hook=hook
        )
    )
    print(f"DONE steps={summary.steps} version={summary.version} {summary.counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
