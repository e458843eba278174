"""What the gateway's two write calls do, behind the HTTP layer (services/ingest/app.py).

POST /v1/trajectories
  1. Build the trajectory (validation, tokenisation) and, with inline feedback, its
     reward: an invalid request claims nothing and publishes nothing.
  2. Claim the client id (Redis SET NX). A known id with another body: 409. A known id
     whose effect is done: the first answer again, nothing published. A known id whose
     effect is not done (the first request died): redo it under the first trajectory id.
  3. The effect: with a verifier, publish the trajectory on `trajectories` (the reward
     dispatcher scores it); with feedback, join it at once (below); else hold the trace in
     Redis until feedback arrives.
  4. Mark the id done; answer 202.

POST /v1/feedback
  1. Reward from the judgement (services/ingest/feedback.py); find the trace by its
     trajectory id or client id (404 when none awaits feedback; 409 when it was sent to a
     verifier or already judged).
  2. Claim the client id as above, then join the trace (Redis SET NX: one per trace).
  3. Publish the Feedback on `feedback` and the ScoredTrajectory on `rewards` (ids
     deterministic: a redo publishes the same messages, which consumers dedup).
  4. Mark the id done, drop the held trace; answer 202.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import codec, topics
from schemas.envelope import new_id
from schemas.rollout import Trajectory
from services.ingest import feedback as fb
from services.ingest import metrics
from services.ingest.convert import FEEDBACK_VERIFIER, Limits, Tokenizer, build_trajectory
from services.ingest.models import Accepted, FeedbackAccepted, FeedbackIn, Judgement, TraceIn

if TYPE_CHECKING:
    from services.ingest.publish import Publisher
    from services.ingest.state import IngestState
    from services.settings import Settings


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        error: str,
        problems: list[str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status, self.error = status, error
        self.problems = problems or []
        self.headers = headers


@contextlib.contextmanager
def infrastructure() -> Iterator[None]:
    """Redis or Kafka failures become 503 (retry later), never a 500."""
    from aiokafka.errors import KafkaError
    from redis.exceptions import RedisError

    try:
        yield
    except (RedisError, KafkaError, TimeoutError, ConnectionError) as exc:
        why = f"a backing service is unavailable ({type(exc).__name__}): retry later"
        raise ApiError(503, why, headers={"Retry-After": "5"}) from exc


class Handlers:
    def __init__(
        self,
        settings: Settings,
        state: IngestState,
        publisher: Publisher,
        tokenizer: Tokenizer | None,
    ) -> None:
        self.cfg = settings.ingest
        self.state, self.publisher, self.tokenizer = state, publisher, tokenizer
        self.limits = Limits(self.cfg.max_messages, self.cfg.max_tokens, self.cfg.task_id)
        self.writer = fb.writer()

    # -- traces ------------------------------------------------------------------------

    async def trajectory(self, body: TraceIn, fingerprint: str) -> Accepted:
        traj = build_trajectory(body, self.limits, self.tokenizer)
        verdict = fb.judge(body.feedback, self.cfg) if body.feedback is not None else None
        status = "scoring" if body.verifier else ("scored" if verdict else "awaiting_feedback")
        record = {"trajectory_id": traj.id, "fingerprint": fingerprint, "status": status}
        with infrastructure():
            first = await self.state.claim("trace", body.id, {**record, "done": False})
            _same_body(first, fingerprint, body.id, "trace")
            tid = first["trajectory_id"]
            if first.get("done"):
                metrics.TRACES.labels("duplicate").inc()
                return Accepted(trajectory_id=tid, status=first["status"], duplicate=True)
            if tid != traj.id:  # redo the first request's effect under its id
                traj = msgspec.structs.replace(traj, id=tid, group_id=tid)
            async with self.state.effect("trace", body.id) as finished:
                if finished is not None:  # a concurrent request with this id did it
                    metrics.TRACES.labels("duplicate").inc()
                    return Accepted(trajectory_id=tid, status=first["status"], duplicate=True)
                await self._place(traj, body.feedback, verdict)
                await self.state.done("trace", body.id, first)
        metrics.TRACES.labels(first["status"]).inc()
        return Accepted(trajectory_id=tid, status=first["status"])

    async def _place(
        self, traj: Trajectory, judgement: Judgement | None, verdict: fb.Verdict | None
    ) -> None:
        if traj.verifier.name != FEEDBACK_VERIFIER:
            await self.publisher.publish([(topics.TRAJECTORIES, traj.group_id, traj)])
        elif judgement is not None and verdict is not None:
            feedback_id = f"{traj.id}:feedback"
            await self.state.join(traj.id, feedback_id)
            await self._publish_joined(traj, feedback_id, judgement, verdict)
        else:
            await self.state.hold(traj.id, codec.encode(traj))

    async def _publish_joined(
        self, traj: Trajectory, feedback_id: str, j: Judgement, v: fb.Verdict
    ) -> None:
        message = fb.feedback_message(feedback_id, traj.id, j)
        reward = fb.scored(traj, v, self.cfg.baseline, self.writer)
        await self.publisher.publish(
            [(topics.FEEDBACK, traj.id, message), (topics.REWARDS, traj.group_id, reward)]
        )

    # -- feedback ----------------------------------------------------------------------

    async def feedback(self, body: FeedbackIn, fingerprint: str) -> FeedbackAccepted:
        verdict = fb.judge(body, self.cfg)
        with infrastructure():
            earlier = await self.state.record("feedback", body.id)
            if earlier is not None:
                _same_body(earlier, fingerprint, body.id, "feedback")
                tid = str(earlier["trajectory_id"])
            else:
                tid = await self._trace_id(body.trace_id)
            record = {
                "feedback_id": new_id(),
                "trajectory_id": tid,
                "fingerprint": fingerprint,
                "reward": verdict.reward,
                "advantage": verdict.advantage,
            }
            first = await self.state.claim("feedback", body.id, {**record, "done": False})
            _same_body(first, fingerprint, body.id, "feedback")
            answer = FeedbackAccepted(
                **{k: first[k] for k in ("feedback_id", "trajectory_id", "reward", "advantage")}
            )
            if first.get("done"):
                return answer.model_copy(update={"duplicate": True})
            async with self.state.effect("feedback", body.id) as finished:
                if finished is not None:  # a concurrent request with this id did it
                    return answer.model_copy(update={"duplicate": True})
                await self._join_feedback(tid, first, body, verdict)
        metrics.FEEDBACK.labels(verdict.source).inc()
        return answer

    async def _join_feedback(
        self, tid: str, first: dict[str, Any], body: FeedbackIn, verdict: fb.Verdict
    ) -> None:
        holder = await self.state.join(tid, first["feedback_id"])
        if holder != first["feedback_id"]:
            raise ApiError(409, f"trace {tid} already has feedback ({holder}): one per trace")
        data = await self.state.trace(tid)
        if data is None:
            why = f"trace {tid} is not held: it expired, or its submission never finished"
            raise ApiError(404, why + " (submit the trace again with the same id)")
        traj = codec.decode(data, Trajectory)
        await self._publish_joined(traj, first["feedback_id"], body, verdict)
        await self.state.done("feedback", body.id, first)
        await self.state.release(tid)

    async def _trace_id(self, given: str) -> str:
        """The trajectory id a feedback names (by trajectory id or client id)."""
        client = await self.state.client_of(given)
        record = await self.state.record("trace", client or given)
        if record is None:
            if await self.state.trace(given) is not None:
                return given
            raise ApiError(
                404,
                f"no trace {given!r} awaits feedback: use the trajectory_id the gateway "
                "returned (or your trace id) within ingest.feedback_window_s",
            )
        tid = str(record["trajectory_id"])
        if record.get("status") == "scoring":
            raise ApiError(409, f"trace {tid} was sent to its verifier: it takes no feedback")
        joined = await self.state.joined(tid)
        if record.get("status") == "scored" or (joined and await self.state.trace(tid) is None):
            raise ApiError(409, f"trace {tid} already has feedback ({joined}): one per trace")
        return tid


def _same_body(first: dict[str, Any], fingerprint: str, client_id: str, what: str) -> None:
    if first.get("fingerprint") != fingerprint:
        raise ApiError(
            409,
            f"id {client_id!r} was already used for another {what}: give each {what} its own "
            "id (a retry must repeat the same body)",
        )
