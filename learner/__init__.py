"""rollstream learner: asynchronous off-policy training on the `rewards` stream (DESIGN.md 6).

- policy.py, tiny.py, hf.py, sampling.py: the `Policy` protocol, the built-in byte-level
  transformer, the Hugging Face adapter, sampling with behaviour logprobs.
- loss.py: the off-policy-corrected loss (pure). staleness.py, batching.py,
  bookkeeping.py: pure helpers. sample.py: trajectories as tensors. trainer.py: one update.
- weights.py: weight stores (Redis chunks, directory). checkpoint.py: atomic checkpoints.
- loop.py, kafka_io.py, metrics.py, service.py: the service (`rollstream learner`).
"""
