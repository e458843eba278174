"""Encode+decode throughput of a realistic trajectory, four ways, side by side.

    .venv/bin/python benchmarks/codec.py [--tokens 2048] [--repeats 15]

A trajectory of --tokens completion tokens (plus a 512-token prompt) with per-token
behaviour logprobs and policy versions, chat messages and a python_tests verifier:

- rollstream codec: msgspec structs, packed arrays, validated decode (schemas/codec.py)
- msgpack + dict, packed arrays: the same map, written and read with the `msgpack`
  package (no validation)
- msgpack + dict, lists: what a naive producer sends, token ids and logprobs as lists
- JSON (stdlib) + dict, lists

Each row times encode and decode separately; every figure is the median over --repeats
runs of a batch sized to take about 0.1 s. Ratios are against the rollstream codec.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas import arrays, codec
from schemas.messages import ChatMessage, Trajectory, VerifierSpec


def make_trajectory(tokens: int, prompt_tokens: int = 512) -> Trajectory:
    rng = random.Random(7)
    completion = "".join(rng.choice("abcdefghij (){}:=\n    ") for _ in range(tokens * 3))
    return Trajectory(
        task_id="mbpp/123",
        suite="mbpp",
        group_id="0190d7a2-5b1e-7c3a-9f00-3c1d2e4f5a6b",
        group_size=8,
        index=5,
        messages=[
            ChatMessage(role="system", content="You are a careful Python programmer." * 4),
            ChatMessage(role="user", content="Write a function that ... " * 60),
            ChatMessage(role="assistant", content=completion),
        ],
        prompt_tokens=arrays.pack_i32([rng.randrange(150_000) for _ in range(prompt_tokens)]),
        completion_tokens=arrays.pack_i32([rng.randrange(150_000) for _ in range(tokens)]),
        behaviour_logprobs=arrays.pack_f32([-rng.expovariate(2.0) for _ in range(tokens)]),
        policy_versions=arrays.pack_i32([41] * (tokens // 2) + [42] * (tokens - tokens // 2)),
        policy_version=41,
        generator_id="gen-3",
        verifier=VerifierSpec(
            name="python_tests", tests="def test_a():\n    assert f(1) == 2\n" * 20
        ),
        completion=completion,
        turns=1,
        finish_reason="stop",
    )


def as_lists(traj: Trajectory) -> dict[str, Any]:
    """The naive producer's map: numbers as lists instead of packed bytes."""
    out = msgspec.to_builtins(traj, builtin_types=(bytes,))
    out["prompt_tokens"] = list(arrays.unpack_i32(traj.prompt_tokens))
    out["completion_tokens"] = list(arrays.unpack_i32(traj.completion_tokens))
    out["behaviour_logprobs"] = list(arrays.unpack_f32(traj.behaviour_logprobs or b""))
    out["policy_versions"] = list(arrays.unpack_i32(traj.policy_versions))
    return dict(out)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds per call over `repeats` batches of ~0.1 s each."""
    batch, start = 1, time.perf_counter()
    while time.perf_counter() - start < 0.02 and batch < 1 << 20:
        fn()
        batch += 1
    per_call = (time.perf_counter() - start) / batch
    batch = max(1, int(0.1 / max(per_call, 1e-9)))
    samples = []
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            samples.append((time.perf_counter() - t0) / batch)
        finally:
            gc.enable()
    return statistics.median(samples)


def variants(traj: Trajectory) -> list[tuple[str, Callable[[], bytes], Callable[[bytes], Any]]]:
    packed_map = msgspec.to_builtins(traj, builtin_types=(bytes,))
    list_map = as_lists(traj)
    return [
        (
            "rollstream codec (msgspec, packed)",
            lambda: codec.encode(traj),
            lambda b: codec.decode(b, Trajectory),
        ),
        ("msgpack + dict, packed arrays", lambda: msgpack.packb(packed_map), msgpack.unpackb),
        ("msgpack + dict, lists", lambda: msgpack.packb(list_map), msgpack.unpackb),
        ("JSON (stdlib) + dict, lists", lambda: json.dumps(list_map).encode(), json.loads),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    traj = make_trajectory(args.tokens)
    assert codec.decode(codec.encode(traj), Trajectory) == traj

    rows = []
    for name, enc, dec in variants(traj):
        data = enc()
        t_enc = timed(enc, args.repeats)
        t_dec = timed(lambda dec=dec, data=data: dec(data), args.repeats)
        rows.append((name, len(data), t_enc, t_dec))

    print(
        f"trajectory: {args.tokens} completion + 512 prompt tokens, logprobs, versions; "
        f"median of {args.repeats} repeats"
    )
    print(
        f"python {platform.python_version()}, msgspec {msgspec.__version__}, "
        f"msgpack {'.'.join(map(str, msgpack.version))}, {platform.machine()}"
    )
    base = rows[0][2] + rows[0][3]
    columns = ("bytes", "enc us", "dec us", "rt us", "rt/s", "MB/s", "x slower")
    header = f"{'format':<36}" + "".join(f" {c:>8}" for c in columns)
    print(header)
    print("-" * len(header))
    for name, size, t_enc, t_dec in rows:
        rt = t_enc + t_dec
        print(
            f"{name:<36} {size:>8} {t_enc * 1e6:>8.1f} {t_dec * 1e6:>8.1f} {rt * 1e6:>8.1f} "
            f"{1 / rt:>8.0f} {size / rt / 1e6:>8.0f} {rt / base:>8.1f}"
        )


if __name__ == "__main__":
    main()
