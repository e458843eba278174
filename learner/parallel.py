"""The data-parallel learner on torch.distributed (`rollstream learner --nproc N`, or under
torchrun): N ranks, one model replica (ddp) or one shard of it (fsdp) each.

Design. Rank 0 alone owns all IO: it consumes `rewards`, decides duplicates, masking and
staleness, forms the global batch exactly as a single learner does (learner/loop.py, the
same code), writes the ledger, publishes weights, writes checkpoints and commits offsets.
The other ranks never talk to Kafka, Redis or the checkpoint directory; they run `follow`,
which obeys rank 0's commands (learner/distributed.py's `Channel`, tensors only).

One update: rank 0 broadcasts the global batch; every rank takes its share of each
minibatch (`distributed.shard`: split by tokens, deterministic) and accumulates gradients
of its micro-batches with the loss normalised by the trained tokens of the *global*
minibatch (learner/loss.py); the gradients are summed over ranks, so every rank holds the
single-process gradient of the global batch, clips it by the same global norm and takes
the same optimizer step. ddp: full replicas; the gradients are all-reduced by hand
(SUM, bucketed) after the local micro-batches, since the Policy is driven through
`token_logprobs`, not `forward`, which DistributedDataParallel's hooks need. fsdp
(FULL_SHARD, `torch.distributed.fsdp.fully_shard` on every block and the root): the
parameters, gradients and optimizer state are sharded; FSDP reduce-scatters the gradients
(averaged, of a loss scaled by the world size) and every rank runs the same number of
forward passes (ranks with fewer micro-batches run empty ones). Publication and
checkpoints gather a full state dict onto rank 0 (a collective: rank 0 commands it); a
restore on rank 0 is broadcast to all. Checkpoints hold the full state in the
single-process format (optimizer state keyed by parameter index) whatever the mode, so a
run can resume with another `--nproc` or `learner.parallel`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from learner import distributed as dd
from learner.batching import micro_batches, split_even
from learner.checkpoint import CheckpointManager, CheckpointState
from learner.loss import LossStats
from learner.policy import Policy
from learner.sample import Sample
from learner.trainer import StepResult, TrainConfig, Trainer

_SUMS = (
    "loss", "pg_loss", "rwl_loss", "kl", "entropy", "tokens", "is_tokens", "is_seqs",
    "ratio", "is_weight", "clipped", "truncated", "masked_seqs",
)  # fmt: skip
_BUCKET = 1 << 24


class DataParallelTrainer(Trainer):
    """A Trainer on every rank of the process group; `step` on rank 0 drives them all."""

    def __init__(
        self,
        policy: Policy,
        cfg: TrainConfig,
        device: torch.device,
        *,
        parallel: str = "ddp",
        ref_policy: Policy | None = None,
    ) -> None:
        if parallel not in ("ddp", "fsdp"):
            raise ValueError(f"learner.parallel must be 'ddp' or 'fsdp', got {parallel!r}")
        self.parallel = parallel
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.channel = dd.Channel(device)
        super().__init__(policy, cfg, device, ref_policy=ref_policy)

    @property
    def fsdp(self) -> bool:
        return self.parallel == "fsdp"

    def _wrap(self) -> None:
        module: nn.Module = self.policy  # type: ignore[assignment]
        if not self.fsdp:
            for t in module.state_dict().values():  # identical replicas from the start
                dist.broadcast(t, src=0)
            return
        from torch.distributed.fsdp import fully_shard

        blocks = [m for lst in module.modules() if isinstance(lst, nn.ModuleList) for m in lst]
        for block in blocks:
            fully_shard(block)
        fully_shard(module)

    # -- one update ------------------------------------------------------------------

    def step(self, samples: Sequence[Sample]) -> StepResult:
        """On rank 0: send the global batch to every rank, then train on it as they do."""
        if self.rank == 0:
            if not samples:
                raise ValueError("Trainer.step: empty batch")
            self.channel.send_batch(samples)
        return super().step(samples)

    def _shares(self, samples: Sequence[Sample]) -> tuple[list[int], list[list[int]]]:
        """This rank's share of `samples` and its micro-batches (index lists into the
        share), padded with empty ones to the most any rank has."""
        parts = dd.shard([s.length for s in samples], self.world)
        plans = [
            micro_batches([samples[i].length for i in part], self.cfg.micro_batch_tokens)
            for part in parts
        ]
        most = max(len(p) for p in plans)
        mine = plans[self.rank]
        return parts[self.rank], mine + [[] for _ in range(most - len(mine))]

    @torch.no_grad()
    def _proximal(self, samples: Sequence[Sample]) -> list[Tensor]:
        """log pi_prox of the samples this rank trains on (the others' stay empty)."""
        out: list[Tensor] = [torch.empty(0)] * len(samples)
        for mini in split_even(list(range(len(samples))), self.cfg.minibatches):
            part, groups = self._shares([samples[i] for i in mini])
            for group in groups:
                if not group:
                    self._empty_pass(grad=False)
                    continue
                out_i = [mini[part[j]] for j in group]
                for i, t in zip(out_i, super()._proximal([samples[i] for i in out_i]), strict=True):
                    out[i] = t
        return out

    def _update(self, samples: Sequence[Sample], prox: list[Tensor] | None) -> LossStats:
        self.optimizer.zero_grad(set_to_none=True)
        num_tokens = float(sum(s.trained_tokens for s in samples))
        part, groups = self._shares(samples)
        local = [samples[i] for i in part]
        local_prox = [prox[i] for i in part] if prox is not None else None
        # FSDP averages its reduce-scatter over ranks (a plain sum, PREMUL_SUM, is not on
        # gloo): the loss is scaled by the world size so the average is the sum.
        scale = self.world if self.fsdp else 1
        stats = LossStats()
        for group in groups:
            if group:
                stats.merge(self._backward(local, group, local_prox, num_tokens / scale))
            else:
                self._empty_pass(grad=True)
        for key in ("loss", "pg_loss", "rwl_loss"):
            stats.sums[key] = stats.sums.get(key, 0.0) / scale
        if not self.fsdp:
            self._all_reduce_grads()
        return self._apply(_reduce_stats(stats, self.channel.device))

    def _empty_pass(self, *, grad: bool) -> None:
        """A forward (and backward) contributing nothing: FSDP needs every rank to run the
        same passes; ddp needs none."""
        if not self.fsdp:
            return
        tokens = torch.full((1, 2), self.policy.pad_id, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(grad):
            logp, _ = self._logprobs(self.policy, tokens, torch.ones_like(tokens), False)
            if grad:
                (logp.sum() * 0.0).backward()  # type: ignore[no-untyped-call]

    def _all_reduce_grads(self) -> None:
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in _buckets([p.grad for p in params if p.grad is not None]):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            at = 0
            for g in bucket:
                g.copy_(flat[at : at + g.numel()].view_as(g))
                at += g.numel()

    # -- full state (publication, checkpoints, restore) --------------------------------

    def weights(self) -> dict[str, Tensor]:
        """The full weights on rank 0 (fsdp: gathered from every rank, on command)."""
        if not self.fsdp:
            return super().weights()
        if self.rank == 0:
            self.channel.command(dd.Op.WEIGHTS)
        return self._full_model()

    def _full_model(self) -> dict[str, Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state: dict[str, Any] = get_model_state_dict(self.policy, options=opts)  # type: ignore[arg-type]
        return {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}

    def full_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Model and optimizer state dicts, full, on rank 0 (optimizer keyed by parameter
        index, as a single process's); fsdp: a collective."""
        if not self.fsdp:
            return self.policy.state_dict(), self.optimizer.state_dict()  # type: ignore[attr-defined]
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        if self.rank == 0:
            self.channel.command(dd.Op.SAVE)
        model = self._full_model()
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim = get_optimizer_state_dict(self.policy, self.optimizer, options=opts)  # type: ignore[arg-type]
        return model, (_by_index(dict(optim)) if optim else {})  # empty off rank 0

    def load_full(self, model: dict[str, Tensor] | None, optim: dict[str, Any] | None) -> None:
        """Every rank takes rank 0's restored state (`model`, `optim` given on rank 0)."""
        if self.rank == 0:
            self.channel.command(dd.Op.LOAD)
        if not self.fsdp:
            module: nn.Module = self.policy  # type: ignore[assignment]
            if self.rank == 0:
                module.load_state_dict(model or {})
                self.optimizer.load_state_dict(optim or {})
            got = self.channel.tensors(dict(module.state_dict()) if self.rank == 0 else None)
            module.load_state_dict(got)
            _sync_optimizer(self.channel, self.optimizer)
            return
        _load_sharded(self, model, optim)


def _buckets(grads: Sequence[Tensor]) -> Iterator[list[Tensor]]:
    bucket: list[Tensor] = []
    size = 0
    for g in grads:
        if bucket and (size + g.numel() > _BUCKET or g.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(g)
        size += g.numel()
    if bucket:
        yield bucket


def _reduce_stats(stats: LossStats, device: torch.device) -> LossStats:
    """The statistics of the global batch: sums summed, maxima maxed over ranks."""
    sums = torch.tensor([stats.sums.get(k, 0.0) for k in _SUMS], dtype=torch.float64)
    top = torch.tensor([stats.maxima.get("ratio", 0.0)], dtype=torch.float64)
    sums, top = sums.to(device), top.to(device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    out = LossStats(sums=dict(zip(_SUMS, sums.cpu().tolist(), strict=True)))
    if float(top.item()) > 0:
        out.top("ratio", float(top.item()))
    return out


def _by_index(optim: dict[str, Any]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name -> keyed by index."""
    groups = optim["param_groups"]
    index = {name: i for i, name in enumerate(n for g in groups for n in g["params"])}
    return {
        "state": {index[k]: v for k, v in optim["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups],
    }


def _by_name(optim: dict[str, Any], trainer: Trainer) -> dict[str, Any]:
    """The inverse of `_by_index` for this trainer's optimizer."""
    names = {id(p): n for n, p in trainer.policy.named_parameters()}  # type: ignore[attr-defined]
    order = [names[id(p)] for g in trainer.optimizer.param_groups for p in g["params"]]
    return {
        "state": {order[int(i)]: v for i, v in optim["state"].items()},
        "param_groups": [
            {**g, "params": [order[int(i)] for i in g["params"]]} for g in optim["param_groups"]
        ],
    }


def _sync_optimizer(channel: dd.Channel, opt: torch.optim.Optimizer) -> None:
    """Every rank's optimizer takes rank 0's state (tensors and JSON, no pickle)."""
    from learner.checkpoint import _optimizer_join, _optimizer_split

    tensors, meta = _optimizer_split(opt) if dist.get_rank() == 0 else ({}, None)
    meta = channel.json(meta)
    got = channel.tensors(tensors if dist.get_rank() == 0 else None)
    if dist.get_rank() != 0:
        opt.load_state_dict(_optimizer_join(got, meta))


def _load_sharded(
    trainer: DataParallelTrainer, model: dict[str, Tensor] | None, optim: dict[str, Any] | None
) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
    module: Any = trainer.policy
    full: dict[str, Any] = dict(model or {})
    set_model_state_dict(module, full, options=opts)
    named = _by_name(optim, trainer) if optim else {}
    set_optimizer_state_dict(module, trainer.optimizer, named, options=opts)


def follow(trainer: DataParallelTrainer) -> int:
    """The loop of a rank other than 0: obey rank 0 until it says stop; the steps taken."""
    while True:
        op, args = trainer.channel.receive()
        if op is dd.Op.STOP:
            return trainer.steps
        if op is dd.Op.TRAIN:
            Trainer.step(trainer, trainer.channel.receive_batch(args[:5]))
        elif op is dd.Op.WEIGHTS:
            trainer._full_model()
        elif op is dd.Op.SAVE:
            trainer.full_state()
        elif op is dd.Op.LOAD:
            trainer.load_full(None, None)


class _Holder(nn.Module):
    """A state dict in the shape CheckpointManager reads and writes (no parameters)."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.held = state or {}

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.held

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        self.held = dict(state_dict)


class ReplicaCheckpoints(CheckpointManager):
    """Checkpoints of a data-parallel learner, on rank 0: the full state (fsdp: gathered);
    a restore is broadcast to every rank."""

    def __init__(self, root: Any, trainer: DataParallelTrainer, keep: int = 3) -> None:
        super().__init__(root, keep=keep)
        self.trainer = trainer

    def save(self, state: CheckpointState, model: nn.Module, opt: torch.optim.Optimizer) -> Path:
        model_sd, optim_sd = self.trainer.full_state()
        return super().save(state, _Holder(model_sd), _Holder(optim_sd))  # type: ignore[arg-type]

    def load_latest(
        self, model: nn.Module, opt: torch.optim.Optimizer | None
    ) -> tuple[Path, CheckpointState] | None:
        held_model, held_opt = _Holder(), _Holder()
        found = super().load_latest(held_model, held_opt)  # type: ignore[arg-type]
        if found is not None:
            self.trainer.load_full(held_model.held, held_opt.held)
        return found
