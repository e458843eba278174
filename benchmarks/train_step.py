"""One learner forward+backward of a pretrained model in float32 next to bf16 autocast
(`learner.cpu_amp`), on this CPU, in interleaved rounds (medians).

    .venv/bin/python benchmarks/train_step.py [--model smollm2] [--rows 8] [--tokens 250] \
        [--rounds 3] [--threads 2]

The step is what the learner computes per micro-batch: token logprobs of ``--rows``
sequences of ``--tokens`` tokens (`HFPolicy.token_logprobs`), their mean as the loss,
backward. The header says whether this CPU has native bf16 (avx512_bf16 / AMX, from its
flags: learner/cpu.py) and whether a bf16 matmul measured faster than float32 at start,
and so whether `cpu_amp = true` autocasts here at all; the bf16 row is measured either way,
to show what autocast would cost where it is not used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pretrained import load_pretrained
from learner.cpu import fast_bf16_cpu, native_bf16_cpu
from learner.hf import HFPolicy


def step(policy: HFPolicy, ids: torch.Tensor, bf16: bool) -> float:
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logp, _ = policy.token_logprobs(ids)
    (-logp.float().mean()).backward()  # type: ignore[no-untyped-call]
    policy.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    policy = load_pretrained(args.model, args.threads)
    policy.train()
    ids = torch.randint(100, policy.vocab_size - 100, (args.rows, args.tokens),
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    native, fast = native_bf16_cpu(), fast_bf16_cpu()
    print(f"# train step: {args.model}, {args.rows} x {args.tokens} tokens, "
          f"{torch.get_num_threads()} threads, {args.rounds} interleaved rounds (medians); "
          f"native bf16: {'yes' if native else 'no'}, measured faster: "
          f"{'yes' if fast else 'no'} "
          f"(cpu_amp {'autocasts' if fast else 'is ignored'} here)")  # fmt: skip
    modes = {"float32": False, "bf16 autocast": True}
    for bf16 in modes.values():
        step(policy, ids, bf16)  # warm-up
    secs: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, bf16 in modes.items():
            secs[name].append(step(policy, ids, bf16))
    base = statistics.median(secs["float32"])
    print("\n| step | seconds (median) | x float32 | tokens/s |")
    print("|---|---|---|---|")
    for name, xs in secs.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:.1f} | {med / base:.2f} | {args.rows * args.tokens / med:.0f} |")


if __name__ == "__main__":
    main()
