"""SmolLM2 wired into the pipeline: `learner.model = "smollm2"` resolves to the converted
directory in the services, code prompts go through its chat template with <|im_end|> as
EOS, a completion stops at the end of its code fence, and `rollstream eval` judges the
initial model in the sandbox tier."""

from __future__ import annotations

from typing import Any

import pytest

from services.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def smollm2(settings: Settings) -> Any:
    from learner.spec import make_policy
    from services.models import resolved

    s = settings.model_copy(
        update={"learner": settings.learner.model_copy(update={"model": "smollm2"})}
    )
    section = resolved(s)
    assert section.model.endswith(tuple("0123456789abcdef")) and "gguf-" in section.model
    return s, make_policy(section)


def test_code_prompts_use_the_chat_template_and_stop_at_the_fence(smollm2: Any) -> None:
    import torch

    from services.rollout import stops
    from services.rollout.textcodec import for_policy
    from services.suites import get

    _, policy = smollm2
    codec = for_policy(policy)
    task = get("code").tasks("heldout")[2]
    ids = codec.prompt_ids(task)
    text = policy.tokenizer.decode(ids)
    assert text.rstrip().endswith("<|im_start|>assistant") and task.prompt.strip() in text
    assert policy.tokenizer.decode([policy.eos_id]) == "<|im_end|>"
    torch.manual_seed(0)
    (c,) = policy.sample(ids, 1, max_new_tokens=96, temperature=0.0)
    cut = stops.truncate(c, codec.text, stops.stop_strings(task))
    out = codec.text(cut.tokens)
    assert out.count("```") == 2 and out.rstrip().endswith("```"), out  # a closed fence
    assert cut.finish_reason == "stop" and "def cube" in out
    assert len(cut.tokens) == len(cut.logprobs) <= len(c.tokens)


async def test_eval_of_the_initial_model_in_the_sandbox(smollm2: Any, docker_client: Any) -> None:
    from services import evalcmd

    s, _ = smollm2
    s = s.model_copy(update={"generator": s.generator.model_copy(update={"max_new_tokens": 64})})
    req = evalcmd.EvalRequest(suite="code", limit=3, samples=2, batch=6)
    fig = await evalcmd.run(s, req)
    assert fig["n_tasks"] == 3 and 0.0 <= fig["greedy_pass_at_1"] <= 1.0
    assert set(fig["pass_at_k"]) == {"1", "2"} and fig["policy"] == "smollm2 initial"


async def test_two_turn_eval_of_the_initial_model_in_the_sandbox(
    smollm2: Any, docker_client: Any
) -> None:
    from services import evalcmd

    s, _ = smollm2
    s = s.model_copy(update={"generator": s.generator.model_copy(update={"max_new_tokens": 64})})
    fig = await evalcmd.run(s, evalcmd.EvalRequest(suite="code", limit=3, batch=6, turns=2))
    assert fig["n_tasks"] == 3 and fig["turns"] == 2
    assert 0.0 <= fig["first_turn_pass"] <= 1.0 and 0.0 <= fig["two_turn_pass"] <= 1.0
    assert 0 <= fig["fixed"] <= fig["second_turns"] <= 3 and fig["broken"] <= fig["second_turns"]
