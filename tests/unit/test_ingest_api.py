"""The gateway's HTTP API in process (httpx over ASGI) with an in-memory Redis and a
recording publisher: auth, size limit, content type, error bodies, idempotency, the
feedback join, and the redo of a request that died half-way."""

from __future__ import annotations

import fnmatch
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from schemas import codec, topics
from schemas.envelope import Message
from schemas.learning import Feedback
from schemas.rollout import ScoredTrajectory, Trajectory
from services.ingest.app import Deps, create_app
from services.ingest.state import IngestState, pending_counts
from services.settings import load

from .test_ingest_convert import Bytes

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeRedis:
    """The subset of redis.asyncio.Redis the gateway uses, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.zsets: dict[str, dict[str, float]] = {}

    async def set(self, key: str, value: Any, nx: bool = False, xx: bool = False, **_: Any) -> bool:
        if (nx and key in self.data) or (xx and key not in self.data):
            return False
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()
        return True

    async def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)

    async def zadd(self, key: str, mapping: dict[str, float]) -> None:
        self.zsets.setdefault(key, {}).update(mapping)

    async def zrem(self, key: str, member: str) -> None:
        self.zsets.get(key, {}).pop(member, None)

    async def zremrangebyscore(self, key: str, lo: Any, hi: float) -> None:
        z = self.zsets.get(key, {})
        for m in [m for m, s in z.items() if s <= hi]:
            del z[m]

    async def zcount(self, key: str, lo: Any, hi: Any) -> int:
        lo_v = float("-inf") if lo == "-inf" else float(lo)
        hi_v = float("inf") if hi == "+inf" else float(hi)
        return sum(lo_v <= s <= hi_v for s in self.zsets.get(key, {}).values())

    async def ping(self) -> bool:
        return True

    async def eval(self, script: str, numkeys: int, key: str, token: str) -> int:
        """Only the gateway's compare-and-delete of its effect lock."""
        if self.data.get(key) == token.encode():
            del self.data[key]
            return 1
        return 0

    async def aclose(self) -> None:
        return None

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self)

    def keys(self, pattern: str) -> list[str]:
        return [k for k in self.data if fnmatch.fnmatch(k, pattern)]


class FakePipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis, self.calls = redis, []  # type: ignore[var-annotated]

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self.calls.append((name, a, k))

    async def execute(self) -> list[Any]:
        return [await getattr(self.redis, n)(*a, **k) for n, a, k in self.calls]


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Message]] = []
        self.fail = False

    async def publish(self, items: list[tuple[topics.TopicSpec, str, Message]]) -> None:
        if self.fail:
            from aiokafka.errors import KafkaConnectionError

            raise KafkaConnectionError("broker gone")
        for spec, key, msg in items:
            codec.validate(msg)
            self.sent.append((spec.name, key, msg))

    def healthy(self) -> bool:
        return not self.fail

    def of(self, name: str) -> list[Message]:
        return [m for t, _, m in self.sent if t == name]


@pytest.fixture
async def api() -> AsyncIterator[tuple[httpx.AsyncClient, Recorder, FakeRedis]]:
    settings = load([f"ingest.tokens={TOKEN},other", "ingest.max_body_bytes=4096"])
    redis, pub = FakeRedis(), Recorder()
    state = IngestState(redis, "p", 3600, 3600)  # type: ignore[arg-type]
    app = create_app(settings, Deps(state, pub, Bytes()))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client, pub, redis


def body(cid: str = "c1", **extra: Any) -> dict[str, Any]:
    msgs = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "42"}]
    return {"id": cid, "messages": msgs, **extra}


async def test_auth_is_required_and_checked_before_the_body(api: Any) -> None:
    client, pub, _ = api
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        r = await client.post("/v1/trajectories", content=b"{not json", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "bearer token" in r.json()["error"]
    r = await client.post("/v1/feedback", json={}, headers={"Authorization": "Bearer other"})
    assert r.status_code == 422  # the second token works too
    assert (await client.get("/healthz")).json() == {"status": "ok", "redis": True, "kafka": True}
    assert pub.sent == []


async def test_bad_bodies_get_actionable_4xx_and_publish_nothing(api: Any) -> None:
    client, pub, redis = api
    big = body(
        messages=[{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "y"}]
    )
    r = await client.post("/v1/trajectories", json=big, headers=AUTH)
    assert r.status_code == 413 and "4096" in r.json()["error"]
    r = await client.post(
        "/v1/trajectories", content=b'{"id": ', headers={**AUTH, "content-type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = await client.post(
        "/v1/trajectories", content=b"id=1", headers={**AUTH, "content-type": "text/plain"}
    )
    assert r.status_code == 415 and "application/json" in r.json()["error"]
    r = await client.post("/v1/trajectories", json={"id": "x", "messages": "hi"}, headers=AUTH)
    assert r.status_code == 422 and any(p.startswith("messages:") for p in r.json()["problems"])
    r = await client.post("/v1/trajectories", json=body(extra_field=1), headers=AUTH)
    assert r.status_code == 422 and "extra_field" in r.json()["problems"][0]
    no_answer = body(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    r = await client.post("/v1/trajectories", json=no_answer, headers=AUTH)
    assert r.status_code == 422 and "no assistant message" in r.json()["problems"][0]
    r = await client.post("/v1/trajectories", json=body(feedback={"label": "meh"}), headers=AUTH)
    assert r.status_code == 422 and "known labels" in r.json()["problems"][0]
    assert pub.sent == [] and redis.keys("*") == []


def sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_trace_then_feedback_publishes_once_with_its_reward(api: Any) -> None:
    client, pub, redis = api
    duplicates = sample("rollstream_ingest_traces_total", status="duplicate")
    conflicts = sample("rollstream_ingest_refused_total", status="409")
    r = await client.post("/v1/trajectories", json=body(), headers=AUTH)
    assert r.status_code == 202 and r.json()["status"] == "awaiting_feedback"
    tid = r.json()["trajectory_id"]
    again = await client.post("/v1/trajectories", json=body(), headers=AUTH)
    assert again.status_code == 202 and again.json() == {**r.json(), "duplicate": True}
    other = await client.post("/v1/trajectories", json=body(task_id="x"), headers=AUTH)
    assert other.status_code == 409 and "already used" in other.json()["error"]
    assert pub.sent == []  # held until its feedback
    assert await pending_counts(redis, "p") == {"awaiting_feedback": 1, "expired_unrated": 0}

    fb = {"id": "f1", "trace_id": "c1", "thumbs": -1, "comment": "wrong tool"}
    r = await client.post("/v1/feedback", json=fb, headers=AUTH)
    assert r.status_code == 202 and r.json()["trajectory_id"] == tid
    assert (r.json()["reward"], r.json()["advantage"]) == (0.0, -1.0)
    dup = await client.post("/v1/feedback", json=fb, headers=AUTH)
    assert dup.status_code == 202 and dup.json()["duplicate"]
    second = await client.post(
        "/v1/feedback", json={**fb, "id": "f2", "trace_id": tid}, headers=AUTH
    )
    assert second.status_code == 409 and "one per trace" in second.json()["error"]
    unknown = await client.post(
        "/v1/feedback", json={**fb, "id": "f3", "trace_id": "nope"}, headers=AUTH
    )
    assert unknown.status_code == 404 and "trajectory_id" in unknown.json()["error"]

    [scored] = pub.of("rewards")
    [feedback] = pub.of("feedback")
    assert isinstance(scored, ScoredTrajectory) and isinstance(feedback, Feedback)
    assert scored.trajectory.id == tid and scored.reward == 0.0 and scored.advantage == -1.0
    assert feedback.trace_id == tid and feedback.comment == "wrong tool"
    assert [k for t, k, _ in pub.sent] == [tid, tid]
    assert await pending_counts(redis, "p") == {"awaiting_feedback": 0, "expired_unrated": 0}
    assert sample("rollstream_ingest_traces_total", status="duplicate") == duplicates + 1
    assert sample("rollstream_ingest_refused_total", status="409") == conflicts + 2


async def test_verifier_and_inline_feedback_publish_at_once(api: Any) -> None:
    client, pub, _ = api
    r = await client.post(
        "/v1/trajectories",
        json=body("v1", verifier={"name": "exact", "answer": "42"}),
        headers=AUTH,
    )
    assert r.status_code == 202 and r.json()["status"] == "scoring"
    [traj] = pub.of("trajectories")
    assert isinstance(traj, Trajectory) and traj.verifier.name == "exact"
    fb = await client.post(
        "/v1/feedback", json={"id": "f", "trace_id": "v1", "thumbs": 1}, headers=AUTH
    )
    assert fb.status_code == 409 and "verifier" in fb.json()["error"]

    r = await client.post(
        "/v1/trajectories", json=body("i1", feedback={"score": 0.75}), headers=AUTH
    )
    assert r.status_code == 202 and r.json()["status"] == "scored"
    [scored] = pub.of("rewards")
    assert scored.reward == 0.75 and scored.advantage == pytest.approx(0.5)  # type: ignore[attr-defined]
    fb = await client.post(
        "/v1/feedback", json={"id": "f4", "trace_id": "i1", "thumbs": 1}, headers=AUTH
    )
    assert fb.status_code == 409
    assert len(pub.sent) == 3  # trajectory; feedback + reward


async def test_a_request_that_died_half_way_is_redone_under_its_first_id(api: Any) -> None:
    client, pub, _ = api
    pub.fail = True
    r = await client.post(
        "/v1/trajectories",
        json=body("d1", verifier={"name": "exact", "answer": "42"}),
        headers=AUTH,
    )
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    health = await client.get("/healthz")
    assert health.status_code == 503 and health.json()["kafka"] is False
    pub.fail = False
    ok = await client.post(
        "/v1/trajectories",
        json=body("d1", verifier={"name": "exact", "answer": "42"}),
        headers=AUTH,
    )
    assert ok.status_code == 202 and not ok.json()["duplicate"]
    [traj] = pub.of("trajectories")
    assert traj.id == ok.json()["trajectory_id"] == traj.group_id  # type: ignore[attr-defined]


async def test_openapi_documents_the_api(api: Any) -> None:
    client, _, _ = api
    spec = (await client.get("/openapi.json")).json()
    assert {"/v1/trajectories", "/v1/feedback", "/healthz"} <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    post = spec["paths"]["/v1/trajectories"]["post"]
    assert {"202", "401", "409", "413", "422"} <= set(post["responses"])
    assert (await client.get("/docs")).status_code == 200
