"""Completions of many tasks at once, for evaluation: prompts of several tasks left-padded
into one batch and decoded together with a KV cache, each row stopped at its
end-of-sequence token or at the task's stop string (services/rollout/stops.py). A model the
fast decoder covers decodes there (`learner.decode.generate_many`, in the model's own
dtype, not the generators' int4 or bf16, whose rounding flips greedy choices; finished rows
leave the batch): its completions are `generate`'s, about 2x sooner
(benchmarks/evaluation.py). Other Hugging Face models go through `generate`. The tiny
policy samples task by task.

No behaviour logprobs are recorded (nothing here is trained on): this is for `rollstream
eval` and the demo's held-out evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas.rollout import Task
from services.rollout.stops import stop_at, stop_strings, truncate


@dataclass
class Drawn:
    """One completion (the shape of learner.sampling.Completion, without logprobs)."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    temperature: float = 0.0
    """0: greedy."""
    top_p: float = 1.0
    seed: int = 0
    batch: int = 16
    """Rows decoded together (prompts x samples)."""
    threads: int = 0
    """Torch CPU threads of the decoding, set in the thread that decodes (torch keeps a
    count per OS thread: one set in the event loop's thread does not reach the worker
    thread `asyncio.to_thread` decodes in); 0: as that thread has them."""


def complete(
    policy: Any, codec: Any, tasks: Sequence[Task], n: int, how: Decoding
) -> list[list[Drawn]]:
    """`n` completions of every task (greedy when `how.temperature` is 0), cut at stops."""
    prompts = [codec.prompt_ids(t) for t in tasks]
    return complete_ids(policy, codec, prompts, [stop_strings(t) for t in tasks], n, how)


def complete_ids(
    policy: Any,
    codec: Any,
    prompts: Sequence[list[int]],
    stops: Sequence[tuple[str, ...]],
    n: int,
    how: Decoding,
) -> list[list[Drawn]]:
    """`n` completions of every prompt (token ids: a first turn's prompt, or a later turn's
    whole context), each cut at its row's stop strings."""
    if n < 1 or not prompts:
        return [[] for _ in prompts]
    if how.threads:
        import torch

        torch.set_num_threads(how.threads)
    if getattr(policy, "model", None) is None or not hasattr(codec, "tok"):
        return [
            _one_by_one(policy, codec, p, s, n, how) for p, s in zip(prompts, stops, strict=True)
        ]
    import torch

    torch.manual_seed(how.seed)
    out: list[list[Drawn]] = [[] for _ in prompts]
    per_batch = max(1, how.batch // n)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), per_batch):
        chunk = order[start : start + per_batch]
        rows = _generate(
            policy, codec, [prompts[i] for i in chunk], [stops[i] for i in chunk], n, how
        )
        for j, i in enumerate(chunk):
            out[i] = rows[j * n : (j + 1) * n]
    return out


def _one_by_one(
    policy: Any, codec: Any, prompt: list[int], stops: tuple[str, ...], n: int, how: Decoding
) -> list[Drawn]:
    import torch

    rng = torch.Generator().manual_seed(how.seed)
    drawn = policy.sample(
        prompt, n, max_new_tokens=how.max_new_tokens,
        temperature=how.temperature, top_p=how.top_p, generator=rng,
    )  # fmt: skip
    return [truncate(Drawn(list(c.tokens), [], c.finish_reason), codec.text, stops) for c in drawn]


def _generate(
    policy: Any,
    codec: Any,
    prompts: list[list[int]],
    prompt_stops: list[tuple[str, ...]],
    n: int,
    how: Decoding,
) -> list[Drawn]:
    import torch

    decoder = getattr(policy, "decoder", None)
    dec = decoder(exact=True) if decoder is not None else None
    if dec is not None:
        return _decode(policy, codec, dec, prompts, prompt_stops, n, how)
    width = max(len(p) for p in prompts)
    pad = policy.pad_id
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    stops = [s for s in prompt_stops for _ in range(n)]
    kwargs: dict[str, Any] = {"do_sample": False}
    if how.temperature > 0:
        kwargs = {"do_sample": True, "temperature": how.temperature, "top_p": how.top_p,
                  "top_k": 0}  # fmt: skip
    from transformers import StoppingCriteriaList

    model = policy.model
    criteria = StoppingCriteriaList([_StopStrings(codec, stops, width)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=how.max_new_tokens,
            num_return_sequences=n, eos_token_id=policy.eos_id, pad_token_id=pad,
            stopping_criteria=criteria, **kwargs,
        )  # fmt: skip
    rows: list[Drawn] = []
    for row, row_stops in zip(out[:, width:].tolist(), stops, strict=True):
        end = row.index(policy.eos_id) + 1 if policy.eos_id in row else len(row)
        reason = "stop" if policy.eos_id in row else "length"
        rows.append(truncate(Drawn(row[:end], [], reason), codec.text, row_stops))
    return rows


def _decode(
    policy: Any,
    codec: Any,
    dec: Any,
    prompts: list[list[int]],
    prompt_stops: list[tuple[str, ...]],
    n: int,
    how: Decoding,
) -> list[Drawn]:
    import torch

    from learner.decode import Draw, generate_many

    rows = [p for p in prompts for _ in range(n)]
    stops = [s for s in prompt_stops for _ in range(n)]
    rng = torch.Generator(device=dec.device).manual_seed(how.seed)
    draw = Draw(how.max_new_tokens, policy.eos_id, how.temperature, how.top_p, rng)
    with torch.no_grad():
        out = generate_many(dec, rows, draw, [policy.stop_strings(s) for s in stops])
    return [
        truncate(Drawn(list(c.tokens), [], c.finish_reason), codec.text, s)
        for c, s in zip(out, stops, strict=True)
    ]


class _StopStrings:
    """A transformers StoppingCriteria: per row, done once its new text holds a stop."""

    def __init__(self, codec: Any, stops: list[tuple[str, ...]], width: int) -> None:
        self.codec, self.stops, self.width = codec, stops, width

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        new = input_ids[:, self.width :].tolist()
        done = [bool(s) and stop_at(self.codec.text(r), s) is not None
                for r, s in zip(new, self.stops, strict=True)]  # fmt: skip
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
