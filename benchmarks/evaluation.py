"""Evaluation decoding speed: a batch of code tasks' greedy completions through Hugging Face
`generate` (left-padded batches) and through rollstream's decoder (`generate_many`:
left-padded too, finished rows leaving the batch), on SmolLM2, in one run.

    .venv/bin/python benchmarks/evaluation.py [--model smollm2] [--tasks 32] \
        [--batch 16] [--max-new-tokens 160] [--rounds 1] [--threads 2]

The tasks are the first ``--tasks`` of the code suite's *training* split (this measures
decoding, nothing is judged; held-out tasks are for the learning figures only), decoded
as `rollstream eval` and the demo's evaluation do (services/rollout/batched.py: ``--batch``
rows at once, each cut at its end-of-sequence token or the task's stop string). Routes:

- `hf generate`: transformers' `generate` on the float32 model;
- `rollstream fp32`: learner/decode.py in the model's float32, what evaluation uses;
- `rollstream int4`: the generators' int4 sampler (layers in int4, head in int8,
  learner/quant.py), where torch has the CPU kernels: shown, not used for evaluation.

Per route: wall seconds (median of ``--rounds``, interleaved), tokens decoded, tokens/s,
the ratio to `hf generate`, and how many completions equal `hf generate`'s token for token
(greedy decisions can flip where two tokens' logits nearly tie, more often in int4).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pretrained import load_pretrained
from learner import quant
from learner.hf import HFPolicy
from services.rollout.batched import Decoding, Drawn, complete


class _Route:
    """The policy with the decoder services/rollout/batched.py takes swapped: none (it then
    decodes with transformers' `generate`), the exact one, or the int4 sampler's."""

    def __init__(self, policy: HFPolicy, route: str) -> None:
        self.policy, self.route = policy, route
        self.model, self.pad_id, self.eos_id = policy.model, policy.pad_id, policy.eos_id
        self.stop_strings = policy.stop_strings

    def decoder(self, exact: bool = False) -> Any:
        if self.route == "generate":
            return None
        self.policy.sample_dtype = "int4" if self.route == "int4" else None
        return self.policy.decoder(exact=self.route == "exact")


def routes(policy: HFPolicy) -> dict[str, _Route]:
    out = {"hf generate": _Route(policy, "generate"), "rollstream fp32": _Route(policy, "exact")}
    if quant.available():
        out["rollstream int4"] = _Route(policy, "int4")
    return out


def run(policy: _Route, codec: Any, tasks: list[Any], how: Decoding) -> Any:
    policy.decoder()  # packing the weights is not decoding
    t0 = time.perf_counter()
    rows = complete(policy, codec, tasks, 1, how)
    return time.perf_counter() - t0, [r[0] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from services.rollout.textcodec import for_policy
    from services.suites import get

    policy = load_pretrained(args.model, args.threads)
    policy.model.eval()
    codec = for_policy(policy)
    tasks = get("code").tasks("train")[: args.tasks]
    how = Decoding(args.max_new_tokens, batch=args.batch)
    print(f"# evaluation decoding: {args.model}, {len(tasks)} code training tasks, greedy, "
          f"batch {args.batch}, max {args.max_new_tokens} new tokens, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} "
          "interleaved round(s) (medians)")  # fmt: skip
    contenders = routes(policy)
    secs: dict[str, list[float]] = {k: [] for k in contenders}
    rows: dict[str, list[Drawn]] = {}
    for _ in range(args.rounds):
        for name, p in contenders.items():
            s, rows[name] = run(p, codec, tasks, how)
            secs[name].append(s)
    report(secs, rows)


def report(secs: dict[str, list[float]], rows: dict[str, list[Drawn]]) -> None:
    base = statistics.median(secs["hf generate"])
    ref = rows["hf generate"]
    print("\n| route | seconds | tokens | tokens/s | x hf generate (time) | same as hf |")
    print("|---|---|---|---|---|---|")
    for name, s in secs.items():
        sec, toks = statistics.median(s), sum(len(r.tokens) for r in rows[name])
        same = sum(a.tokens == b.tokens for a, b in zip(rows[name], ref, strict=True))
        print(f"| {name} | {sec:.1f} | {toks} | {toks / sec:.1f} | {base / sec:.2f} | "
              f"{same} / {len(ref)} |")  # fmt: skip


if __name__ == "__main__":
    main()
