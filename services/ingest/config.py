"""Settings section owned by the ingest gateway: `[ingest]`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, model_validator

from services.config import Section


class IngestSettings(Section):
    """The ingest gateway for production agent traces and feedback (services/ingest,
    `rollstream ingest`, DESIGN.md section 8)."""

    host: str = "127.0.0.1"
    """Address the gateway listens on. Keep it on loopback and put a TLS-terminating proxy
    in front of it for outside clients."""
    port: int = Field(default=8700, ge=1, le=65535)
    """TCP port of the gateway."""
    tokens: SecretStr | None = None
    """Bearer tokens the gateway accepts, comma-separated. Prefer the environment
    (ROLLSTREAM__INGEST__TOKENS) or `tokens_file` to a TOML file. With neither set the
    gateway refuses to start."""
    tokens_file: Path | None = None
    """A file of bearer tokens, one per line (blank lines and `#` comments ignored); its
    tokens are accepted as well as those of `tokens`."""
    max_body_bytes: int = Field(default=4 << 20, ge=1024, le=64 << 20)
    """Largest request body; bigger ones get 413 before they are parsed."""
    max_messages: int = Field(default=512, ge=1, le=100_000)
    """Most chat messages in one trace."""
    max_tokens: int | None = Field(default=None, ge=2)
    """Traces longer than this many tokens (prompt + completion) get 422. Unset: no
    limit here; the learner drops samples longer than its context (ledger: too long)."""
    task_id: str = Field(default="production", min_length=1, max_length=256)
    """Task id of traces that name none (identifies the deployment in metrics and audit)."""
    idempotency_ttl_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a client-supplied request id is remembered (a retry within this window is
    answered from the first request and publishes nothing)."""
    feedback_window_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """How long a trace without feedback waits for it (in Redis); after that feedback on it
    gets 404 and the trace is counted as expired unrated."""
    score_min: float = 0.0
    """Lowest feedback `score` accepted; it maps to reward 0."""
    score_max: float = 1.0
    """Highest feedback `score` accepted; it maps to reward 1."""
    label_rewards: str = "correct=1,helpful=1,resolved=1,incorrect=0,unhelpful=0,harmful=0"
    """Reward of each feedback `label`, as `label=reward` pairs, comma-separated (rewards
    in [0, 1]). Feedback with only an unknown label gets 422."""
    baseline: float = Field(default=0.5, ge=0, le=1)
    """Reward of a neutral judgement: advantage = (reward - baseline) / advantage_scale."""
    advantage_scale: float = Field(default=0.5, gt=0)
    """Divisor of the advantage (0.5 maps rewards 0..1 to advantages -1..1)."""
    log_level: str = "info"
    """Log level of the gateway (uvicorn's access log included)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics of the gateway on 127.0.0.1:PORT (0: off)."""

    @model_validator(mode="after")
    def _check(self) -> IngestSettings:
        if self.score_max <= self.score_min:
            raise ValueError("ingest.score_max must exceed ingest.score_min")
        self.label_map()  # raises on a malformed pair
        return self

    def label_map(self) -> dict[str, float]:
        """`label_rewards` as a dict (ValueError on a malformed pair)."""
        out: dict[str, float] = {}
        for pair in filter(None, (p.strip() for p in self.label_rewards.split(","))):
            label, sep, value = pair.partition("=")
            try:
                reward = float(value)
            except ValueError:
                reward = float("nan")
            if not sep or not label.strip() or not 0.0 <= reward <= 1.0:
                raise ValueError(f"ingest.label_rewards: {pair!r} is not label=reward in [0, 1]")
            out[label.strip()] = reward
        return out

    def token_list(self) -> list[str]:
        """Every accepted bearer token (from `tokens` and `tokens_file`)."""
        found = [] if self.tokens is None else self.tokens.get_secret_value().split(",")
        if self.tokens_file is not None:
            for line in self.tokens_file.read_text().splitlines():
                if not line.lstrip().startswith("#"):
                    found.append(line)
        return [t.strip() for t in found if t.strip()]
