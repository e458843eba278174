"""Sampling speed of rollstream's sampler next to Hugging Face `generate`, on SmolLM2.

    .venv/bin/python benchmarks/generation.py [--model smollm2] [--batch 8] \
        [--lengths 64,128] [--rounds 3] [--threads 2] [--no-compile]

Every contender draws a batch of ``--batch`` completions of one chat prompt (a group), of
exactly L new tokens (no early stop, so each does the same work), temperature 1, in
interleaved rounds (A B C A B C ...: a machine shared with other work slows all alike);
the table shows medians. tokens/s = batch x L / wall time. Peak RSS: the process's peak
resident set during the call (VmHWM, reset before each call via /proc/self/clear_refs).

- `hf generate fp32`: `model.generate(do_sample=True)` on the model as loaded (float32);
- `hf generate bf16`: the same on a bfloat16 copy;
- `rollstream fp32` / `rollstream bf16`: learner/decode.py with float32 / bfloat16 weights;
- `rollstream int4`: learner/decode.py with the layers' weights in int4 and the LM head in
  int8 (learner/quant.py; float32 activations), where torch has the CPU kernels;
- `rollstream int4 compiled`: the same with its per-token step through torch.compile
  (`learner.sample_compile`; the warm-up compiles it and says how long that took; off with
  ``--no-compile``).

The header says which of them `learner.sample_dtype = "auto"` picks on this machine, with
full fine-tuning and with LoRA.

Then the logprob mismatch: mean and max |logp_sampler - logp_fp32| per token, where
logp_fp32 is the learner's float32 recomputation (`token_logprobs`) of the sampled tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pretrained import load_pretrained
from learner import quant
from learner.decode import Decoder, generate
from learner.hf import HFPolicy

PROMPT = [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}]


def reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def hf_generate(model: Any, prompt: list[int], batch: int, length: int, pad: int) -> None:
    ids = torch.tensor([prompt] * batch)
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                       temperature=1.0, max_new_tokens=length, min_new_tokens=length,
                       pad_token_id=pad)  # fmt: skip


def ours(dec: Decoder, prompt: list[int], batch: int, length: int) -> list[Any]:
    return generate(dec, prompt, batch, max_new_tokens=length, eos_id=-1)


def contenders(
    policy: HFPolicy, prompt: list[int], batch: int, compiled: bool
) -> dict[str, Callable[[int], Any]]:
    fp32 = policy.model.eval()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16).eval()
    dec32, dec16 = Decoder(fp32, torch.float32), Decoder(fp32, torch.bfloat16)
    pad = policy.pad_id
    run = {
        "hf generate fp32": lambda n: hf_generate(fp32, prompt, batch, n, pad),
        "hf generate bf16": lambda n: hf_generate(bf16, prompt, batch, n, pad),
        "rollstream fp32": lambda n: ours(dec32, prompt, batch, n),
        "rollstream bf16": lambda n: ours(dec16, prompt, batch, n),
    }
    if quant.available() and fp32.device.type == "cpu":
        dec4 = Decoder(fp32, torch.float32, int4=True)
        run["rollstream int4"] = lambda n: ours(dec4, prompt, batch, n)
        if compiled:
            dec4c = Decoder(fp32, torch.float32, int4=True, packs=dec4.packs, compiled=True)
            run["rollstream int4 compiled"] = lambda n: ours(dec4c, prompt, batch, n)
    return run


def auto_choice(policy: HFPolicy) -> str:
    """What `sample_dtype = "auto"` samples with here: full fine-tuning, then LoRA."""

    def name(mode: tuple[torch.dtype, bool]) -> str:
        return "int4" if mode[1] else str(mode[0]).replace("torch.", "")

    full, lora = policy.sampling_mode("auto", False), policy.sampling_mode("auto", True)
    return f"auto: {name(full)} (full fine-tuning), {name(lora)} (LoRA)"


def timed(fn: Callable[[int], Any], length: int) -> tuple[float, float, Any]:
    reset_peak()
    t0 = time.perf_counter()
    out = fn(length)
    return time.perf_counter() - t0, peak_mb(), out


def mismatch(policy: HFPolicy, prompt: list[int], completions: list[Any]) -> tuple[float, float]:
    gaps = []
    for c in completions:
        ids = torch.tensor([prompt + c.tokens])
        with torch.no_grad():
            logp, _ = policy.token_logprobs(ids)
        gaps.append((logp[0, len(prompt) - 1 :] - torch.tensor(c.logprobs)).abs())
    gap = torch.cat(gaps)
    return float(gap.mean()), float(gap.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lengths", default="64,128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    policy = load_pretrained(args.model, args.threads)
    tok = policy.tokenizer
    prompt = list(tok.apply_chat_template(PROMPT, add_generation_prompt=True))
    params = sum(p.numel() for p in policy.model.parameters()) / 1e6
    print(f"# generation benchmark: {args.model} ({params:.0f}M params), torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, "
          f"prompt {len(prompt)} tokens, {args.rounds} interleaved rounds (medians); "
          f"{auto_choice(policy)}")  # fmt: skip
    run = contenders(policy, prompt, args.batch, args.compile)
    for name, fn in run.items():
        t0 = time.perf_counter()
        fn(4)  # warm-up: first-call allocations, kernel selection, the compile
        if name.endswith("compiled"):
            print(f"# {name}: warm-up with the compile {time.perf_counter() - t0:.0f} s")
    lengths = [int(x) for x in args.lengths.split(",")]
    secs: dict[tuple[str, int], list[float]] = {(k, n): [] for k in run for n in lengths}
    rss: dict[tuple[str, int], list[float]] = {(k, n): [] for k in run for n in lengths}
    last: dict[tuple[str, int], Any] = {}
    for _ in range(args.rounds):
        for n in lengths:
            for name, fn in run.items():
                s, mb, out = timed(fn, n)
                secs[name, n].append(s)
                rss[name, n].append(mb)
                last[name, n] = out
    report(args.batch, lengths, run, secs, rss)
    print("\n## behaviour logprobs vs the learner's float32 recomputation (per token)\n")
    print("| sampler | mean abs diff | max abs diff |")
    print("|---|---|---|")
    for name in [k for k in run if k.startswith("rollstream")]:
        mean, top = mismatch(policy, prompt, last[name, lengths[0]])
        print(f"| {name} | {mean:.2e} | {top:.2e} |")


def report(batch: int, lengths: list[int], run: dict[str, Any], secs: Any, rss: Any) -> None:
    print("\n| sampler | new tokens | tokens/s | x hf generate fp32 | peak RSS MB |")
    print("|---|---|---|---|---|")
    for n in lengths:
        base = batch * n / statistics.median(secs["hf generate fp32", n])
        for name in run:
            tps = batch * n / statistics.median(secs[name, n])
            print(f"| {name} | {n} | {tps:.1f} | {tps / base:.2f} | "
                  f"{statistics.median(rss[name, n]):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
