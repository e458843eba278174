"""The `code` and `humaneval` suites: splits fixed by the data, every reference passes its
public and hidden tests, hidden tests discriminate (wrong code fails them), no hidden test
text reaches a prompt or the feedback tests, and the feeder never trains on an
evaluation-only suite."""

from __future__ import annotations

import re
import sys
import types
from collections import Counter
from pathlib import Path

import pytest

from sandbox_workers.verifiers import default_registry
from schemas.rollout import Task
from services import suites
from services.rollout import admission
from services.rollout.feeder import Feeder
from services.settings import Settings
from services.suites import code as code_suite
from streams.groups import extract_code

REGISTRY = default_registry()
CODE = suites.get("code")
TRAIN, HELDOUT = CODE.tasks("train"), CODE.tasks("heldout")
EVAL = suites.get("humaneval")
HUMANEVAL = EVAL.tasks("heldout")


def run_tests(solution: str, tests: str) -> tuple[int, int]:
    """(passed, total) of a python_tests file against `solution`, in this process (our own
    references and tests only; the model's code runs in the sandbox)."""
    module = types.ModuleType("solution")
    sys.modules["solution"] = module
    try:
        exec(compile(solution, "solution.py", "exec"), module.__dict__)
        scope: dict[str, object] = {"__name__": "test_solution"}
        exec(compile(tests, "test_solution.py", "exec"), scope)
    finally:
        del sys.modules["solution"]
    passed = total = 0
    for name, fn in scope.items():
        if name.startswith("test_") and callable(fn):
            total += 1
            try:
                fn()
                passed += 1
            except Exception:
                pass
    return passed, total


def asserts(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("assert")]


# -- the code suite -------------------------------------------------------------------------


def test_code_splits_come_from_the_data_and_are_big_enough() -> None:
    assert len(TRAIN) >= 200 and len(HELDOUT) >= 60
    assert CODE.tasks("warmup") == []
    ids = [t.task_id for t in TRAIN + HELDOUT]
    assert len(ids) == len(set(ids)) == len(code_suite.records())
    assert {t.metadata["split"] for t in TRAIN} == {"train"}
    assert {t.metadata["split"] for t in HELDOUT} == {"heldout"}
    difficulty = Counter(t.metadata["difficulty"] for t in TRAIN + HELDOUT)
    assert set(difficulty) == {"easy", "medium", "hard"}
    assert difficulty["easy"] > difficulty["medium"] > difficulty["hard"] > 0


def test_heldout_functions_are_never_trained_on() -> None:
    train_names = {t.metadata["entry_point"] for t in TRAIN}
    held_names = {t.metadata["entry_point"] for t in HELDOUT}
    assert not train_names & held_names
    assert all("family" not in t.metadata for t in HELDOUT)  # families are wholly in train
    # no held-out function is a training one with a different constant or letter
    stem = re.compile(r"_(\d+|[a-z])$")
    assert not {stem.sub("", n) for n in held_names} & {stem.sub("", n) for n in train_names}


@pytest.mark.parametrize("task", TRAIN + HELDOUT, ids=lambda t: t.task_id)
def test_reference_passes_public_and_hidden_tests(task: Task) -> None:
    spec = task.verifier
    assert admission.static_problem(task, REGISTRY) is None
    assert spec.name == "python_tests" and spec.tests and spec.feedback_tests
    solution = extract_code(CODE.example(task))
    hidden, public = run_tests(solution, spec.tests), run_tests(solution, spec.feedback_tests)
    assert hidden[0] == hidden[1] >= 4
    assert public[0] == public[1] >= 2
    name = task.metadata["entry_point"]
    assert f"from solution import {name}" in spec.tests
    assert f"def {name}(" in (task.prompt or "") and "```python" in (task.prompt or "")


@pytest.mark.parametrize(
    "wrong",
    [
        "def {name}(*args, **kwargs):\n    return None",
        "def {name}(*args, **kwargs):\n    return args[0]",
        "def {name}(*args, **kwargs):\n    raise NotImplementedError",
    ],
)
def test_hidden_tests_reject_wrong_solutions(wrong: str) -> None:
    for task in TRAIN + HELDOUT:
        name = task.metadata["entry_point"]
        passed, total = run_tests(wrong.format(name=name), task.verifier.tests or "")
        assert passed < total, f"{task.task_id}: a wrong solution passes every hidden test"


def test_hidden_tests_tell_family_members_apart() -> None:
    """The sibling of a family task (same function, another constant) fails its tests."""
    by_family: dict[str, list[Task]] = {}
    for t in TRAIN:
        by_family.setdefault(t.metadata.get("family", ""), []).append(t)
    by_family.pop("", None)
    assert len(by_family) >= 10
    for members in by_family.values():
        for task, sibling in zip(members, members[1:] + members[:1], strict=True):
            name, other = task.metadata["entry_point"], sibling.metadata["entry_point"]
            impostor = extract_code(sibling.reference or "").replace(other, name)
            passed, total = run_tests(impostor, task.verifier.tests or "")
            assert passed < total, f"{task.task_id} accepts {sibling.task_id}'s function"


def test_no_hidden_test_reaches_a_prompt_or_the_feedback_tests() -> None:
    for task in TRAIN + HELDOUT + HUMANEVAL:
        shown = (task.prompt or "") + (task.verifier.feedback_tests or "")
        # a HumanEval tests file starts with the problem's stub (shown on purpose): only
        # what follows the candidate's import is hidden
        hidden = asserts((task.verifier.tests or "").split("from solution import", 1)[-1])
        assert hidden, task.task_id
        leaked = [a for a in hidden if a in shown]
        assert not leaked, f"{task.task_id}: hidden test text in the prompt: {leaked[:2]}"
    for task in TRAIN + HELDOUT:  # the public examples are in the prompt, and only those
        assert asserts(task.verifier.feedback_tests or "") == asserts(task.prompt or "")


# -- humaneval ------------------------------------------------------------------------------


def test_humaneval_is_all_164_problems_and_evaluation_only() -> None:
    assert len(HUMANEVAL) == 164
    assert EVAL.tasks("train") == [] and EVAL.tasks("warmup") == []
    assert getattr(EVAL, "eval_only", False) is True
    assert {n for n in suites.names() if getattr(suites.get(n), "eval_only", False)} == set(
        suites.EVAL_ONLY
    )
    assert all(t.metadata["split"] == "heldout" for t in HUMANEVAL)


@pytest.mark.parametrize("task", HUMANEVAL, ids=lambda t: t.task_id)
def test_humaneval_canonical_solution_passes_and_a_stub_fails(task: Task) -> None:
    tests = task.verifier.tests or ""
    name = task.metadata["entry_point"]
    assert f"from solution import {name}" in tests and "def test_check():" in tests
    assert run_tests(extract_code(EVAL.example(task)), tests) == (1, 1)
    assert run_tests(f"def {name}(*args, **kwargs):\n    return None", tests) == (0, 1)


# -- the feeder never trains on evaluation-only suites --------------------------------------


def feeder(**cfg: object) -> Feeder:
    base = Settings()
    return Feeder(base.model_copy(update={"feeder": base.feeder.model_copy(update=cfg)}))


def test_feeder_refuses_an_eval_only_suite() -> None:
    with pytest.raises(ValueError, match="evaluation-only"):
        feeder(suites={"code": 1.0, "humaneval": 1.0}).candidates()
    assert feeder(suites={"code": 1.0, "humaneval": 0.0}).candidates()  # weight 0: not fed


def test_feeder_feeds_only_train_tasks(tmp_path: Path) -> None:
    lines = [
        '{"task_id": "mine/1", "suite": "mine", "prompt": "1+1=", '
        '"verifier": {"name": "math_answer", "answer": "2"}}',
        '{"task_id": "humaneval/0", "suite": "humaneval", "prompt": "p", '
        '"verifier": {"name": "math_answer", "answer": "2"}}',
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    candidates = feeder(suites={"code": 1.0, "arith": 1.0}, task_files=[str(path)]).candidates()
    fed = [c.task for c in candidates if c.task is not None]
    assert {t.suite for t in fed} == {"code", "arith", "mine"}
    assert all(t.metadata.get("split", "train") == "train" for t in fed)
    held = {t.task_id for t in HELDOUT}
    assert not held & {t.task_id for t in fed}
    refused = [c for c in candidates if c.task is None]
    assert len(refused) == 1 and "evaluation-only" in (refused[0].reason or "")


# -- task files carry feedback_tests ------------------------------------------------------------


def test_the_readme_task_line_is_admitted_with_its_feedback_tests() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## Built-in suites and task files", 1)[1].split("```json\n", 1)[1]
    text = " ".join(block.split("\n```", 1)[0].splitlines())
    task = admission.parse_line(text, group_size=4, registry=REGISTRY)
    assert task.verifier.needs_sandbox and task.verifier.feedback_tests
    solution = extract_code(task.reference or "")
    assert run_tests(solution, task.verifier.tests or "") == (2, 2)
    assert run_tests(solution, task.verifier.feedback_tests) == (1, 1)


def test_feedback_tests_belong_to_python_tests_only() -> None:
    text = (
        '{"task_id": "t", "suite": "s", "prompt": "2+2=", "verifier": {"name": "exact", '
        '"answer": "4", "feedback_tests": "def test_0():\\n    assert True\\n"}}'
    )
    with pytest.raises(admission.Rejected, match="feedback_tests is for python_tests"):
        admission.parse_line(text, group_size=2, registry=REGISTRY)


def test_feedback_spec_runs_the_public_tests_only() -> None:
    from sandbox_workers.verifiers import feedback_spec

    for task in TRAIN[:20] + HELDOUT[:20]:
        spec = feedback_spec(task.verifier)
        assert spec is not None and spec.tests == task.verifier.feedback_tests
        assert spec.feedback_tests is None and task.verifier.tests not in (spec.tests, None)
    assert feedback_spec(HUMANEVAL[0].verifier) is None  # no public tests: nothing to run
    assert feedback_spec(suites.get("arith").tasks("train")[0].verifier) is None
