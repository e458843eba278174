"""Stop strings: where a completion ends before its end-of-sequence token.

A code task's prompt asks for the function in a fenced block; the completion is done when
that fence closes (a line starting with the closing fence, after the opening one). The
closing fence stays in the completion text, so `streams.groups.extract_code` sees a closed
fence; everything sampled after it is cut, tokens and behaviour logprobs alike (the kept
prefix is exactly what a sampler stopping there would have drawn).

A policy whose `sample` takes `stop` (strings) stops while decoding (`sampler_stop` says
so); for any other, this module finds the stop afterwards on the decoded text (the
smallest token prefix whose text holds the stop): the same tokens, more decoding spent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from schemas.rollout import Task

FENCE = "```"
FENCE_END = "\n" + FENCE + "\n"
"""The stop string of fenced code: the closing fence on a line of its own. (A closing
fence that ends the text is followed by the end-of-sequence token, which stops anyway.)
Unlike a bare "\n```", it never matches an opening fence ("\n```python"), so samplers
that look for plain substrings stop at the right place too."""


def stop_strings(task: Task) -> tuple[str, ...]:
    """The task's stop strings: the end of the code fence for tasks judged on code."""
    prompt = task.prompt or " ".join(m.content or "" for m in task.messages)
    if task.verifier.needs_sandbox and FENCE in prompt:
        return (FENCE_END,)
    return ()


def stop_at(text: str, stops: Sequence[str]) -> int | None:
    """End (exclusive) of the first stop in `text`, or None. `FENCE_END` counts only after
    an opening fence."""
    ends = []
    for stop in stops:
        start = 0
        if stop == FENCE_END:
            opening = text.find(FENCE)
            if opening < 0:
                continue
            start = opening + len(FENCE)
        at = text.find(stop, start)
        if at >= 0:
            ends.append(at + len(stop))
    return min(ends) if ends else None


def truncate(completion: Any, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> Any:
    """`completion` (learner.sampling.Completion) cut after its first stop string: the
    shortest token prefix whose decoded text contains it (finish_reason `stop`)."""
    if not stops or stop_at(decode(completion.tokens), stops) is None:
        return completion
    lo, hi = 1, len(completion.tokens)  # the prefix of length hi holds a stop
    while lo < hi:
        mid = (lo + hi) // 2
        if stop_at(decode(completion.tokens[:mid]), stops) is None:
            lo = mid + 1
        else:
            hi = mid
    fields = {"tokens": completion.tokens[:hi], "logprobs": completion.logprobs[:hi]}
    if getattr(completion, "versions", None):
        fields["versions"] = completion.versions[:hi]
    return replace(completion, **fields, finish_reason="stop")


def sampler_stop(policy: Any, stop: Sequence[str]) -> dict[str, Any]:
    """Keyword arguments for `policy.sample`: `stop` when its sampler stops on strings."""
    if not stop:
        return {}
    try:
        accepts = "stop" in inspect.signature(policy.sample).parameters
    except (TypeError, ValueError):
        accepts = False
    return {"stop": tuple(stop)} if accepts else {}
