"""TRL's GRPOTrainer beside rollstream (benchmarks/pipeline.py), run in its own virtualenv
(`.venv-trl`, `pip install trl`: trl needs a newer click than faust allows).

Self-contained (no rollstream import): `python pipeline_trl.py CONFIG.json` reads the
tasks (arith prompts with their answers; pyslow prompts), the warm-up pairs and the sizes
the parent wrote, builds the closest equivalent of the tiny policy (a GPT-2 built from a
config, a byte-level tokenizer trained on the task text), warms it up with the same
supervised pairs (off the clock), then runs GRPO for `minutes` of wall time. Rewards: arith
by its answer (first number of the completion == the reference), pyslow 0 (the sandbox is
not reachable from here; the tiny policy scores ~0 on it in rollstream too), every pyslow
completion first waits its heavy-tailed verification cost, `pool` at a time, as the sync
loop's sandbox pool does. Prints one JSON line: samples, samples/s, reward per minute.
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

COST = {
    "pareto": lambda r, cap: min(cap, 0.05 * r.paretovariate(1.2)),
    "lognormal": lambda r, cap: min(cap, r.lognormvariate(-2.3, 1.5)),
}


def tokenizer(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<pad>", "<bos>", "<eos>"]
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def model(cfg: dict[str, Any], tok: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    conf = GPT2Config(
        vocab_size=len(tok), n_positions=cfg["max_seq_len"], n_embd=cfg["dim"],
        n_layer=cfg["layers"], n_head=cfg["heads"], bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    return GPT2LMHeadModel(conf)


def warmup(net: Any, tok: Any, pairs: list[list[str]], steps: int, seed: int) -> None:
    import torch

    rng = random.Random(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net.train()
    for _ in range(steps):
        batch = [rng.choice(pairs) for _ in range(32)]
        texts = [p + a + tok.eos_token for p, a in batch]
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = net(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def reward_fn(cfg: dict[str, Any], log: list[tuple[float, float]], t0: list[float]) -> Any:
    rng, pool = random.Random(cfg["seed"]), ThreadPoolExecutor(cfg["pool"])
    cost = COST[cfg["cost"]]

    def rewards(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        answers = kw["answer"]
        slow = [a is None for a in answers]
        waits = [cost(rng, 6.0) if s else 0.0 for s in slow]
        list(pool.map(time.sleep, [w for w in waits if w > 0]))  # the slowest holds the batch
        out = []
        for c, a in zip(completions, answers, strict=True):
            m = re.search(r"-?\d+", c)
            out.append(1.0 if a is not None and m and m.group(0) == a.strip() else 0.0)
        now = time.monotonic() - t0[0]
        log.extend((now, r) for r in out)
        return out

    return rewards


def main() -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(1)
    tok = tokenizer([t["prompt"] + (t["answer"] or "") for t in cfg["tasks"]])
    net = model(cfg, tok)
    warmup(net, tok, cfg["warmup"], cfg["warmup_steps"], cfg["seed"])
    data = Dataset.from_list([{"prompt": t["prompt"], "answer": t["answer"]} for t in cfg["tasks"]])
    log: list[tuple[float, float]] = []
    t0 = [time.monotonic()]
    budget = cfg["minutes"] * 60

    class Budget(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            control.should_training_stop = time.monotonic() - t0[0] >= budget
            return control

    g = cfg["group_size"]
    args = GRPOConfig(
        output_dir=cfg["out"], per_device_train_batch_size=g * cfg["prompts_per_step"],
        num_generations=g, max_completion_length=cfg["max_new_tokens"], learning_rate=cfg["lr"],
        beta=0.0, max_steps=100000, logging_steps=10, report_to=[], save_strategy="no",
        use_cpu=True, seed=cfg["seed"], temperature=1.0, disable_tqdm=True,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=net, reward_funcs=reward_fn(cfg, log, t0), args=args, train_dataset=data,
        processing_class=tok, callbacks=[Budget()],
    )  # fmt: skip
    t0[0] = time.monotonic()
    trainer.train()
    elapsed = min(time.monotonic() - t0[0], budget)
    inside = [(t, r) for t, r in log if t <= budget]
    minutes: dict[int, list[float]] = {}
    for t, r in inside:
        minutes.setdefault(int(t // 60), []).append(r)
    print(json.dumps({
        "mode": "trl", "samples": len(inside), "seconds": round(elapsed, 1),
        "samples_per_s": round(len(inside) / max(elapsed, 1e-9), 2),
        "reward_per_minute": [round(sum(v) / len(v), 4) for _, v in sorted(minutes.items())],
        "steps": trainer.state.global_step,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
