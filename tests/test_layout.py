"""The names DESIGN.md's layout promises (users and outside tools import them by these names)."""

import importlib

import pytest

# DESIGN.md, "Layers (and the top-level layout)": module -> public names it must hold
LAYOUT = {
    "skattn.reference": ["masked_softmax", "additive_attention", "luong_scores"],
    "skattn.attention": [],
    "skattn.models": [],
    "skattn.text": ["Vocabulary", "tokenize", "detokenize"],
    "skattn.estimator": ["Seq2Seq"],
    "skattn.metrics": ["exact_match", "phoneme_error_rate", "word_error_rate"],
    "skattn.datasets": ["load_cmudict"],
    "skattn.plotting": ["plot_attention"],
    "skattn.export": [],
    "serving": ["load"],
}


@pytest.mark.parametrize("module", sorted(LAYOUT))
def test_the_layouts_modules_hold_their_names(module):
    loaded = importlib.import_module(module)
    for name in LAYOUT[module]:
        assert hasattr(loaded, name), f"{module}.{name}"


def test_the_estimator_has_the_contracts_methods():
    from skattn import Seq2Seq

    for method in ("fit", "predict", "score", "predict_attention", "export_onnx"):
        assert callable(getattr(Seq2Seq, method)), method
