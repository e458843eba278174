"""Feeder logic: built-in suites and their splits, suite sampling, adaptive weights, and
task admission (parsing, static checks, reference verdicts)."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter, deque

import pytest

from sandbox_workers.verifiers import default_registry
from schemas.rollout import Task
from schemas.sandbox import Outcome, VerifierSpec
from services import suites
from services.rollout import admission
from services.rollout.sampler import (
    GroupTally,
    SuiteSampler,
    adapt_multipliers,
    flat_kind,
    group_flat_kind,
    informative,
    observe_group,
    task_multiplier,
)

REGISTRY = default_registry()


def task(task_id: str, suite: str = "s") -> Task:
    spec = VerifierSpec(name="exact", answer="1", needs_sandbox=False)
    return Task(task_id=task_id, suite=suite, prompt="p", verifier=spec, group_size=2)


# -- suites -----------------------------------------------------------------------------


HASH_SPLIT = [n for n in suites.names() if n not in ("code", "humaneval")]
"""Suites split by a hash of the task id (`code` and `humaneval` fix their splits in their
data: tests/unit/test_code_suite.py)."""


@pytest.mark.parametrize("name", HASH_SPLIT)
def test_suite_splits_are_disjoint_stable_and_cover_every_task(name: str) -> None:
    suite = suites.get(name)
    ids = {split: [t.task_id for t in suite.tasks(split)] for split in suites.SPLITS}
    all_ids = [i for split in suites.SPLITS for i in ids[split]]
    assert len(all_ids) == len(set(all_ids))
    assert all(len(v) > 0 for v in ids.values())
    assert ids == {s: [t.task_id for t in suites.get(name).tasks(s)] for s in suites.SPLITS}
    for split, members in ids.items():
        assert all(suites.split_of(i) == split for i in members)


def test_split_of_is_a_pure_function_of_the_id() -> None:
    assert suites.split_of("arith/57+8") == suites.split_of("arith/57+8")
    counts = Counter(suites.split_of(f"x/{i}") for i in range(5000))
    assert 0.15 < counts["heldout"] / 5000 < 0.25
    assert 0.55 < counts["train"] / 5000 < 0.65


def test_arith_references_are_right_and_pass_the_in_process_verifier() -> None:
    import asyncio

    suite = suites.get("arith", group_size=4)
    tasks = suite.tasks("train") + suite.tasks("heldout")
    plugin, _ = REGISTRY.lookup(tasks[0].verifier)
    for t in tasks[:50]:
        a, b = t.prompt.removesuffix("=").split("+")  # type: ignore[union-attr]
        assert t.reference == str(int(a) + int(b)) and t.group_size == 4
        verdict = asyncio.run(plugin.judge(suite.example(t), t.verifier))  # type: ignore[union-attr]
        assert verdict.outcome == Outcome.PASSED
        assert admission.static_problem(t, REGISTRY) is None


def test_pyfunc_references_pass_their_own_tests_and_wrong_code_fails() -> None:
    suite = suites.get("pyfunc")
    tasks = [t for s in suites.SPLITS for t in suite.tasks(s)]
    assert {t.metadata["op"] for t in tasks} == {"add", "sub", "mul", "mod", "div", "max", "min"}
    for t in tasks:
        assert admission.static_problem(t, REGISTRY) is None
        assert _run_tests(suite.example(t), t.verifier.tests or "") == (4, 4)
    add3 = next(t for t in tasks if t.task_id == "pyfunc/add/3")
    assert _run_tests("def f(x): return x+4", add3.verifier.tests or "") == (0, 4)


def _run_tests(solution: str, tests: str) -> tuple[int, int]:
    """Our own reference code and tests, run here (the sandbox runs the model's)."""
    module = types.ModuleType("solution")
    exec(compile(solution, "solution.py", "exec"), module.__dict__)
    sys.modules["solution"] = module
    try:
        scope: dict[str, object] = {}
        exec(compile(tests, "tests.py", "exec"), scope)
    finally:
        del sys.modules["solution"]
    passed = total = 0
    for name, fn in scope.items():
        if name.startswith("test_") and callable(fn):
            total += 1
            try:
                fn()
                passed += 1
            except AssertionError:
                pass
    return passed, total


def test_unknown_suite_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="arith"):
        suites.get("nope")


# -- sampling ---------------------------------------------------------------------------


def test_sampler_follows_weights_and_cycles_every_task_per_epoch() -> None:
    sampler = SuiteSampler({"a": 3.0, "b": 1.0}, seed=7)
    sampler.add_all([task(f"a{i}", "a") for i in range(5)])
    sampler.add_all([task(f"b{i}", "b") for i in range(5)])
    picks = [sampler.next() for _ in range(4000)]
    share = sum(t.suite == "a" for t in picks if t) / len(picks)
    assert 0.72 < share < 0.78
    first_a = [t.task_id for t in picks if t and t.suite == "a"][:5]
    assert sorted(first_a) == [f"a{i}" for i in range(5)]  # one epoch: each once


def test_sampler_is_deterministic_for_a_seed_and_skips_empty_or_zero_suites() -> None:
    def draw(seed: int) -> list[str]:
        s = SuiteSampler({"a": 1.0, "b": 0.0, "c": 1.0}, seed=seed)
        s.add_all([task("a0", "a"), task("b0", "b")])
        return [t.task_id for t in (s.next() for _ in range(20)) if t]

    assert draw(1) == draw(1) == ["a0"] * 20
    assert SuiteSampler({"a": 1.0}).next() is None
    with pytest.raises(ValueError, match=">= 0"):
        SuiteSampler({"a": -1.0})


def test_unlisted_suites_get_the_default_weight_and_multipliers_scale() -> None:
    s = SuiteSampler({"a": 2.0}, default_weight=1.0)
    s.add_all([task("a0", "a"), task("z0", "z")])
    s.multipliers = {"a": 0.25}
    assert s.active() == {"a": 0.5, "z": 1.0}


def test_paused_suites_are_skipped_until_resumed() -> None:
    s = SuiteSampler({"a": 1.0, "b": 1.0}, seed=3)
    s.add_all([task("a0", "a"), task("b0", "b")])
    s.paused = {"b"}
    assert {t.suite for t in (s.next() for _ in range(50)) if t} == {"a"}
    s.paused = {"a", "b"}
    assert s.next() is None
    s.paused = set()
    assert {t.suite for t in (s.next() for _ in range(50)) if t} == {"a", "b"}


def test_group_tally_reports_a_group_once_complete() -> None:
    tally = GroupTally()
    assert tally.add("g1", "s", 2, 1.0) is None
    assert tally.add("g1", "s", 2, 0.0) == [1.0, 0.0]
    assert tally.add("g2", "s", 2, 1.0) is None
    assert tally.add("g2", "s", 2, 1.0) == [1.0, 1.0]
    assert tally.open == {}
    assert informative([0.0, 0.5]) and not informative([1.0, 1.0]) and not informative([])


def test_flat_kind_says_why_a_group_teaches_nothing() -> None:
    assert flat_kind([1.0, 0.0], [True, False]) is None
    assert flat_kind([0.0, 0.0], [False, False]) == "failed"
    assert flat_kind([1.0, 1.0], [True, True]) == "passed"
    assert flat_kind([0.5, 0.5], [False, False]) == "failed"  # equal partial credit, none passed
    assert flat_kind([0.5, 0.5], [True, False]) == "equal"
    assert flat_kind([], []) is None
    assert group_flat_kind([(0.0, False), (None, True), (0.0, False)]) == "failed"  # masked out
    assert group_flat_kind([(None, False)] * 2) == "equal"


def test_adapt_multipliers_lower_suites_that_teach_nothing() -> None:
    history = {"solved": deque([False] * 40), "mixed": deque([True] * 30 + [False] * 10)}
    m = adapt_multipliers(history, floor=0.2)
    assert m["solved"] == 0.2
    assert m["mixed"] == pytest.approx(31 / 42)


def test_tasks_without_learning_signal_are_skipped_more() -> None:
    assert task_multiplier(1.0, False, 0.2) == 0.5 and task_multiplier(0.3, False, 0.2) == 0.2
    assert task_multiplier(0.2, True, 0.2) == 1.0
    s = SuiteSampler({"a": 1.0}, seed=5)
    s.add_all([task(f"a{i}", "a") for i in range(4)])
    s.task_multipliers = {"a0": 0.2, "a1": 0.2}
    picks = Counter(t.task_id for t in (s.next() for _ in range(4000)) if t)
    assert picks["a2"] > 2.5 * picks["a0"] and picks["a3"] > 2.5 * picks["a1"]
    assert picks["a0"] > 0 and picks["a1"] > 0  # still sampled, less often
    s.task_multipliers = {f"a{i}": 0.2 for i in range(4)}
    assert s.next() is not None  # all of them skipped once: one is taken anyway


def test_observe_group_moves_task_and_suite_chances() -> None:
    s = SuiteSampler({"a": 1.0, "b": 1.0})
    history: dict[str, deque[bool]] = {}
    for _ in range(3):
        observe_group(s, history, ("a0", "a", False), floor=0.2)
    observe_group(s, history, ("b0", "b", True), floor=0.2)
    assert s.task_multipliers == {"a0": 0.2, "b0": 1.0}
    assert s.multipliers == {"a": 0.2, "b": pytest.approx(2 / 3)}
    observe_group(s, history, ("a0", "a", True), floor=0.2)
    assert s.task_multipliers["a0"] == 1.0 and list(history["a"]) == [False] * 3 + [True]
    for _ in range(60):
        observe_group(s, history, ("a1", "a", True), floor=0.2)
    assert len(history["a"]) == 50 and s.multipliers["a"] == pytest.approx(51 / 52)
    tasks_only = SuiteSampler({"a": 1.0})
    observe_group(tasks_only, {}, ("a0", "a", False), floor=0.2, suites=False)
    assert tasks_only.task_multipliers == {"a0": 0.5} and tasks_only.multipliers == {}


# -- admission --------------------------------------------------------------------------


def line(**fields: object) -> str:
    base: dict[str, object] = {
        "task_id": "t1", "suite": "mine", "prompt": "2+2=",
        "verifier": {"name": "math_answer", "answer": "4"}, "reference": "4",
    }  # fmt: skip
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def test_parse_line_fills_defaults_and_infers_needs_sandbox() -> None:
    t = admission.parse_line(line(), group_size=6, registry=REGISTRY)
    assert t.group_size == 6 and t.verifier.needs_sandbox is False
    spec = {"name": "python_tests", "tests": "from solution import f\n"}
    t2 = admission.parse_line(line(verifier=spec), group_size=6, registry=REGISTRY)
    assert t2.verifier.needs_sandbox is True


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (line(group_size="many"), "group_size"),
        (line(prompt=None), "exactly one of `prompt` and `messages`"),
        (line(verifier={"name": "telepathy"}), "unknown verifier 'telepathy'"),
        (line(verifier={"name": "math_answer"}), "no reference answer"),
        (line(verifier={"name": "exact", "answer": "4", "needs_sandbox": True}), "in-process"),
        (line(prompt="   "), "empty prompt"),
        (line(max_turns=3), "needs a sandboxed verifier"),
    ],
)
def test_malformed_tasks_are_rejected_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(admission.Rejected, match=reason):
        admission.parse_line(text, group_size=4, registry=REGISTRY)


def test_task_lines_skip_blanks_and_comments_and_keep_line_numbers() -> None:
    assert list(admission.task_lines('# c\n\n{}\n  # d\n{"a": 1}\n')) == [
        (3, "{}"),
        (5, '{"a": 1}'),
    ]


def test_reference_verdicts() -> None:
    assert admission.reference_problem(Outcome.PASSED, 4, 4, "") is None
    why = admission.reference_problem(Outcome.FAILED, 3, 4, "test_2: assert 5 == 6")
    assert why is not None and "3/4" in why and "test_2" in why
    assert "compile_error" in (admission.reference_problem(Outcome.COMPILE_ERROR, 0, 0, "") or "")
