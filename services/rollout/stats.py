"""The demo's running numbers, pure: fed with what the topics carry, read as rows.

Reward and staleness are averaged over the last `window_s` seconds of rewards (by arrival
at the monitor); throughput is a count over the same window. Staleness of a reward is the
newest announced policy version when it is scored minus the version that sampled it; the
outstanding count (published - consumed by the learner) is what pacing bounds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

from services.rollout.sampler import group_flat_kind


@dataclass
class Row:
    """One snapshot, for the live table, metrics.jsonl and the plot."""

    t: float
    """Seconds since the pipeline started."""
    trajectories: int
    scored: int
    trained: int
    dropped: int
    masked: int
    dead_letters: int
    version: int
    samples_consumed: int
    outstanding: int
    traj_per_s: float
    scored_per_s: float
    reward: float | None
    """Mean reward of the rewards of the last window (None: none yet)."""
    staleness: float | None
    suite_reward: dict[str, float] = field(default_factory=dict)
    groups: int = 0
    """Groups whose every member was scored."""
    flat_groups: float | None = None
    """Share of those groups whose rewards are all equal (no learning signal)."""
    all_failed: float | None = None
    """Share of those groups of which no member passed (rewards all equal): tasks beyond
    the policy for now."""
    all_passed: float | None = None
    """Share of those groups of which every member passed: tasks it has solved."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class RunStats:
    window_s: float = 20.0
    trajectories: int = 0
    scored: int = 0
    ledger: dict[str, str] = field(default_factory=dict)
    """trajectory id -> status (trained | dropped | masked)."""
    statuses: dict[str, int] = field(default_factory=dict)
    """Ledger entries per status."""
    drop_reasons: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    version: int = -1
    samples_consumed: int = 0
    per_version: dict[int, list[float]] = field(default_factory=dict)
    """policy version that sampled -> [reward sum, count]."""
    per_suite: dict[str, list[float]] = field(default_factory=dict)
    """suite -> [reward sum, count, passed]."""
    t0: float | None = None
    """Wall-clock start of the run (Unix seconds), for `per_minute`."""
    per_minute: dict[int, list[float]] = field(default_factory=dict)
    """minute since t0 -> [reward sum, count] of the rewards scored in it."""
    _traj_times: deque[float] = field(default_factory=deque)
    _rewards: deque[tuple[float, str, float, int]] = field(default_factory=deque)
    """(arrival, suite, reward, staleness) of unmasked rewards in the window."""
    _scored_times: deque[float] = field(default_factory=deque)
    _open_groups: dict[str, list[tuple[float | None, bool]]] = field(default_factory=dict)
    """group id -> (reward, passed) so far (reward None: masked), until every member is
    scored."""
    groups_done: int = 0
    groups_flat: int = 0
    """Complete groups whose unmasked rewards are all equal."""
    groups_failed: int = 0
    """Of those, the groups of which no unmasked member passed (sampler.flat_kind)."""
    groups_passed: int = 0
    """Of those, the groups of which every unmasked member passed."""

    def on_trajectory(self, now: float) -> None:
        self.trajectories += 1
        self._traj_times.append(now)

    def on_reward(
        self, now: float, suite: str, reward: float, version: int, masked: bool, passed: bool,
        group: tuple[str, int] | None = None,
    ) -> None:  # fmt: skip
        """One scored trajectory; `group` = (group id, group size) counts flat groups."""
        self.scored += 1
        self._scored_times.append(now)
        if group is not None:
            self._on_member(group[0], group[1], (None if masked else reward, passed))
        if masked:
            return
        stale = max(0, self.version - version) if version >= 0 else 0
        self._rewards.append((now, suite, reward, stale))
        v = self.per_version.setdefault(version, [0.0, 0])
        v[0] += reward
        v[1] += 1
        if self.t0 is not None:
            m = self.per_minute.setdefault(int((now - self.t0) // 60), [0.0, 0])
            m[0] += reward
            m[1] += 1
        s = self.per_suite.setdefault(suite, [0.0, 0, 0])
        s[0] += reward
        s[1] += 1
        s[2] += passed

    def _on_member(self, group_id: str, size: int, member: tuple[float | None, bool]) -> None:
        members = self._open_groups.setdefault(group_id, [])
        members.append(member)
        if len(members) < size:
            return
        del self._open_groups[group_id]
        kind = group_flat_kind(members)
        self.groups_done += 1
        self.groups_flat += kind is not None
        self.groups_failed += kind == "failed"
        self.groups_passed += kind == "passed"

    def on_weights(self, version: int, samples_consumed: int) -> None:
        self.version = max(self.version, version)
        self.samples_consumed = max(self.samples_consumed, samples_consumed)

    def on_ledger(self, trajectory_id: str, status: str, reason: str) -> None:
        if trajectory_id in self.ledger:
            return  # a redelivered entry (same id): counted once
        self.ledger[trajectory_id] = status
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "trained":
            key = f"{status}: {reason.split(':')[0]}"
            self.drop_reasons[key] = self.drop_reasons.get(key, 0) + 1

    def on_dead_letter(self) -> None:
        self.dead_letters += 1

    def count(self, status: str) -> int:
        return self.statuses.get(status, 0)

    def row(self, now: float, t: float) -> Row:
        cutoff = now - self.window_s
        for q in (self._traj_times, self._scored_times):
            while q and q[0] < cutoff:
                q.popleft()
        while self._rewards and self._rewards[0][0] < cutoff:
            self._rewards.popleft()
        rewards = list(self._rewards)
        suites: dict[str, list[float]] = {}
        for _, suite, r, _ in rewards:
            suites.setdefault(suite, []).append(r)
        span = max(1e-9, min(self.window_s, t)) if t > 0 else 1.0
        return Row(
            t=round(t, 2),
            trajectories=self.trajectories,
            scored=self.scored,
            trained=self.count("trained"),
            dropped=self.count("dropped"),
            masked=self.count("masked"),
            dead_letters=self.dead_letters,
            version=self.version,
            samples_consumed=self.samples_consumed,
            outstanding=self.trajectories - self.samples_consumed,
            traj_per_s=len(self._traj_times) / span,
            scored_per_s=len(self._scored_times) / span,
            reward=_mean([r for _, _, r, _ in rewards]),
            staleness=_mean([float(s) for *_, s in rewards]),
            suite_reward={k: sum(v) / len(v) for k, v in sorted(suites.items())},
            groups=self.groups_done,
            flat_groups=self._share(self.groups_flat),
            all_failed=self._share(self.groups_failed),
            all_passed=self._share(self.groups_passed),
        )

    def _share(self, groups: int) -> float | None:
        """`groups` over the complete groups (None: none complete yet)."""
        return groups / self.groups_done if self.groups_done else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
