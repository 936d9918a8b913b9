"""skattn: attention sequence-to-sequence models as scikit-learn estimators.

The estimator (and with it torch and scikit-learn) is imported lazily, so that the torch-free
modules (`skattn.core.text`, `skattn.core.search`, `skattn.reference`) stay light for `serving`.
"""

__version__ = "0.1.0"

__all__ = ["Seq2Seq", "Seq2SeqEnsemble", "__version__", "distill"]


def __getattr__(name):
    if name == "Seq2Seq":
        from skattn.estimator import Seq2Seq

        return Seq2Seq
    if name == "Seq2SeqEnsemble":
        from skattn.ensemble import Seq2SeqEnsemble

        return Seq2SeqEnsemble
    if name == "distill":
        from skattn.distillation import distill

        return distill
    raise AttributeError(f"module 'skattn' has no attribute {name!r}")
