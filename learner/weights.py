"""Weight store: where published policy weights live (the `weights` topic only announces).

Blobs are safetensors (never pickle), identified by SHA-256. A blob's location embeds its
version and hash, so a location is written once and never changes: an announcement keeps
pointing at the bytes it was made for, even if a restarted learner publishes that version
number again with other weights (it never does, see learner/loop.py, but the store does not
rely on it).

- `RedisWeightStore`: chunks under ``{namespace}:{policy}:v{version}-{sha}:{i}``, then the
  manifest (JSON: size, sha256, chunk count) written LAST, so a reader that finds the
  manifest finds every chunk. For small models (one Redis value is at most 512 MB, and big
  values block the server).
- `DirWeightStore`: ``{root}/{policy}/v{version:08d}-{sha16}.safetensors`` streamed to a
  temporary file and hashed in one pass, fsynced, then renamed into place (atomic on
  POSIX), then the directory fsynced. For large models; a shared filesystem or
  object-store mount scales it out.

Both keep the `keep` most recently written blobs of a policy and delete older ones.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote, urlparse

from torch import Tensor

from learner.blobfile import write_state

FORMAT = "safetensors"
DEFAULT_CHUNK = 8 * 1024 * 1024


class WeightIntegrityError(Exception):
    """The blob is missing, incomplete, or its SHA-256 does not match."""


@dataclass(frozen=True)
class StoredWeights:
    uri: str
    sha256: str
    size_bytes: int


class WeightStore(Protocol):
    def put(self, version: int, state: Mapping[str, Tensor]) -> StoredWeights:
        """Store a state dict as version `version`; return where, its sha256 and size."""
        ...

    def get(self, uri: str, sha256: str) -> dict[str, Tensor]:
        """Fetch, verify the SHA-256 (WeightIntegrityError if it does not match), load."""
        ...


def announced_readable(store: WeightStore, announced: bytes) -> bool:
    """Whether `store` still serves the blob a `weights` record points at (a Redis that
    lost its data, a pruned or damaged blob: not)."""
    from schemas import codec
    from schemas.learning import WeightUpdate

    try:
        update = codec.decode(announced, WeightUpdate)
        store.get(update.uri, update.sha256)
    except Exception:  # missing, damaged, or the store is unreachable: all "not readable"
        return False
    return True


def serialize(state: Mapping[str, Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().contiguous() for k, v in state.items()}, {"format": "pt"})


def deserialize(data: bytes) -> dict[str, Tensor]:
    from safetensors.torch import load

    return load(data)


def _verified(data: bytes, sha256: str, uri: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise WeightIntegrityError(f"{uri}: sha256 {digest} does not match expected {sha256}")
    return data


class RedisWeightStore:
    def __init__(
        self,
        client: Any,
        policy: str,
        namespace: str = "rollstream:weights",
        chunk_bytes: int = DEFAULT_CHUNK,
        keep: int = 3,
    ) -> None:
        self.r = client
        self.policy = policy
        self.prefix = f"{namespace}:{policy}"
        self.chunk_bytes = chunk_bytes
        self.keep = keep

    @classmethod
    def from_url(cls, url: str, policy: str, **kwargs: Any) -> RedisWeightStore:
        import redis

        return cls(redis.Redis.from_url(url), policy, **kwargs)

    def put(self, version: int, state: Mapping[str, Tensor]) -> StoredWeights:
        data = serialize(state)
        sha = hashlib.sha256(data).hexdigest()
        base = f"{self.prefix}:v{version:08d}-{sha[:16]}"
        view = memoryview(data)
        chunks = max(1, -(-len(data) // self.chunk_bytes))
        pipe = self.r.pipeline(transaction=False)
        for i in range(chunks):
            pipe.set(f"{base}:{i}", view[i * self.chunk_bytes : (i + 1) * self.chunk_bytes])
            if i % 8 == 7:
                pipe.execute()
        pipe.execute()
        manifest = {"sha256": sha, "size": len(data), "chunks": chunks, "format": FORMAT}
        self.r.set(f"{base}:manifest", json.dumps(manifest))  # last: the blob is complete
        self.r.zadd(f"{self.prefix}:index", {base: time.time()})
        self._prune(keep=base)
        return StoredWeights(f"redis:{base}", sha, len(data))

    def get(self, uri: str, sha256: str) -> dict[str, Tensor]:
        if not uri.startswith("redis:"):
            raise ValueError(f"not a Redis weight uri: {uri}")
        base = uri.removeprefix("redis:")
        raw = self.r.get(f"{base}:manifest")
        if raw is None:
            raise WeightIntegrityError(f"{uri}: no manifest (not written yet, or pruned)")
        manifest = json.loads(raw)
        parts = self.r.mget([f"{base}:{i}" for i in range(int(manifest["chunks"]))])
        if any(p is None for p in parts):
            raise WeightIntegrityError(f"{uri}: chunks missing (pruned while reading?)")
        data = b"".join(parts)
        if len(data) != manifest["size"] or manifest["sha256"] != sha256:
            raise WeightIntegrityError(f"{uri}: manifest does not match the announcement")
        return deserialize(_verified(data, sha256, uri))

    def _prune(self, keep: str) -> None:
        """Delete all but the `self.keep` newest blobs (by write time), never `keep`."""
        old = self.r.zrange(f"{self.prefix}:index", 0, -self.keep - 1)
        for member in old:
            base = member.decode() if isinstance(member, bytes) else member
            if base == keep:
                continue
            manifest = self.r.get(f"{base}:manifest")
            n = json.loads(manifest)["chunks"] if manifest else 0
            self.r.delete(f"{base}:manifest")  # first: readers stop finding the blob
            if n:
                self.r.delete(*[f"{base}:{i}" for i in range(n)])
            self.r.zrem(f"{self.prefix}:index", member)


_NAME = re.compile(r"^v(\d{8})-[0-9a-f]{16}\.safetensors$")


class DirWeightStore:
    def __init__(self, root: str | Path, policy: str, keep: int = 3) -> None:
        self.dir = Path(root) / policy
        self.keep = keep

    def put(self, version: int, state: Mapping[str, Tensor]) -> StoredWeights:
        """Streamed to a temporary file and hashed in the same pass (learner/blobfile.py),
        then put in place under the name its hash gives (`write_streamed`)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        written: list[tuple[str, int]] = []

        def fill(f: BinaryIO) -> str:
            written.append(write_state(f, state))
            return f"v{version:08d}-{written[0][0][:16]}.safetensors"

        final = write_streamed(self.dir, f".v{version:08d}.", fill)
        self._prune(keep=final)
        sha, size = written[0]
        return StoredWeights(final.resolve().as_uri(), sha, size)

    def get(self, uri: str, sha256: str) -> dict[str, Tensor]:
        """The file is mapped, not read into memory: hashed through the mapping, then
        loaded by safetensors (its own mapping), one copy into the returned tensors."""
        from safetensors.torch import load_file

        path = path_of(uri)
        try:
            with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                digest = hashlib.sha256(mm).hexdigest()
            if digest != sha256:
                raise WeightIntegrityError(f"{uri}: sha256 {digest} does not match {sha256}")
            return load_file(path)  # write-once name: only pruning could remove it since
        except (FileNotFoundError, ValueError) as exc:
            raise WeightIntegrityError(f"{uri}: no such blob (pruned?) or empty") from exc

    def _prune(self, keep: Path) -> None:
        """Delete all but the `self.keep` newest blobs (by write time), never `keep`."""
        blobs = sorted(
            (p for p in self.dir.iterdir() if _NAME.match(p.name) and p != keep),
            key=lambda p: p.stat().st_mtime_ns,
        )
        for p in blobs[: max(0, len(blobs) - (self.keep - 1))]:
            p.unlink(missing_ok=True)


def path_of(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise ValueError(f"not a file uri: {uri}")
    return Path(unquote(parsed.path))


def write_atomic(path: Path, data: bytes) -> None:
    """Write a file so that readers see either nothing or all of it."""

    def fill(f: BinaryIO) -> str:
        f.write(data)
        return path.name

    write_streamed(path.parent, f".{path.name}.", fill)


def write_streamed(directory: Path, prefix: str, fill: Callable[[BinaryIO], str]) -> Path:
    """Write a file in `directory` so that readers see either nothing or all of it: `fill`
    writes a temporary file (named `prefix`...`.tmp`) and returns the final name, which the
    file gets once fsynced; then the directory is fsynced. Returns the final path."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            name = fill(f)
            f.flush()
            os.fsync(f.fileno())
        final = directory / name
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    return final


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_store(
    backend: str, policy: str, *, redis_url: str | None = None, root: Path | None = None, **kw: Any
) -> WeightStore:
    """A store by name: `redis` (needs redis_url) or `dir` (needs root)."""
    if backend == "redis":
        if redis_url is None:
            raise ValueError("the redis weight store needs a Redis URL")
        return RedisWeightStore.from_url(redis_url, policy, **kw)
    if backend == "dir":
        if root is None:
            raise ValueError("the dir weight store needs a root directory")
        return DirWeightStore(root, policy, **kw)
    raise ValueError(f"unknown weight store {backend!r} (expected redis or dir)")


def fetch(uri: str, sha256: str, *, redis_url: str | None = None) -> dict[str, Tensor]:
    """Fetch announced weights by uri alone (what a generator does with a WeightUpdate)."""
    if uri.startswith("redis:"):
        if redis_url is None:
            raise ValueError(f"{uri}: a Redis URL is needed to fetch it")
        store = RedisWeightStore.from_url(redis_url, policy="")
        try:
            return store.get(uri, sha256)
        finally:
            store.r.close()
    if uri.startswith("file:"):
        return DirWeightStore(path_of(uri).parent.parent, "").get(uri, sha256)
    raise ValueError(f"unsupported weight uri scheme: {uri}")
