"""The ingest gateway's HTTP API (FastAPI). See services/ingest/__init__.py for the design.

`create_app(settings)` builds the app; its dependencies (Redis state, Kafka publisher,
tokenizer) are made on startup, or passed in (`Deps`) by tests.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException

from services.ingest import gate, metrics
from services.ingest.convert import Invalid
from services.ingest.models import (
    Accepted,
    FeedbackAccepted,
    FeedbackIn,
    Health,
    Problem,
    TraceIn,
)
from services.ingest.routes import ApiError, Handlers

if TYPE_CHECKING:
    from services.ingest.convert import Tokenizer
    from services.ingest.publish import Publisher
    from services.ingest.state import IngestState
    from services.settings import Settings

log = logging.getLogger("rollstream.ingest")
DESCRIPTION = """Production agent traces (OpenAI chat format, with tools and tool calls) and
feedback on them, into rollstream's training stream. Every /v1 call needs
`Authorization: Bearer <token>`. Requests carry your own `id`: a retry with the same id is
answered as the first time and publishes nothing new."""


@dataclass
class Deps:
    state: IngestState
    publisher: Publisher
    tokenizer: Tokenizer | None


async def _start(settings: Settings) -> tuple[Deps, Any]:
    """Real dependencies; the second value closes them."""
    from services import topics as topic_admin
    from services.ingest import tokenizer
    from services.ingest.publish import KafkaPublisher
    from services.ingest.state import IngestState

    cfg = settings.ingest
    tok = tokenizer.load(settings)
    await topic_admin.ensure(settings)
    state = IngestState.from_url(
        settings.redis.endpoint,
        settings.topics.prefix,
        cfg.idempotency_ttl_s,
        cfg.feedback_window_s,
    )
    publisher = KafkaPublisher(settings)
    await publisher.start()

    async def close() -> None:
        await publisher.stop()
        await state.aclose()

    return Deps(state, publisher, tok), close


def create_app(settings: Settings, deps: Deps | None = None) -> FastAPI:
    tokens = settings.ingest.token_list()
    if not tokens:
        raise ValueError(
            "the gateway has no bearer tokens: set ingest.tokens (ROLLSTREAM__INGEST__TOKENS)"
            " or ingest.tokens_file"
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        close = None
        ready = deps
        if ready is None:
            ready, close = await _start(settings)
        app.state.handlers = Handlers(settings, ready.state, ready.publisher, ready.tokenizer)
        log.info("ingest gateway for prefix %s ready", settings.topics.prefix)
        try:
            yield
        finally:
            if close is not None:
                await close()

    app = FastAPI(
        title="rollstream ingest gateway",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses={
            401: {"model": Problem, "description": "missing or invalid bearer token"},
            413: {"model": Problem, "description": "body over ingest.max_body_bytes"},
            415: {"model": Problem, "description": "body is not application/json"},
            400: {"model": Problem, "description": "body is not valid JSON"},
            422: {"model": Problem, "description": "body does not follow the schema"},
            503: {"model": Problem, "description": "Kafka or Redis unavailable: retry"},
        },
    )
    app.add_middleware(
        gate.Gate, tokens=gate.digests(tokens), max_body_bytes=settings.ingest.max_body_bytes
    )
    _errors(app)
    _routes(app)
    return app


_bearer = HTTPBearer(auto_error=False, description="One of the gateway's ingest.tokens.")


def _routes(app: FastAPI) -> None:
    auth = [Security(_bearer)]  # documents the scheme; gate.Gate enforces it first

    @app.post(
        "/v1/trajectories",
        status_code=202,
        response_model=Accepted,
        dependencies=auth,
        responses={409: {"model": Problem, "description": "id reused for another body"}},
        summary="Submit a production agent trace",
    )
    async def post_trajectory(body: TraceIn, request: Request) -> Accepted:
        """Validated, tokenised when it has no token ids, and published with
        origin=production: at once when it names a verifier or carries feedback, else
        when its feedback arrives (POST /v1/feedback)."""
        handlers: Handlers = request.app.state.handlers
        return await handlers.trajectory(body, _fingerprint(body))

    @app.post(
        "/v1/feedback",
        status_code=202,
        response_model=FeedbackAccepted,
        dependencies=auth,
        responses={
            404: {"model": Problem, "description": "no such trace awaiting feedback"},
            409: {"model": Problem, "description": "trace already judged, or id reused"},
        },
        summary="Judge an earlier trace",
    )
    async def post_feedback(body: FeedbackIn, request: Request) -> FeedbackAccepted:
        """Joins a score, label or thumbs to the trace and publishes it with its reward
        (and the feedback on the `feedback` topic). One feedback per trace."""
        handlers: Handlers = request.app.state.handlers
        return await handlers.feedback(body, _fingerprint(body))

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz(request: Request) -> Any:
        """Liveness and readiness: Redis answers and the Kafka producer is connected."""
        h = request.app.state.handlers
        redis_ok = await h.state.ping()
        kafka_ok = h.publisher.healthy()
        ok = redis_ok and kafka_ok
        body = Health(status="ok" if ok else "degraded", redis=redis_ok, kafka=kafka_ok)
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


def _fingerprint(body: TraceIn | FeedbackIn) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _problem(status: int, error: str, problems: list[str] | None = None, **kw: Any) -> Any:
    metrics.REFUSED.labels(str(status)).inc()
    body = Problem(error=error, problems=problems or []).model_dump()
    return JSONResponse(body, status_code=status, **kw)


def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Any:
        return _problem(exc.status, exc.error, exc.problems, headers=exc.headers)

    @app.exception_handler(Invalid)
    async def invalid(_: Request, exc: Invalid) -> Any:
        return _problem(422, "the request is not a usable trace or feedback", exc.problems)

    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> Any:
        errors = list(exc.errors())
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            ctx = bad_json[0].get("ctx") or {}
            why = ctx.get("error", "malformed")
            return _problem(400, f"the body is not valid JSON: {why}")
        return _problem(422, "the body does not follow the schema", _lines(errors))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Any:
        return _problem(exc.status_code, str(exc.detail), headers=exc.headers)


def _lines(errors: list[Any]) -> list[str]:
    out = []
    for e in errors[:50]:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        out.append(f"{where}: {e.get('msg', 'invalid')}")
    return out
