"""The gateway's pure parts: request -> Trajectory (checks, tokenisation, masks), the
feedback reward map, and the gate's token and header handling."""

from __future__ import annotations

from typing import Any

import pytest

from schemas import codec
from schemas.arrays import unpack_f32, unpack_i32
from schemas.envelope import Origin
from services.ingest import gate
from services.ingest.convert import Invalid, Limits, build_trajectory, render
from services.ingest.feedback import judge, scored
from services.ingest.models import Judgement, TraceIn
from services.settings import IngestSettings

LIMITS = Limits(max_messages=50, max_tokens=None, task_id="prod")


class Bytes:
    """A byte tokenizer like the tiny policy's: ids 0-255, BOS 256, EOS 257."""

    vocab_size, bos_id, eos_id = 259, 256, 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


def trace(**extra: Any) -> TraceIn:
    body: dict[str, Any] = {
        "id": "c-1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "6*7?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call1", "function": {"name": "calc", "arguments": '{"x":"6*7"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call1", "content": "42"},
            {"role": "assistant", "content": "42", "refusal": None},
        ],
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {}}}],
    }
    body.update(extra)
    return TraceIn.model_validate(body)


def test_trace_becomes_a_production_trajectory_of_its_own_group() -> None:
    t = build_trajectory(trace(), LIMITS, Bytes())
    assert t.origin is Origin.PRODUCTION and t.group_id == t.id and t.group_size == 1
    assert (t.task_id, t.completion, t.turns, t.behaviour_logprobs) == ("prod", "42", 2, None)
    assert t.messages[1].content == "6*7?"  # text parts joined
    assert t.messages[2].tool_calls[0].function.arguments == '{"x":"6*7"}'
    assert t.verifier.name == "feedback" and not t.verifier.needs_sandbox
    assert codec.validate(t) == t


def test_render_masks_exactly_the_assistant_output() -> None:
    tok = Bytes()
    prompt, completion, mask = render(trace(), tok)
    assert prompt[0] == tok.bos_id
    assert "<|tools|>" in bytes(i for i in prompt if i < 256).decode()
    assert len(completion) == len(mask)
    trained = bytes(c for c, m in zip(completion, mask, strict=True) if m and c < 256).decode()
    ignored = bytes(c for c, m in zip(completion, mask, strict=True) if not m).decode()
    assert (
        trained
        == '<|tool_call|>{"id":"call1","name":"calc","arguments":"{\\"x\\":\\"6*7\\"}"}\n42\n'
    )
    assert "<|tool|>\n42\n" in ignored and "<|assistant|>\n" in ignored
    assert [c for c, m in zip(completion, mask, strict=True) if m].count(tok.eos_id) == 2
    t = build_trajectory(trace(), LIMITS, tok)
    assert list(unpack_i32(t.completion_tokens)) == completion
    assert t.completion_mask == bytes(mask)


def test_client_token_ids_and_logprobs_are_kept() -> None:
    req = trace(prompt_token_ids=[1, 2], completion_token_ids=[3, 4, 5], logprobs=[-0.5, -1.0, 0.0])
    t = build_trajectory(req, LIMITS, Bytes())
    assert list(unpack_i32(t.prompt_tokens)) == [1, 2]
    assert list(unpack_f32(t.behaviour_logprobs or b"")) == [-0.5, -1.0, 0.0]
    assert t.completion_mask is None
    req = trace(prompt_token_ids=[1], completion_token_ids=[3, 4], completion_mask=[1, 0])
    assert build_trajectory(req, LIMITS, None).completion_mask == b"\x01\x00"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
         "no assistant message"),
        ({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]},
         "must open with the prompt"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]},
         "needs content or tool_calls"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                       {"role": "tool", "tool_call_id": "nope", "content": "c"}]},
         "answers no earlier call"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                       {"role": "tool", "content": "c"}]},
         "required for role tool"),
        ({"prompt_token_ids": [1]}, "send both, or neither"),
        ({"prompt_token_ids": [1], "completion_token_ids": [2], "logprobs": [-1.0, -1.0]},
         "2 values, expected 1"),
        ({"prompt_token_ids": [1], "completion_token_ids": [999]}, "outside the policy vocab"),
        ({"prompt_token_ids": [], "completion_token_ids": [1]}, "prompt_token_ids: empty"),
        ({"prompt_token_ids": [1], "completion_token_ids": [1], "completion_mask": [0]},
         "all zero"),
        ({"logprobs": [-1.0]}, "only with prompt/completion_token_ids"),
        ({"verifier": {"name": "exact"}}, "verifier: invalid exact spec"),
        ({"verifier": {"name": "exact", "answer": "4"}, "feedback": {"thumbs": 1}},
         "a trace is scored by either"),
        ({"verifier": {"name": "python_tests", "version": "0.0.1", "tests": "x"}},
         "not deployed"),
    ],
)  # fmt: skip
def test_invalid_traces_name_each_problem(extra: dict[str, Any], problem: str) -> None:
    with pytest.raises(Invalid) as err:
        build_trajectory(trace(**extra), LIMITS, Bytes())
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_limits_on_messages_and_tokens() -> None:
    with pytest.raises(Invalid, match="at most 3"):
        build_trajectory(trace(), Limits(3, None, "p"), Bytes())
    with pytest.raises(Invalid, match=r"at most 10 \(ingest.max_tokens\)"):
        build_trajectory(trace(), Limits(50, 10, "p"), Bytes())


def test_a_verifier_routes_the_trace_to_the_dispatcher() -> None:
    t = build_trajectory(trace(verifier={"name": "exact", "answer": "42"}), LIMITS, Bytes())
    assert (t.verifier.name, t.verifier.answer, t.verifier.needs_sandbox) == ("exact", "42", False)
    t = build_trajectory(trace(verifier={"name": "python_tests", "tests": "t"}), LIMITS, Bytes())
    assert t.verifier.needs_sandbox


def test_feedback_rewards_and_advantages() -> None:
    cfg = IngestSettings(score_min=0, score_max=10)
    assert (judge(Judgement(thumbs=1), cfg).reward, judge(Judgement(thumbs=1), cfg).advantage) == (
        1.0,
        1.0,
    )
    assert judge(Judgement(thumbs=-1), cfg).advantage == -1.0
    assert judge(Judgement(thumbs=0), cfg).advantage == 0.0
    v = judge(Judgement(score=7.5, thumbs=-1), cfg)  # score wins
    assert (v.reward, v.source, v.components["thumbs"]) == (0.75, "score", -1.0)
    assert judge(Judgement(label="harmful"), cfg).reward == 0.0
    for bad, why in [
        (Judgement(score=11), r"outside \[0.0, 10.0\]"),
        (Judgement(label="meh"), "known labels: correct"),
        (Judgement(comment="nice"), "a comment alone is no reward"),
    ]:
        with pytest.raises(Invalid, match=why):
            judge(bad, cfg)


def test_scored_trace_for_the_learner() -> None:
    t = build_trajectory(trace(), LIMITS, Bytes())
    s = scored(t, judge(Judgement(thumbs=1), IngestSettings()), 0.5, "ingest-test")
    assert s.id == f"{t.id}:scored" and s.parent_id == t.id and s.trajectory is t
    assert (s.reward, s.advantage, s.outcome.value, s.verifier_name) == (
        1.0,
        1.0,
        "passed",
        "feedback",
    )
    assert codec.validate(s) == s


def test_gate_token_compare_and_headers() -> None:
    accepted = gate.digests(["alpha", "beta"])
    assert gate.token_ok("beta", accepted) and not gate.token_ok("gamma", accepted)
    assert not gate.token_ok("", accepted) and not gate.token_ok("alpha", [])
    assert gate.bearer([(b"authorization", b"Bearer  tok ")]) == "tok"
    assert gate.bearer([(b"authorization", b"Basic dXNlcg==")]) is None
    assert gate.bearer([(b"authorization", b"Bearer")]) is None
    assert gate.bearer([]) is None
    assert gate.is_json("application/json; charset=utf-8") and gate.is_json("application/x+json")
    assert not gate.is_json("text/plain") and not gate.is_json("")


def test_settings_label_map_and_tokens(tmp_path: Any) -> None:
    path = tmp_path / "tokens"
    path.write_text("# ops\nfile-token\n\n")
    cfg = IngestSettings(tokens="a, b", tokens_file=path, label_rewards="good=1, bad=0.2")
    assert cfg.token_list() == ["a", "b", "file-token"]
    assert cfg.label_map() == {"good": 1.0, "bad": 0.2}
    with pytest.raises(ValueError, match="label=reward"):
        IngestSettings(label_rewards="good=2")
    with pytest.raises(ValueError, match="score_max"):
        IngestSettings(score_min=1, score_max=1)
