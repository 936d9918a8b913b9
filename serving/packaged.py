"""Models that ship inside the package, ready to serve without training.

Each is an artifact directory under ``serving/models/NAME/`` (what ``export_onnx`` writes, plus
its ``RECIPE.md``, measured figures and data license beside it)::

    python -m serving --model cmudict-g2p          # English grapheme-to-phoneme, CMUdict
    python -m serving --model cmudict-g2p-stress-int8   # the same with CMUdict's stress
    serving.load(serving.packaged_model_dir("cmudict-g2p")).predict(["HELLO"])

They live in the ``serving`` package, not in ``skattn``, so that a server-only install (numpy
and onnxruntime, no torch) has them too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from skattn.core.manifest import MANIFEST_FILE

__all__ = ["packaged_model_dir", "packaged_models"]


def _root() -> Path:
    return Path(str(resources.files("serving") / "models"))


def packaged_models() -> list[str]:
    """The names of the models that ship with this install, sorted."""
    root = _root()
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST_FILE).is_file())


def packaged_model_dir(name: str) -> Path:
    """The artifact directory of the packaged model ``name``; ``ValueError`` naming the ones
    there are if there is none of that name."""
    names = packaged_models()
    if name not in names:
        raise ValueError(
            f"model={name!r} is not a packaged model; packaged: {names or 'none'} "
            "(an exported model is served with --model-dir DIR)"
        )
    return _root() / name
