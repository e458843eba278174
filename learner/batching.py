"""Batching by token budget (pure).

Two budgets: the *batch* budget is the number of sequence tokens per learner update (a
statistical quantity: how much data one step sees); the *micro-batch* budget bounds the
padded tokens of one forward/backward pass (a memory quantity). Gradients of a batch's
micro-batches are accumulated, so a batch behaves the same whatever its micro-batching.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class TokenBudgetBatcher(Generic[T]):
    """Accumulates items until their tokens reach the budget, then hands out the batch.

    A batch holds at least one item and overshoots the budget by less than its last item."""

    def __init__(self, budget: int, length: Callable[[T], int], max_items: int | None = None):
        if budget < 1:
            raise ValueError(f"token budget must be positive, got {budget}")
        self.budget = budget
        self.length = length
        self.max_items = max_items
        self._items: list[T] = []
        self._tokens = 0

    def add(self, item: T) -> list[T] | None:
        """Add an item; return the batch when it is full, else None."""
        self._items.append(item)
        self._tokens += self.length(item)
        full = self._tokens >= self.budget
        if full or (self.max_items is not None and len(self._items) >= self.max_items):
            return self.flush()
        return None

    def flush(self) -> list[T]:
        """Hand out whatever is pending (possibly nothing)."""
        items, self._items, self._tokens = self._items, [], 0
        return items

    @property
    def pending(self) -> list[T]:
        return list(self._items)

    @property
    def tokens(self) -> int:
        return self._tokens

    def __len__(self) -> int:
        return len(self._items)


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Split item indices into groups whose padded size (count x longest) fits ``budget``.

    Items are sorted by length (longest first) so similar lengths share a group and little
    is wasted on padding; an item longer than the budget gets a group of its own."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > budget:
            groups.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        groups.append(current)
    return groups


def prefix_micro_batches(
    lengths: Sequence[int], prefixes: Sequence[bytes], prefix_lens: Sequence[int], budget: int
) -> list[list[int]]:
    """Like `micro_batches`, but a micro-batch only holds items with one prefix (the same
    `prefixes` key: a group's prompt), so a model can run that prefix once. Its cost is the
    prefix once plus each row's tail padded to the longest: ``P + rows x (longest - P)``.
    A group's items, longest first, are cut where that minimises the group's summed cost
    (`cheapest_cuts`): a group whose completions range from 20 to 160 tokens pays the prompt
    twice rather than padding every short row to 160. Groups come in order of first
    appearance; an item over the budget goes alone."""
    by_key: dict[bytes, list[int]] = {}
    for i, key in enumerate(prefixes):
        by_key.setdefault(key, []).append(i)
    out: list[list[int]] = []
    for items in by_key.values():
        items.sort(key=lambda i: (-lengths[i], i))
        p = prefix_lens[items[0]]
        tails = [max(0, lengths[i] - p) for i in items]
        start = 0
        for end in cheapest_cuts(tails, p, budget):
            out.append(items[start:end])
            start = end
    return out


def cheapest_cuts(tails: Sequence[int], prefix: int, budget: int) -> list[int]:
    """End indices of the contiguous runs of `tails` (sorted longest first) that minimise
    ``sum(prefix + rows x longest_tail)`` with each run's cost within `budget` (a run of one
    may exceed it). Dynamic programming over the cut points: O(n^2) for n rows."""
    n = len(tails)
    best = [0] * (n + 1)  # best[j]: least cost of rows j..n-1
    cut = [n] * (n + 1)
    for j in range(n - 1, -1, -1):
        best[j] = -1
        for end in range(j + 1, n + 1):
            cost = prefix + (end - j) * tails[j]
            if cost > budget and end - j > 1:
                break
            if best[j] < 0 or cost + best[end] < best[j]:
                best[j], cut[j] = cost + best[end], end
    ends, j = [], 0
    while j < n:
        j = cut[j]
        ends.append(j)
    return ends


def split_even(items: Sequence[T], parts: int) -> list[list[T]]:
    """Split into ``parts`` contiguous, nearly equal groups (fewer if there are few items)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (1 if k < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out
