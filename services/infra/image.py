"""The sandbox image `rollstream-sandbox:<recipe>`: built once, rebuilt when its recipe changes.

The recipe is everything under deploy/sandbox/ plus the Debian suite; its sha256 names
the tag, so a changed executor or Dockerfile yields a new image and an old one is reused
as it is. Two build paths run the same customize.sh:

- `docker build` of deploy/sandbox/Dockerfile, where its base image can be pulled;
- debootstrap (minbase + python3) into a cached tree, then `docker import`,
  where no registry is reachable.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

from services.infra import docker_engine
from services.infra.common import DEPLOY_DIR, Check, StackError, ensure_debian_packages, which
from services.settings import Settings

RECIPE_DIR = DEPLOY_DIR / "sandbox"
DEBIAN_PACKAGES = ("python3",)
"""Packages over minbase (python3: the interpreter with the whole standard library; keep in
step with the Dockerfile's apt-get line)."""
SANDBOX_UID = 10001
IMAGE_CHANGES = [
    "LABEL rollstream.image=sandbox",
    "ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8 HOME=/tmp",
    f"USER {SANDBOX_UID}:{SANDBOX_UID}",
    "WORKDIR /work",
    'CMD ["python3"]',
]


def recipe_hash(settings: Settings, recipe_dir: Path = RECIPE_DIR) -> str:
    """sha256 over the suite and every recipe file (path and bytes), in a stable order."""
    h = hashlib.sha256(
        f"suite={settings.sandbox.debian_suite}\npackages={','.join(DEBIAN_PACKAGES)}\n".encode()
    )
    for path in sorted(p for p in recipe_dir.rglob("*") if _in_recipe(p)):
        rel = path.relative_to(recipe_dir).as_posix()
        h.update(f"{rel}\n{path.stat().st_mode & 0o111:o}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _in_recipe(path: Path) -> bool:
    """Recipe files: everything but bytecode a local run may leave behind."""
    return path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"


def image_ref(settings: Settings) -> str:
    """The full reference of the image this checkout's recipe builds."""
    return f"{settings.sandbox.image}:{recipe_hash(settings)[:12]}"


def probe(settings: Settings) -> Check:
    ref = image_ref(settings)
    check = Check("image", False, ref)
    try:
        c = docker_engine.client(settings, timeout_s=10)
        try:
            img = c.images.get(ref)
        finally:
            c.close()
    except Exception as exc:
        check.detail = f"{ref} not found: {type(exc).__name__}: {str(exc)[:160]}"
        check.fix = (
            "run `rollstream up` to build it (debootstrap + docker import without a registry)"
        )
        return check
    check.healthy = True
    check.version = (img.id or "").removeprefix("sha256:")[:12]
    check.detail = f"built {img.attrs.get('Created', '?')[:19]}"
    check.extra = {"id": img.id, "recipe": img.labels.get("rollstream.recipe", "")}
    return check


def up(settings: Settings) -> Check:
    current = probe(settings)
    if current.healthy:
        current.detail = "reused: " + current.detail
        return current
    settings.stack.cache_dir.mkdir(parents=True, exist_ok=True)
    with (settings.stack.cache_dir / "sandbox-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others then reuse it
        current = probe(settings)
        if current.healthy:
            current.detail = "reused: " + current.detail
            return current
        return _build(settings)


def _build(settings: Settings) -> Check:
    mode = settings.sandbox.build
    if mode == "dockerfile" or (mode == "auto" and _base_pullable(settings)):
        _build_dockerfile(settings)
    else:
        _build_debootstrap(settings)
    check = probe(settings)
    if not check.healthy:
        raise StackError(f"the sandbox image build finished but {image_ref(settings)} is missing")
    check.detail = "built: " + check.detail
    _prune_old_recipes(settings)
    return check


def _prune_old_recipes(settings: Settings) -> None:
    """Untag images of older recipes (an image a container still uses is kept by Docker)."""
    current = image_ref(settings)
    c = docker_engine.client(settings, timeout_s=60)
    try:
        for img in c.images.list(name=settings.sandbox.image):
            for tag in img.tags:
                if tag not in (current, f"{settings.sandbox.image}:latest"):
                    with contextlib.suppress(Exception):
                        c.images.remove(tag, noprune=False)
    finally:
        c.close()


def _dockerfile_base() -> str:
    match = re.search(r"^FROM\s+(\S+)", (RECIPE_DIR / "Dockerfile").read_text(), re.M)
    if not match:
        raise StackError("deploy/sandbox/Dockerfile has no FROM line")
    return match.group(1)


def _base_pullable(settings: Settings) -> bool:
    """Pull the Dockerfile's base, giving up after sandbox.pull_timeout_s."""
    base = _dockerfile_base()
    result: list[bool] = []

    def pull() -> None:
        try:
            c = docker_engine.client(settings, timeout_s=settings.sandbox.pull_timeout_s)
            try:
                c.images.pull(base)
            finally:
                c.close()
            result.append(True)
        except Exception:
            result.append(False)

    t = threading.Thread(target=pull, daemon=True)
    t.start()
    t.join(settings.sandbox.pull_timeout_s)
    return bool(result and result[0])


def _build_dockerfile(settings: Settings) -> None:
    ref = image_ref(settings)
    c = docker_engine.client(settings, timeout_s=900)
    try:
        c.images.build(
            path=str(RECIPE_DIR),
            tag=ref,
            buildargs={"RECIPE": recipe_hash(settings)},
            rm=True,
            forcerm=True,
            network_mode="default",
        )
        c.images.get(ref).tag(settings.sandbox.image, "latest")
    except Exception as exc:
        raise StackError(f"docker build of {RECIPE_DIR}/Dockerfile failed: {exc}") from exc
    finally:
        c.close()


def _debian_mirror(settings: Settings) -> str:
    if settings.sandbox.debian_mirror:
        return settings.sandbox.debian_mirror
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for src in sources:
        try:
            text = src.read_text()
        except OSError:
            continue
        for m in re.finditer(r"^(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text, re.M):
            url = m.group(1)
            if "security" not in url and url.startswith(("http://", "https://")):
                return url
    return "http://deb.debian.org/debian"


def rootfs(settings: Settings) -> Path:
    """A debootstrapped minbase tree with DEBIAN_PACKAGES, cached (built once, ~30 s)."""
    suite = settings.sandbox.debian_suite
    tree = settings.stack.cache_dir / "sandbox-rootfs" / "-".join((suite, *DEBIAN_PACKAGES))
    if (tree / ".complete").exists():
        return tree
    ensure_debian_packages({"debootstrap": "debootstrap"})
    partial = tree.with_name(tree.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        which("debootstrap") or "debootstrap",
        "--variant=minbase",
        f"--include={','.join(DEBIAN_PACKAGES)}",
        suite,
        str(partial),
        _debian_mirror(settings),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(
            f"debootstrap failed (exit {proc.returncode}); command: {' '.join(cmd)}\n"
            + (proc.stdout + proc.stderr)[-2000:]
        )
    (partial / ".complete").write_text(suite)
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    return tree


def _build_debootstrap(settings: Settings) -> None:
    base = rootfs(settings)
    work = settings.stack.cache_dir / "sandbox-build"
    shutil.rmtree(work, ignore_errors=True)
    tree = work / "rootfs"
    work.mkdir(parents=True)
    try:
        subprocess.run(["cp", "-a", f"{base}/.", str(tree)], check=True)
        (tree / ".complete").unlink(missing_ok=True)
        shutil.copytree(
            RECIPE_DIR / "files",
            tree / "opt" / "rollstream",
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        shutil.copy2(RECIPE_DIR / "customize.sh", tree / "tmp" / "customize.sh")
        proc = subprocess.run(
            [which("chroot") or "chroot", str(tree), "/bin/sh", "/tmp/customize.sh"],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise StackError(f"customize.sh failed in the chroot:\n{proc.stderr[-2000:]}")
        (tree / "tmp" / "customize.sh").unlink()
        archive = work / "rootfs.tar"
        with tarfile.open(archive, "w") as tar:
            for child in sorted(tree.iterdir()):
                tar.add(child, arcname=child.name)
        _import(settings, archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _import(settings: Settings, archive: Path) -> None:
    repo, tag = image_ref(settings).split(":")
    changes = [*IMAGE_CHANGES, f"LABEL rollstream.recipe={recipe_hash(settings)}"]
    c = docker_engine.client(settings, timeout_s=600)
    try:
        c.api.import_image_from_file(str(archive), repository=repo, tag=tag, changes=changes)
        c.images.get(f"{repo}:{tag}").tag(repo, "latest")
    except Exception as exc:
        raise StackError(f"docker import of the sandbox root filesystem failed: {exc}") from exc
    finally:
        c.close()
