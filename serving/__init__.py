"""serving: exported skattn models on numpy + onnxruntime, and their HTTP server.

Never imports torch or scikit-learn: a server image needs neither.

>>> import serving
>>> runtime = serving.load("model_dir")  # doctest: +SKIP
>>> runtime.predict(["a source string"])  # doctest: +SKIP
"""

from serving.artifact import ArtifactError
from serving.packaged import packaged_model_dir, packaged_models
from serving.runtime import Runtime, load

__all__ = ["ArtifactError", "Runtime", "load", "packaged_model_dir", "packaged_models"]
