"""learner/quant.py and the decoder's int4 route on a small random Llama: the grid, the
kernels' arithmetic, behaviour logprobs of int4 sampling against a full forward under the
weights it samples with, LoRA updates reaching the sampler in full, what `auto` picks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from learner import cpu, quant
from learner.cpu import bf16_pays, native_bf16_cpu
from learner.hf import HFPolicy, LoraSpec, sampling_dtype
from tests.unit.test_learner_decode import PROMPT, recomputed, tiny_llama

pytestmark = pytest.mark.skipif(not quant.available(), reason="torch lacks the int4 CPU kernels")


def on_grid(w: torch.Tensor) -> torch.Tensor:
    """``w`` snapped to its int4 grid, as a Q4_1 GGUF dequantizes: exactly on it."""
    q, scale, low = quant.int4_grid(w)
    n, k = w.shape
    back = q.reshape(n, k // quant.GROUP, quant.GROUP) * scale[..., None] + low[..., None]
    return back.reshape(n, k)


def snapped_llama(seed: int = 0) -> Any:
    """tiny_llama with every layer matrix on its int4 grid (SmolLM2's layers are)."""
    model = tiny_llama(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(on_grid(p))
    return model


def test_grid_levels_and_off_grid() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 64, generator=g) * 0.05
    q, scale, low = quant.int4_grid(w)
    assert q.dtype == torch.int32 and int(q.min()) == 0 and int(q.max()) == 15
    assert scale.shape == low.shape == (32, 2)
    assert quant.off_grid(w) > 0.1  # random weights are not on a 16-level grid
    assert quant.off_grid(on_grid(w)) < quant.ON_GRID
    assert quant.int4_fits(*w.shape) and not quant.int4_fits(8, 64)
    assert not quant.int4_fits(32, 48)


def test_kernels_compute_with_the_grid_weights() -> None:
    g = torch.Generator().manual_seed(1)
    w = on_grid(torch.randn(48, 96, generator=g) * 0.05)
    x = torch.randn(5, 96, generator=g)
    packed = quant.Int4.of(w)
    # the kernel keeps each group's scale and zero in bf16: the grid to that rounding
    assert torch.allclose(packed.dequantized(), w, atol=0.01 * float(w.abs().max()))
    ref = F.linear(x.bfloat16().float(), w)
    y = packed(x)
    assert y.dtype == torch.bfloat16 and y.shape == (5, 48)  # the next op promotes it
    assert torch.allclose(y.float(), ref, atol=0.02 * float(ref.abs().max()))
    rows = quant.Int8Rows.of(w)
    assert torch.allclose(rows(x).float(), ref, atol=0.02 * float(ref.abs().max()))
    down, up = torch.randn(4, 96, generator=g), torch.randn(48, 4, generator=g)
    low_rank = quant.LowRank(packed, down, up)
    assert torch.allclose(low_rank(x), y.float() + x @ down.T @ up.T, atol=1e-4)


def test_int4_behaviour_logprobs_are_those_of_the_weights_it_samples_with() -> None:
    policy = HFPolicy(snapped_llama(2), "tiny-llama", sample_dtype="int4")
    dec = policy.decoder()
    assert dec is not None and dec.int4 and isinstance(dec.layers[0].qkv, quant.Int4)
    assert isinstance(dec.head, quant.Int8Rows)
    g = torch.Generator().manual_seed(3)
    outs = policy.sample(PROMPT, 3, max_new_tokens=12, generator=g)
    gaps = torch.cat(
        [(recomputed(policy, c.tokens, 1.0, 1.0) - torch.tensor(c.logprobs)).abs() for c in outs]
    )
    # the grid weights themselves; bf16 activations at each matmul, the head in int8
    assert float(gaps.max()) < 0.1 and float(gaps.mean()) < 0.02


def test_int4_with_lora_samples_every_update_in_full_and_packs_the_base_once() -> None:
    lora = LoraSpec(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
    policy = HFPolicy(snapped_llama(0), "tiny-llama", sample_dtype="int4", lora=lora)
    first = policy.decoder()
    assert isinstance(first.layers[0].qkv, quant.LowRank)  # adapters as a term of their own
    assert isinstance(first.layers[0].qkv.base, quant.Int4)
    g = torch.Generator().manual_seed(4)
    state = policy.weights()
    policy.load_weights({k: torch.randn(v.shape, generator=g) * 0.3 for k, v in state.items()})
    second = policy.decoder()
    assert second is not first and isinstance(second.layers[0].qkv, quant.LowRank)
    assert second.layers[0].qkv.base is first.layers[0].qkv.base  # frozen base, packed once
    assert second.layers[0].o is first.layers[0].o  # no adapter on o_proj
    dense = HFPolicy(policy.model, "tiny-llama", sample_dtype="float32")
    outs = policy.sample(PROMPT, 3, max_new_tokens=10, generator=g)
    gaps = torch.cat(
        [(recomputed(dense, c.tokens, 1.0, 1.0) - torch.tensor(c.logprobs)).abs() for c in outs]
    )
    assert float(gaps.max()) < 0.1 and float(gaps.mean()) < 0.02  # the adapters included


def test_auto_picks_int4_only_with_lora_on_a_grid_base() -> None:
    lora = LoraSpec(rank=2, alpha=4.0, targets=("q_proj",))
    grid = HFPolicy(snapped_llama(), "tiny-llama", sample_dtype="auto", lora=lora).decoder()
    assert grid is not None and grid.int4
    off = HFPolicy(tiny_llama(), "tiny-llama", sample_dtype="auto", lora=lora).decoder()
    assert off is not None and not off.int4
    full = HFPolicy(snapped_llama(), "tiny-llama", sample_dtype="auto").decoder()
    assert full is not None and not full.int4
    assert sampling_dtype("int4", torch.device("cpu"), torch.float32) == torch.float32
    with pytest.raises(ValueError, match="CPU"):
        from learner.hf import int4_sampling

        int4_sampling("int4", torch.device("meta"), lora=False)


def test_native_bf16_is_read_from_the_cpu_flags() -> None:
    assert native_bf16_cpu("processor : 0\nflags : fpu avx512f avx512_bf16 avx512bw\n")
    assert native_bf16_cpu("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not native_bf16_cpu("flags : fpu avx512f avx512bw avx512_vnni\n")


def test_bf16_is_used_only_where_its_matmul_measures_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert bf16_pays(10.0, 3.7) and bf16_pays(10.0, 8.0)
    assert not bf16_pays(10.0, 9.0) and not bf16_pays(10.0, 20.0)  # a Xeon with avx512_bf16
    times = {torch.float32: 0.010, torch.bfloat16: 0.020}
    monkeypatch.setattr(cpu, "native_bf16_cpu", lambda: True)
    assert not cpu.bf16_measured_faster(times.__getitem__)
    times[torch.bfloat16] = 0.004
    assert cpu.bf16_measured_faster(times.__getitem__)
    monkeypatch.setattr(cpu, "native_bf16_cpu", lambda: False)
    assert not cpu.bf16_measured_faster(times.__getitem__)  # flags first, no probe
    assert 0 < cpu.matmul_seconds(torch.float32, size=64, rounds=2) < 1.0
