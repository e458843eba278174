"""rollstream learner: asynchronous off-policy training on the `rewards` stream (DESIGN.md 6).

- config.py: the `[learner]` section (every default and doc) and `configure`, which builds
  the inner configs (LossConfig, TrainConfig, LoopConfig) from it.
- policy.py: the `Policy` protocol and helpers; tiny.py, hf.py: the built-in byte-level
  transformer and the Hugging Face adapter; spec.py: the factory (policy_spec, build_policy,
  make_policy); sampling.py: sampling with behaviour logprobs.
- loss.py: the off-policy-corrected loss (pure). staleness.py, batching.py,
  bookkeeping.py: pure helpers. sample.py: trajectories as tensors. trainer.py: one update.
- weights.py: weight stores (Redis chunks, directory). checkpoint.py: atomic checkpoints.
- io.py: the Protocols of its Kafka IO; loop.py: the service loop; metrics.py; service.py:
  the service from its section and ports (services/learner_service.py wires the real ones).
- parallel.py: the data-parallel learner (ddp, fsdp) on torch.distributed; rank 0 alone
  does all IO and drives the other ranks; distributed.py: its process group and the
  rank-0 channel (commands and batches as tensors).
"""
