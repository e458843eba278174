"""Weight sync of a pretrained model (SmolLM2-135M): publish -> fetch -> swap, per weight
store and publish dtype, in one run (`benchmarks/learner.py --model smollm2` runs this).

    .venv/bin/python benchmarks/weight_sync.py [--model smollm2] [--repeats 3]

- publish: the learner's snapshot in the publish dtype (learner/publish.py) + `store.put`
  (safetensors, sha256, write: Redis chunks, or a file streamed and hashed in one pass,
  fsynced and renamed; `dir` on the disk of the temporary directory, `dir (tmpfs)` under
  /dev/shm where there is one, as `learner.weight_dir` can put it);
- fetch: `store.get` (read or map, verify sha256, tensors);
- swap: the generator's `load_weights` into its running float32 HFPolicy plus the repack of
  its sampling weights (learner/decode.py) that the next sample would do.
The `LoRA r16` rows: `learner.lora_rank = 16` on every projection, where a version is the
adapters only (the base weights are the pretrained ones on every side) and the swap merges
them into the repacked sampling weights, or, where `sample_dtype = "auto"` samples in int4
(a CPU, the base weights on the 4-bit grid: learner/quant.py), sets them beside the int4
base, which was packed once before the timed rounds (the header says which).
The announcement on Kafka (milliseconds, measured by benchmarks/learner.py) is not included.
Medians of --repeats; the fp32 rows are today's path.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from learner.hf import HFPolicy, LoraSpec
from learner.publish import snapshot
from learner.weights import (
    DirWeightStore,
    RedisWeightStore,
    StoredWeights,
    serialize,
    write_atomic,
)


class SerializingDirStore(DirWeightStore):
    """The directory store's put before blobs were streamed (the baseline row): the whole
    blob built in memory by safetensors, hashed, then written."""

    def put(self, version: int, state: Any) -> StoredWeights:
        data = serialize(state)
        sha = hashlib.sha256(data).hexdigest()
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.dir / f"v{version:08d}-{sha[:16]}.safetensors"
        write_atomic(final, data)
        self._prune(keep=final)
        return StoredWeights(final.resolve().as_uri(), sha, len(data))


def one(store: Any, src: HFPolicy, dst: HFPolicy, dtype: str, version: int) -> list[float]:
    t0 = time.perf_counter()
    ref = store.put(version, snapshot(src, dtype))
    t1 = time.perf_counter()
    state = store.get(ref.uri, ref.sha256)
    t2 = time.perf_counter()
    dst.load_weights(state)
    dst.decoder()
    t3 = time.perf_counter()
    return [t1 - t0, t2 - t1, t3 - t2, ref.size_bytes / 1e6]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    run(args.model, args.repeats, args.threads)


def run(model: str, repeats: int, threads: int) -> None:
    torch.set_num_threads(threads)
    from services.infra.models import resolve
    from services.settings import load

    settings = load()
    path = resolve(model, settings.stack.cache_dir)
    assert path is not None, "a pretrained model is needed (not tiny)"
    src = HFPolicy.from_path(path, dtype="float32")
    dst = HFPolicy.from_path(path, dtype="float32", sample_dtype="auto")
    lora = LoraSpec(16, 32.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                               "down_proj"))  # fmt: skip
    src_l = HFPolicy.from_path(path, dtype="float32", lora=lora)
    with torch.no_grad():  # trained adapters: B is zero at initialisation
        for name, p in src_l.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1e-3)
    dst_l = HFPolicy.from_path(path, dtype="float32", sample_dtype="auto", lora=lora)
    pairs = {"full": (src, dst), "LoRA r16": (src_l, dst_l)}
    params = sum(p.numel() for p in src.parameters()) / 1e6
    full, low = dst.decoder(), dst_l.decoder()  # the first packing, outside the timing
    print(f"\n## weight sync, {model} ({params:.0f}M params): publish -> fetch -> swap "
          f"(median ms of {repeats}); sampling weights {_mode(full)}, with LoRA "
          f"{_mode(low)}\n")  # fmt: skip
    print("| store | dtype | blob MB | publish | fetch | swap | total |")
    print("|---|---|---|---|---|---|---|")
    ns = f"rollstream:bench{uuid.uuid4().hex[:8]}:weights"
    shm = Path("/dev/shm")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rollstream-sync-"))
        redis = RedisWeightStore.from_url(settings.redis.endpoint, "bench", namespace=ns, keep=1)
        stores: dict[str, Any] = {
            "dir, serialized (before)": SerializingDirStore(tmp, "bench-before", keep=1),
            "dir": DirWeightStore(tmp, "bench", keep=1),
        }
        if shm.is_dir() and os.access(shm, os.W_OK):  # tmpfs: fsync is free, pages shared
            mem = stack.enter_context(tempfile.TemporaryDirectory(prefix="rs-sync-", dir=shm))
            stores["dir (tmpfs)"] = DirWeightStore(mem, "bench", keep=1)
        stores["redis"] = redis
        stores["dir, LoRA r16"] = DirWeightStore(tmp, "bench-lora", keep=1)
        version = 0
        for name, store in stores.items():
            a, b = pairs["LoRA r16" if "LoRA" in name else "full"]
            for dtype in ("float32", "bfloat16"):
                rows = []
                for _ in range(repeats):
                    rows.append(one(store, a, b, dtype, version))
                    version += 1
                pub, fet, swp = (statistics.median(r[i] for r in rows) * 1e3 for i in range(3))
                print(f"| {name} | {dtype} | {rows[0][3]:.0f} | {pub:.0f} | {fet:.0f} | "
                      f"{swp:.0f} | {pub + fet + swp:.0f} |", flush=True)  # fmt: skip
        client = redis.r
        keys = list(client.scan_iter(f"{ns}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def _mode(dec: Any) -> str:
    if dec is None:
        return "none (model forward)"
    return "int4 (adapters beside)" if dec.int4 else str(dec.dtype).replace("torch.", "")


if __name__ == "__main__":
    main()
