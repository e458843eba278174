"""Every wire message of rollstream, in one place. Import message types from here.

| message          | topic            | module              |
|------------------|------------------|---------------------|
| Task             | tasks            | schemas/rollout.py   |
| Trajectory       | trajectories     | schemas/rollout.py   |
| SandboxRequest   | sandbox.requests | schemas/sandbox.py   |
| SandboxResult    | sandbox.results  | schemas/sandbox.py   |
| ScoredTrajectory | rewards          | schemas/rollout.py   |
| WeightUpdate     | weights          | schemas/learning.py  |
| LedgerEntry      | ledger           | schemas/learning.py  |
| Progress         | progress         | schemas/learning.py  |
| Feedback         | feedback         | schemas/learning.py  |
| DeadLetter       | dlq              | schemas/transport.py |
| BlobRef          | any (claim check)| schemas/transport.py |

Embedded (not messages on their own): ChatMessage, ToolCall, FunctionCall, VerifierSpec,
IOCase.
"""

from __future__ import annotations

from typing import Final

from schemas.chat import ROLES, ChatMessage, FunctionCall, ToolCall
from schemas.envelope import Message, Origin, new_id, now
from schemas.learning import Feedback, LedgerEntry, LedgerStatus, Progress, WeightUpdate
from schemas.rollout import ScoredTrajectory, Task, Trajectory
from schemas.sandbox import IOCase, Outcome, SandboxRequest, SandboxResult, VerifierSpec
from schemas.transport import BlobRef, DeadLetter

ALL_MESSAGES: Final[tuple[type[Message], ...]] = (
    Task,
    Trajectory,
    SandboxRequest,
    SandboxResult,
    ScoredTrajectory,
    WeightUpdate,
    Progress,
    LedgerEntry,
    Feedback,
    DeadLetter,
    BlobRef,
)
"""Every message type, in pipeline order."""

__all__ = [
    "ALL_MESSAGES",
    "ROLES",
    "BlobRef",
    "ChatMessage",
    "DeadLetter",
    "Feedback",
    "FunctionCall",
    "IOCase",
    "LedgerEntry",
    "LedgerStatus",
    "Message",
    "Origin",
    "Outcome",
    "Progress",
    "SandboxRequest",
    "SandboxResult",
    "ScoredTrajectory",
    "Task",
    "ToolCall",
    "Trajectory",
    "VerifierSpec",
    "WeightUpdate",
    "new_id",
    "now",
]
