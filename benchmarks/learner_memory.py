"""Peak RSS and step time of the learner's trainer on a pretrained model (SmolLM2-135M),
full fine-tuning and LoRA, each in a fresh process (ru_maxrss is a per-process peak).

    .venv/bin/python benchmarks/learner_memory.py [--model smollm2] [--steps 2]
        [--batch-tokens 4000] [--micro-batch-tokens 2000] [--threads 2] [--lora-rank 16]

Per mode: the policy loaded as the learner loads it (learner.spec.make_policy of the
resolved model), the Trainer (AdamW, bf16 autocast when `learner.amp`), one warm-up step
and --steps timed steps on synthetic groups of the vocabulary's tokens (prompt 80,
completion 120 tokens, as the demo's code tasks). Peak RSS is the child process's high
water mark, model load included. The issue's bound for the learner on CPU: 8 GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT, COMPLETION = 80, 120


def child(args: argparse.Namespace) -> None:
    import torch

    from learner.sample import from_scored
    from learner.spec import make_policy
    from learner.synthetic import random_groups
    from learner.trainer import Trainer, pick_device, train_config
    from services.models import resolved
    from services.settings import load

    torch.set_num_threads(args.threads)
    settings = load([
        f"learner.model={args.model}", f"learner.batch_tokens={args.batch_tokens}",
        f"learner.micro_batch_tokens={args.micro_batch_tokens}",
        f"learner.lora_rank={args.lora_rank if args.mode == 'lora' else 0}",
    ])  # fmt: skip
    ls = settings.learner
    policy = make_policy(resolved(settings))
    trainer = Trainer(policy, train_config(ls), pick_device(ls.device))
    vocab = int(policy.model.config.vocab_size)
    per_batch = max(1, ls.batch_tokens // (PROMPT + COMPLETION))
    n_groups = per_batch * (args.steps + 1) // 4 + 1
    gen = random_groups(n_groups, group_size=4, prompt_len=PROMPT, completion_len=COMPLETION,
                        vocab=vocab)  # fmt: skip
    data = [from_scored(m) for m in gen]
    trainer.step(data[:per_batch])  # warm-up
    tokens, seconds = 0, 0.0
    for k in range(1, args.steps + 1):
        res = trainer.step(data[k * per_batch :][:per_batch] or data[:per_batch])
        tokens, seconds = tokens + res.tokens, seconds + res.seconds
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    print(json.dumps({
        "mode": args.mode, "trainable_m": trainable / 1e6, "step_s": seconds / args.steps,
        "tokens_per_s": tokens / seconds,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-tokens", type=int, default=4000)
    parser.add_argument("--micro-batch-tokens", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        child(args)
        return
    print(
        f"\n## learner trainer, {args.model}: batch {args.batch_tokens} tokens, micro "
        f"{args.micro_batch_tokens}, {args.threads} threads, {args.steps} timed steps\n"
    )
    print("| mode | trainable M params | step s | tokens/s | peak RSS MB |")
    print("|---|---|---|---|---|")
    for mode in ("full", "lora"):
        argv = [*sys.argv[1:], "--mode", mode]
        out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"| {mode} | failed (exit {out.returncode}): {out.stderr.strip()[-300:]} |")
            continue
        r = json.loads(lines[-1])
        print(f"| {mode} | {r['trainable_m']:.1f} | {r['step_s']:.1f} | {r['tokens_per_s']:.0f} "
              f"| {r['peak_rss_mb']:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
