"""The ingest gateway as a process (`python -m services.ingest`) on the real Kafka and
Redis, driven by a real HTTP client: refusals publish nothing, a duplicate id publishes
once, traces and their feedback reach the learner (its ledger says trained), and an API
fuzz against the gateway's own OpenAPI spec finds no server error."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas import topics
from schemas.envelope import Message
from schemas.learning import Feedback, LedgerEntry, LedgerStatus
from schemas.rollout import ScoredTrajectory, Trajectory
from services import audit
from services.settings import Settings

from .dispatch_helpers import ROOT, Service, service_env, with_prefix
from .ops_helpers import read_all, require_kafka_redis, wait_for

TOKEN = "itest-token-7f3a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(self, settings: Settings, tmp: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **env,
            "ROLLSTREAM__INGEST__TOKENS": f"{TOKEN},second-token",
            "ROLLSTREAM__INGEST__PORT": str(self.port),
            "ROLLSTREAM__INGEST__MAX_BODY_BYTES": str(64 * 1024),
            "ROLLSTREAM__INGEST__LOG_LEVEL": "warning",
            "OMP_NUM_THREADS": "1",
        }
        self.log = tmp / "gateway.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.ingest"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"gateway exited:\n{self.log.read_text()[-3000:]}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"gateway not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def gateway(settings: Settings, prefix: str, tmp_path: Path) -> Iterator[tuple[Gateway, Settings]]:
    require_kafka_redis(settings)
    run = with_prefix(settings, prefix)
    gw = Gateway(run, tmp_path, service_env(prefix))
    try:
        yield gw, run
    finally:
        gw.stop()
        _forget(run, prefix)


def _forget(settings: Settings, prefix: str) -> None:
    """Remove the test prefix's keys from Redis (idempotency records, held traces)."""
    import redis

    client = redis.Redis.from_url(settings.redis.endpoint)
    try:
        for key in client.scan_iter(f"rollstream:{prefix}:*", count=500):
            client.delete(key)
    finally:
        client.close()


def trace(cid: str, **extra: Any) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "You answer arithmetic."},
        {"role": "user", "content": f"case {cid}: what is 6*7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "calc", "arguments": '{"e":"6*7"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "42"},
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    return {"id": cid, "messages": messages, "tools": tools, **extra}


async def test_refusals_publish_nothing_and_duplicates_publish_once(gateway: Any) -> None:
    gw, run = gateway
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
        post = client.post
        assert (await post("/v1/trajectories", json=trace("a"))).status_code == 401
        wrong = {"Authorization": "Bearer not-the-token"}
        r = await post("/v1/trajectories", json=trace("a"), headers=wrong)
        assert r.status_code == 401 and "invalid bearer token" in r.json()["error"]
        huge = trace(
            "big",
            messages=[
                {"role": "user", "content": "x" * 70_000},
                {"role": "assistant", "content": "y"},
            ],
        )
        r = await post("/v1/trajectories", json=huge, headers=AUTH)
        assert r.status_code == 413 and "ingest.max_body_bytes" in r.json()["error"]
        r = await post(
            "/v1/trajectories",
            content=b'{"id": "m", "messages": [',
            headers={**AUTH, "content-type": "application/json"},
        )
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        r = await post(
            "/v1/trajectories", json={"id": "w", "messages": [{"role": "robot"}]}, headers=AUTH
        )
        assert r.status_code == 422 and any("role" in p for p in r.json()["problems"])
        r = await post(
            "/v1/feedback", json={"id": "f", "trace_id": "nope", "thumbs": 1}, headers=AUTH
        )
        assert r.status_code == 404
        for name in ("trajectories", "rewards", "feedback"):
            assert await read_all(run, topics.BY_NAME[name], Message) == []

        scored_now = trace("dup", feedback={"thumbs": 1})
        first = await post("/v1/trajectories", json=scored_now, headers=AUTH)
        again = await post("/v1/trajectories", json=scored_now, headers=AUTH)
        assert (first.status_code, again.status_code) == (202, 202)
        assert again.json() == {**first.json(), "duplicate": True}
        checked = trace("ver", verifier={"name": "exact", "answer": "42"})
        for _ in range(3):
            assert (await post("/v1/trajectories", json=checked, headers=AUTH)).status_code == 202
    rewards = await read_all(run, topics.REWARDS, ScoredTrajectory)
    assert [r.trajectory.id for r in rewards] == [first.json()["trajectory_id"]]
    assert len(await read_all(run, topics.FEEDBACK, Feedback)) == 1
    [traj] = await read_all(run, topics.TRAJECTORIES, Trajectory)
    assert traj.verifier.name == "exact" and traj.origin.value == "production"


async def test_traces_and_feedback_reach_the_learner(gateway: Any, tmp_path: Path) -> None:
    gw, run = gateway
    ids: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=30) as client:
        for i in range(6):
            r = await client.post("/v1/trajectories", json=trace(f"t{i}"))
            assert r.status_code == 202 and r.json()["status"] == "awaiting_feedback"
            ids[f"t{i}"] = r.json()["trajectory_id"]
        for i in range(6):  # by client id or by trajectory id; up, down, score, label
            judgement = [{"thumbs": 1}, {"thumbs": -1}, {"score": 0.9}, {"label": "incorrect"}][
                i % 4
            ]
            name = f"t{i}" if i % 2 else ids[f"t{i}"]
            r = await client.post(
                "/v1/feedback", json={"id": f"f{i}", "trace_id": name, **judgement}
            )
            assert r.status_code == 202 and r.json()["trajectory_id"] == ids[f"t{i}"]
        r = await client.post("/v1/trajectories", json=trace("inline", feedback={"thumbs": 1}))
        ids["inline"] = r.json()["trajectory_id"]
    rewards = await wait_for(run, topics.REWARDS, ScoredTrajectory, len(ids))
    assert {r.trajectory.id for r in rewards} == set(ids.values())
    assert {r.advantage for r in rewards} == {1.0, -1.0, 0.8}

    learner = Service(
        ["learner", "--idle-exit", "4", "--max-seconds", "150"],
        _learner_env(run, tmp_path),
        tmp_path / "learner.log",
    ).start()
    try:
        assert learner.proc is not None
        learner.proc.wait(180)
    finally:
        learner.stop()
    assert learner.proc.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
    ledger = await wait_for(run, topics.LEDGER, LedgerEntry, len(ids), timeout_s=30)
    fates = {e.trajectory_id: e for e in ledger}
    assert set(fates) == set(ids.values())
    assert all(e.status is LedgerStatus.TRAINED for e in fates.values()), fates

    report = await audit.audit(run, finished=True)
    assert report.ok and report.unaccounted == 0 and report.trained == len(ids)
    assert report.published_by_origin == {"production": len(ids)}


def _learner_env(run: Settings, tmp: Path) -> dict[str, str]:
    return service_env(
        run.topics.prefix,
        OMP_NUM_THREADS="1",
        ROLLSTREAM__LEARNER__TINY_DIM="32",
        ROLLSTREAM__LEARNER__TINY_LAYERS="1",
        ROLLSTREAM__LEARNER__TINY_HEADS="2",
        ROLLSTREAM__LEARNER__MAX_SEQ_LEN="512",
        ROLLSTREAM__LEARNER__BATCH_TOKENS="2048",
        ROLLSTREAM__LEARNER__MICRO_BATCH_TOKENS="2048",
        ROLLSTREAM__LEARNER__BATCH_MAX_WAIT_S="0.5",
        ROLLSTREAM__LEARNER__DEVICE="cpu",
        ROLLSTREAM__LEARNER__WEIGHT_STORE="dir",
        ROLLSTREAM__LEARNER__WEIGHT_DIR=str(tmp / "weights"),
        ROLLSTREAM__LEARNER__CHECKPOINT_DIR=str(tmp / "ckpt"),
        ROLLSTREAM__LEARNER__TENSORBOARD="false",
    )


def test_api_fuzz_finds_no_server_error(gateway: Any) -> None:
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    gw, _ = gateway
    schema = schemathesis.openapi.from_url(f"{gw.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} == {"/v1/trajectories", "/v1/feedback", "/healthz"}
    statuses: dict[int, int] = {}
    for op in operations:
        modes = [schemathesis.GenerationMode.POSITIVE]
        if op.method.upper() == "POST":  # a GET without parameters has no invalid form
            modes.append(schemathesis.GenerationMode.NEGATIVE)
        for mode in modes:

            @settings(
                max_examples=40,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def fuzz(case: Any) -> None:
                response = case.call(base_url=gw.url, headers=AUTH, timeout=30)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                assert response.status_code < 500, (case.body, response.text[:500])

            fuzz()
    assert sum(statuses.values()) >= 100 and all(code < 500 for code in statuses)
    # schema-valid requests reached the handlers (404: feedback on an unknown trace)
    assert {404, 422} <= set(statuses), statuses
    print(f"API fuzz: {sum(statuses.values())} requests, statuses {sorted(statuses.items())}")


async def test_concurrent_requests_with_one_id_publish_once(gateway: Any) -> None:
    """Many clients send the same id at the same moment (real concurrent HTTP requests):
    one effect, every answer the same trajectory id, the rest marked duplicate."""
    import asyncio

    gw, run = gateway
    bodies = {
        "verified": trace("c-ver", verifier={"name": "exact", "answer": "42"}),
        "scored": trace("c-fb", feedback={"thumbs": 1}),
        "held": trace("c-held"),
    }
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        for body in bodies.values():
            answers = await asyncio.gather(
                *[client.post("/v1/trajectories", json=body, headers=AUTH) for _ in range(12)]
            )
            assert {a.status_code for a in answers} == {202}, [a.text for a in answers]
            assert len({a.json()["trajectory_id"] for a in answers}) == 1
            assert sum(not a.json().get("duplicate") for a in answers) == 1
        held = answers[0].json()["trajectory_id"]
        rating = {"id": "c-rate", "trace_id": held, "thumbs": 1}
        answers = await asyncio.gather(
            *[client.post("/v1/feedback", json=rating, headers=AUTH) for _ in range(12)]
        )
        assert {a.status_code for a in answers} == {202}, [a.text for a in answers]
        assert sum(not a.json().get("duplicate") for a in answers) == 1
    assert len(await read_all(run, topics.TRAJECTORIES, Trajectory)) == 1
    rewards = await read_all(run, topics.REWARDS, ScoredTrajectory)
    assert len(rewards) == len({r.trajectory.id for r in rewards}) == 2  # inline and rated
    assert len(await read_all(run, topics.FEEDBACK, Feedback)) == 2
