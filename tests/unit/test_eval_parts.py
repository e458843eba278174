"""Stop strings, pass@k, task loading and the chat template of `rollstream eval` and the
generators, without a model download (the tiny policy and fakes)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest

from learner.sampling import Completion
from schemas.rollout import Task
from schemas.sandbox import VerifierSpec
from services import evalcmd
from services.rollout import evaluate, stops
from services.rollout.batched import Decoding, Drawn, complete
from services.rollout.textcodec import HFCodec
from services.settings import load
from services.suites import get

CODE = VerifierSpec(name="python_tests", tests="from solution import f\n")


def test_the_fence_stop_needs_an_opening_fence() -> None:
    fence = (stops.FENCE_END,)
    assert stops.stop_at("Here it is:\n```python\ndef f(): 1\n```\nmore", fence) == 37
    assert stops.stop_at("Here it is:\n```python\ndef f(): 1", fence) is None
    assert stops.stop_at("no code at all\n", fence) is None
    assert stops.stop_at("```\n```\n", fence) == 8
    assert stops.stop_at("Here:\n```python\nx = 1", fence) is None  # the opening fence


def test_stop_strings_of_code_tasks_only() -> None:
    code = get("code").tasks("heldout")[0]
    assert stops.stop_strings(code) == (stops.FENCE_END,)
    exact = Task(task_id="a", suite="s", prompt="```x```", group_size=1,
                 verifier=VerifierSpec(name="exact", answer="1", needs_sandbox=False))  # fmt: skip
    assert stops.stop_strings(exact) == ()


def test_truncate_keeps_the_closing_fence_and_the_logprobs_before_it() -> None:
    text = "```python\ndef f(): 1\n```\nThis function returns one."
    ids = list(text.encode())
    c = Completion(ids, [-0.5] * len(ids), "length")

    def decode(tokens: Any) -> str:
        return bytes(tokens).decode()

    cut = stops.truncate(c, decode, (stops.FENCE_END,))
    assert decode(cut.tokens) == "```python\ndef f(): 1\n```\n"
    assert cut.finish_reason == "stop" and len(cut.logprobs) == len(cut.tokens)
    assert stops.truncate(c, decode, ()) is c


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert evaluate.pass_at_k(10, 0, 1) == 0.0
    assert evaluate.pass_at_k(10, 10, 5) == 1.0
    assert math.isclose(evaluate.pass_at_k(10, 3, 1), 0.3)
    assert math.isclose(evaluate.pass_at_k(4, 1, 2), 1 - math.comb(3, 2) / math.comb(4, 2))
    r = evaluate.EvalResult("s", 4, 0.5, 0.25, 0.3, passed=[0, 1, 2, 4], samples=4)
    assert math.isclose(r.pass_at(1), 7 / 16) and r.pass_at(4) == 0.75
    assert math.isnan(r.pass_at(5))
    assert math.isclose(r.greedy_se, math.sqrt(0.25 / 4))


def test_judged_counts_greedy_and_samples_per_task() -> None:
    tasks = [
        Task(task_id=str(i), suite="s", prompt="p", verifier=CODE, group_size=1) for i in range(2)
    ]

    class Text:
        def text(self, ids: Any) -> str:
            return bytes(ids).decode()

    async def judge(task: Task, completion: str) -> tuple[float | None, bool]:
        return 1.0, completion == "ok"

    ok, no = Drawn(list(b"ok"), [], "stop"), Drawn(list(b"no"), [], "stop")
    r = asyncio.run(evaluate.judged(tasks, [[ok], [no]], [[ok, no], [no, no]], Text(), judge, 2))
    assert (r.greedy_pass, r.sampled_pass, r.passed) == (0.5, 0.25, [1, 0])
    assert r.greedy_passed == ["0"]


def test_paired_change_counts_fixed_and_broken_tasks() -> None:
    fixed, broken, se = evaluate.paired_change(["a", "b", "c"], ["b", "c", "d", "e"], 10)
    assert (fixed, broken) == (2, 1)
    # McNemar: sqrt(f + b - (f - b)^2 / n) / n
    assert math.isclose(se, math.sqrt(3 - 1 / 10) / 10)
    assert evaluate.paired_change(["a"], ["a"], 5) == (0, 0, 0.0)
    assert math.isnan(evaluate.paired_change([], [], 0)[2])


def test_report_lines_carry_the_paired_change() -> None:
    from services.rollout.report import Report

    before = evaluate.EvalResult("code", 4, 0.25, math.nan, math.nan, greedy_passed=["a"])
    after = evaluate.EvalResult("code", 4, 0.5, math.nan, math.nan, greedy_passed=["b", "c"])
    rep = Report("p", 1.0, [], {}, [before], [after])
    (line,) = rep.heldout_lines()
    se = math.sqrt(3 - 1 / 4) / 4
    assert line[4] == "+1.2" and line[5] == f"+2 / -1 ({0.25 / se:+.1f})"


def test_tiny_policy_completes_task_by_task() -> None:
    from learner.spec import make_policy
    from services.rollout.textcodec import for_policy

    s = load(["learner.tiny_dim=16", "learner.tiny_layers=1", "learner.tiny_heads=2"])
    policy = make_policy(s.learner)
    codec = for_policy(policy)
    tasks = get("arith").tasks("heldout")[:3]
    rows = complete(policy, codec, tasks, 2, Decoding(8, temperature=1.0, seed=1))
    assert [len(r) for r in rows] == [2, 2, 2]
    assert all(len(c.tokens) <= 8 for r in rows for c in r)


def test_decoding_sets_its_threads_in_the_thread_that_decodes() -> None:
    import threading

    import torch

    from learner.spec import make_policy
    from services.rollout.textcodec import for_policy

    s = load(["learner.tiny_dim=16", "learner.tiny_layers=1", "learner.tiny_heads=2"])
    policy = make_policy(s.learner)
    codec, tasks = for_policy(policy), get("arith").tasks("heldout")[:1]
    main_threads, seen = torch.get_num_threads(), []

    def decode(threads: int) -> None:
        torch.set_num_threads(1)  # as the demo's warm-up leaves its worker thread
        complete(policy, codec, tasks, 1, Decoding(4, threads=threads))
        seen.append(torch.get_num_threads())

    try:
        for threads in (0, 2):
            worker = threading.Thread(target=decode, args=(threads,))
            worker.start()
            worker.join(timeout=60)
        assert seen == [1, 2]  # 0 leaves the thread's count as it was
        assert torch.get_num_threads() == main_threads  # the caller's thread is not touched
    finally:
        torch.set_num_threads(main_threads)  # the count later threads start from, as before


def test_text_prompts_go_through_the_chat_template() -> None:
    class Tok:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, chat: Any, add_generation_prompt: bool, **kw: Any) -> Any:
            assert add_generation_prompt
            return [len(json.dumps(chat))]

        def __call__(self, text: str, **kw: Any) -> dict[str, list[int]]:
            return {"input_ids": [0]}

    t = Task(task_id="a", suite="s", prompt="write f", verifier=CODE, group_size=1)
    expected = len(json.dumps([{"role": "user", "content": "write f"}]))
    assert HFCodec(Tok()).prompt_ids(t) == [expected]


def test_eval_tasks_from_a_suite_or_a_file(tmp_path: Path) -> None:
    s = load()
    heldout = evalcmd.load_tasks(s, evalcmd.EvalRequest(suite="code", limit=5))
    assert len(heldout) == 5 and all(t.metadata["split"] == "heldout" for t in heldout)
    assert len(evalcmd.load_tasks(s, evalcmd.EvalRequest(suite="humaneval"))) == 164
    exact = {"name": "exact", "answer": "1", "needs_sandbox": False}
    line = json.dumps({"task_id": "m/1", "suite": "mine", "prompt": "say 1", "verifier": exact})
    path = tmp_path / "tasks.jsonl"
    path.write_text(f"# mine\n{line}\n")
    (task,) = evalcmd.load_tasks(s, evalcmd.EvalRequest(tasks_file=path))
    assert task.task_id == "m/1"
    with pytest.raises(ValueError, match="exactly one"):
        evalcmd.load_tasks(s, evalcmd.EvalRequest())
    with pytest.raises(ValueError, match="unknown suite"):
        evalcmd.load_tasks(s, evalcmd.EvalRequest(suite="nope"))


def test_figures_report_pass_at_k_up_to_the_samples() -> None:
    r = evaluate.EvalResult("code", 4, 0.5, 0.25, 0.3, passed=[0, 1, 2, 4], samples=4)
    fig = evalcmd.figures(r, "smollm2 initial", evalcmd.EvalRequest(suite="code", samples=4),
                          1.0, load())  # fmt: skip
    assert list(fig["pass_at_k"]) == ["1", "2", "4"] and fig["greedy_se"] == 0.25
    assert evalcmd.table(fig).row_count == 4
    r.task_ids, r.greedy_passed = ["a", "b", "c", "d"], ["b"]
    fig = evalcmd.figures(r, "x", evalcmd.EvalRequest(suite="code", samples=4), 1.0, load())
    assert fig["sampled_passed"] == {"a": 0, "b": 1, "c": 2, "d": 4}
    assert fig["greedy_passed"] == ["b"]


def test_two_turn_figures_and_table() -> None:
    from services.rollout.evaluate_turns import tally

    r = tally("code", [True, False, False, False], [True, True, False, False], [1, 2])
    req = evalcmd.EvalRequest(suite="code", turns=2)
    fig = evalcmd.turn_figures(r, "smollm2 initial", req, 1.0, load())
    assert (fig["first_turn_pass"], fig["two_turn_pass"], fig["ratio"]) == (0.25, 0.5, 2.0)
    assert (fig["second_turns"], fig["fixed"], fig["broken"]) == (2, 1, 0)
    assert evalcmd.table(fig).row_count == 4


@pytest.mark.parametrize(
    "req",
    [
        evalcmd.EvalRequest(suite="arith", turns=2),  # judged in process: no public tests
        evalcmd.EvalRequest(suite="code", turns=2, samples=2),  # two-turn is greedy only
        evalcmd.EvalRequest(suite="code", turns=3),
    ],
)
def test_two_turn_eval_refuses_what_it_cannot_run(req: evalcmd.EvalRequest) -> None:
    with pytest.raises(ValueError, match="--turns"):
        asyncio.run(evalcmd.run(load(), req))
