"""The one place a service turns `learner.model` into the model files it loads.

`learner.model` names a model (`tiny`, `smollm2`, `gguf:PATH`, `hf:PATH` or a plain path:
services/infra/models.py). Every service that builds a policy from the `[learner]` section
(the learner, the generators, the demo, the warm-up, the ingest tokenizer, `rollstream
eval`, the benchmarks) first calls `resolved(settings)`: the same section with `model` set
to the local Hugging Face directory of the named model (fetched and converted once, cached
under `stack.cache_dir`), so learner/spec.py only ever sees `tiny` or a directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from learner.config import LearnerSettings
    from services.settings import Settings


def resolved(settings: Settings, section: LearnerSettings | None = None) -> LearnerSettings:
    """`section` (default: `settings.learner`) with `model` resolved to a local directory
    (`tiny` stays `tiny`)."""
    from services.infra.models import resolve

    ls = section if section is not None else settings.learner
    path = resolve(ls.model, settings.stack.cache_dir)
    if path is None:
        return ls
    return ls.model_copy(update={"model": str(path)})


def is_pretrained(settings: Settings) -> bool:
    """Whether the configured policy is a pretrained (Hugging Face) model."""
    return settings.learner.model != "tiny"
