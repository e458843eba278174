"""Hypothesis strategies for every wire message (valid by construction)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from schemas.arrays import pack_f32, pack_i32
from schemas.messages import (
    BlobRef,
    ChatMessage,
    DeadLetter,
    Feedback,
    FunctionCall,
    IOCase,
    LedgerEntry,
    LedgerStatus,
    Origin,
    Outcome,
    Progress,
    SandboxRequest,
    SandboxResult,
    ScoredTrajectory,
    Task,
    ToolCall,
    Trajectory,
    VerifierSpec,
    WeightUpdate,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
COUNT = st.integers(0, 2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=40)
KEY = st.text(min_size=1, max_size=40)
OPT_TEXT = st.none() | TEXT
SHA = st.binary(min_size=32, max_size=32).map(bytes.hex)


def envelope() -> dict[str, Any]:
    return {
        "id": KEY,
        "created_at": FINITE,
        "origin": st.sampled_from(Origin),
        "parent_id": st.none() | KEY,
    }


verifiers = st.builds(
    VerifierSpec,
    name=KEY,
    version=OPT_TEXT,
    tests=OPT_TEXT,
    feedback_tests=OPT_TEXT,
    cases=st.lists(st.builds(IOCase, stdin=TEXT, stdout=TEXT), max_size=3),
    answer=OPT_TEXT,
    pattern=OPT_TEXT,
    needs_sandbox=st.booleans(),
)
tool_calls = st.builds(
    ToolCall, id=KEY, type=TEXT, function=st.builds(FunctionCall, name=KEY, arguments=TEXT)
)
chat_messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
    content=OPT_TEXT,
    name=OPT_TEXT,
    tool_calls=st.lists(tool_calls, max_size=2),
    tool_call_id=OPT_TEXT,
)
labels = st.dictionaries(TEXT, TEXT, max_size=4)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    as_chat = draw(st.booleans())
    return draw(
        st.builds(
            Task,
            **envelope(),
            task_id=KEY,
            suite=KEY,
            prompt=st.none() if as_chat else TEXT,
            messages=st.lists(chat_messages, min_size=1, max_size=3) if as_chat else st.just([]),
            verifier=verifiers,
            group_size=st.integers(1, 4096),
            max_turns=st.integers(1, 256),
            metadata=labels,
            reference=OPT_TEXT,
        )
    )


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    n = draw(st.integers(0, 64))
    i32 = st.integers(-(2**31), 2**31 - 1)
    group_size = draw(st.integers(1, 4096))
    return draw(
        st.builds(
            Trajectory,
            **envelope(),
            task_id=KEY,
            suite=TEXT,
            group_id=KEY,
            group_size=st.just(group_size),
            index=st.integers(0, group_size - 1),
            messages=st.lists(chat_messages, max_size=4),
            prompt_tokens=st.lists(i32, max_size=64).map(pack_i32),
            completion_tokens=st.lists(i32, min_size=n, max_size=n).map(pack_i32),
            completion_mask=st.none() | st.binary(min_size=n, max_size=n),
            behaviour_logprobs=st.none()
            | st.lists(st.floats(width=32, allow_nan=False), min_size=n, max_size=n).map(pack_f32),
            policy_versions=st.just(b"") | st.lists(i32, min_size=n, max_size=n).map(pack_i32),
            policy_version=st.integers(-1, 2**31),
            generator_id=TEXT,
            verifier=verifiers,
            completion=TEXT,
            turns=st.integers(0, 1000),
            finish_reason=TEXT,
        )
    )


@st.composite
def scored(draw: st.DrawFn) -> ScoredTrajectory:
    total = draw(st.integers(0, 10_000))
    masked = draw(st.booleans())
    return draw(
        st.builds(
            ScoredTrajectory,
            **envelope(),
            trajectory=trajectories(),
            reward=FINITE,
            advantage=FINITE,
            outcome=st.sampled_from(Outcome),
            passed=st.integers(0, total),
            total=st.just(total),
            components=st.dictionaries(TEXT, FINITE, max_size=3),
            group_size_scored=st.integers(0, 4096),
            masked=st.just(masked),
            mask_reason=KEY if masked else TEXT,
            dispatcher_id=TEXT,
            scored_at=FINITE,
            verifier_name=TEXT,
            verifier_version=TEXT,
            image_digest=TEXT,
        )
    )


sandbox_requests = st.builds(
    SandboxRequest,
    **envelope(),
    request_id=TEXT,
    attempt=INT64,
    trajectory_id=TEXT,
    group_id=TEXT,
    task_id=TEXT,
    code=TEXT,
    verifier=verifiers,
    timeout_s=FINITE,
    memory_mb=INT64,
    turn=INT64,
)
sandbox_results = st.builds(
    SandboxResult,
    **envelope(),
    request_id=TEXT,
    attempt=INT64,
    trajectory_id=TEXT,
    group_id=TEXT,
    task_id=TEXT,
    turn=INT64,
    outcome=st.sampled_from(Outcome),
    passed=INT64,
    total=INT64,
    duration_s=FINITE,
    cpu_s=FINITE,
    queue_s=FINITE,
    stdout=TEXT,
    stderr=TEXT,
    truncated=st.booleans(),
    detail=TEXT,
    image_digest=TEXT,
    verifier_name=TEXT,
    verifier_version=TEXT,
    worker_id=TEXT,
)
weight_updates = st.builds(
    WeightUpdate,
    **envelope(),
    policy=KEY,
    version=COUNT,
    step=COUNT,
    uri=TEXT,
    sha256=SHA,
    size_bytes=COUNT,
    format=TEXT,
    samples_consumed=COUNT,
)
progresses = st.builds(
    Progress,
    **envelope(),
    source=KEY,
    policy=KEY,
    samples_consumed=COUNT,
    produced=COUNT,
    version=st.integers(-1, 2**31),
)


@st.composite
def ledger_entries(draw: st.DrawFn) -> LedgerEntry:
    status = draw(st.sampled_from(LedgerStatus))
    return draw(
        st.builds(
            LedgerEntry,
            **envelope(),
            trajectory_id=KEY,
            group_id=TEXT,
            status=st.just(status),
            reason=TEXT if status is LedgerStatus.TRAINED else KEY,
            policy_version=st.integers(-1, 2**31),
            learner_step=st.integers(-1, 2**40),
            writer=TEXT,
        )
    )


feedbacks = st.builds(
    Feedback,
    **envelope(),
    trace_id=KEY,
    score=st.none() | FINITE,
    label=OPT_TEXT,
    thumbs=st.none() | st.integers(-1, 1),
    comment=KEY,
)
dead_letters = st.builds(
    DeadLetter,
    **envelope(),
    reason=KEY,
    error_type=TEXT,
    detail=TEXT,
    source_topic=TEXT,
    source_partition=st.integers(-1, 2**31),
    source_offset=st.integers(-1, 2**62),
    source_key=st.none() | st.binary(max_size=40),
    original=st.binary(max_size=200),
    original_size=COUNT,
    original_sha256=TEXT,
    truncated=st.booleans(),
    consumer=KEY,
)
blob_refs = st.builds(
    BlobRef,
    **envelope(),
    sha256=SHA,
    size=COUNT,
    store=st.sampled_from(["redis", "dir"]),
    key=KEY,
    inner_schema=KEY,
)

BY_TYPE: dict[type, st.SearchStrategy[Any]] = {
    Task: tasks(),
    Trajectory: trajectories(),
    SandboxRequest: sandbox_requests,
    SandboxResult: sandbox_results,
    ScoredTrajectory: scored(),
    WeightUpdate: weight_updates,
    Progress: progresses,
    LedgerEntry: ledger_entries(),
    Feedback: feedbacks,
    DeadLetter: dead_letters,
    BlobRef: blob_refs,
}
messages = st.one_of(*BY_TYPE.values())
