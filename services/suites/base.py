"""What a task suite is: a deterministic list of tasks per split, plus warm-up examples."""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol

from schemas.rollout import Task

Split = Literal["train", "warmup", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "warmup", "heldout")


def split_of(task_id: str) -> Split:
    """The split of a task, from a hash of its id alone: 20% heldout, 20% warmup, 60% train.
    Stable across runs, machines and Python versions (no seeded RNG involved)."""
    bucket = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big") % 10
    if bucket < 2:
        return "heldout"
    if bucket < 4:
        return "warmup"
    return "train"


class Suite(Protocol):
    """A family of tasks with a verifier that really runs."""

    name: str

    def tasks(self, split: Split) -> list[Task]:
        """Every task of the split, in a fixed order."""
        ...

    def example(self, task: Task) -> str:
        """A correct completion of `task` (the warm-up's supervised target)."""
        ...
