"""Tests for the packaged models: ``serving.packaged_models``, ``--model NAME`` and the shipped
English G2P model (``cmudict-g2p``), which must do what its recorded figures say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import serving
from serving import packaged
from serving.__main__ import build_parser, main


@pytest.fixture
def fake_root(tmp_path, monkeypatch, fitted_reversal):
    """A packaged-models folder holding one exported reversal model, ``rev``."""
    fitted_reversal.export_onnx(tmp_path / "rev")
    (tmp_path / "not-a-model").mkdir()  # folders without a manifest are not models
    monkeypatch.setattr(packaged, "_root", lambda: tmp_path)
    return tmp_path


def test_packaged_models_lists_the_artifacts_and_names_them(fake_root, fitted_reversal):
    assert serving.packaged_models() == ["rev"]
    runtime = serving.load(serving.packaged_model_dir("rev"))
    assert runtime.predict(["123", "4567"]) == fitted_reversal.predict(["123", "4567"])
    with pytest.raises(
        ValueError, match=r"model='nope' is not a packaged model; packaged: \['rev'\]"
    ):
        serving.packaged_model_dir("nope")


def test_the_command_line_serves_a_packaged_model_beside_a_model_dir(fake_root):
    args = build_parser().parse_args(["--model", "rev", "--model-dir", "x"])
    assert args.model == [("rev", fake_root / "rev")]
    assert args.model_dir == [(None, Path("x"))]


def test_the_command_line_refuses_an_unknown_or_missing_model(fake_root, capsys, keep_logging):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "nope"])
    assert "is not a packaged model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
    assert "--model-dir DIR (an export) or --model NAME" in capsys.readouterr().err


# ---------------------------------------------------------------- the shipped G2P model

G2P = "cmudict-g2p"
#: The two-layer ensemble exported with int8 weight products, for the CPU (skattn.quantize).
G2P_INT8 = "cmudict-g2p-int8"
#: One two-layer network trained on CMUdict's stressed pronunciations, int8 (the CPU).
G2P_STRESS = "cmudict-g2p-stress-int8"


@pytest.fixture(scope="module", params=[G2P, G2P_INT8, G2P_STRESS])
def g2p_dir(request):
    if request.param not in serving.packaged_models():
        pytest.skip(f"{request.param} is not in this install")
    return serving.packaged_model_dir(request.param)


def test_both_g2p_packages_are_the_two_layer_ensemble_within_the_budget():
    """The two-layer ensemble is 27 MB in float32: it ships with float16 weights (any device;
    its search graph left out to fit) and with int8 products (the CPU; with its search graph).
    Each records figures measured on its own artifact."""
    if not {G2P, G2P_INT8} <= set(serving.packaged_models()):
        pytest.skip("the packaged G2P models are not in this install")
    half_dir, int8_dir = (serving.packaged_model_dir(name) for name in (G2P, G2P_INT8))
    manifests = [serving.load(d, "cpu").manifest for d in (half_dir, int8_dir)]
    assert [m.quantization for m in manifests] == ["float16", "int8"]
    assert manifests[0].model == manifests[1].model  # the same members
    assert "decode.onnx" in manifests[1].files  # small enough to keep the search graph
    for directory, manifest in zip((half_dir, int8_dir), manifests, strict=True):
        figures = json.loads((directory / "figures.json").read_text())
        assert figures["quantization"] == manifest.quantization  # measured on this artifact
        assert figures["test_wer"] < 24.0 and figures["test_per"] < 5.5
        assert "of 2 layers" in (directory / "RECIPE.md").read_text()


def test_the_stressed_g2p_model_marks_every_vowel_and_nothing_else():
    """As CMUdict does: each vowel ends in 0, 1 or 2; a consonant has no digit; a word of
    one or more syllables has a primary stress."""
    from skattn.datasets import ARPABET_VOWELS

    if G2P_STRESS not in serving.packaged_models():
        pytest.skip(f"{G2P_STRESS} is not in this install")
    words = ["HELLO", "PHOTOGRAPHY", "STRENGTHS", "UNBELIEVABLE", "NAPOLEON"]
    predictions = serving.load(serving.packaged_model_dir(G2P_STRESS), "cpu").predict(words)
    for word, phonemes in zip(words, predictions, strict=True):
        vowels = [p for p in phonemes if p[:-1] in ARPABET_VOWELS]
        assert vowels and all(p[-1] in "012" for p in vowels), (word, phonemes)
        assert all(p in vowels or p.isalpha() for p in phonemes), (word, phonemes)
        assert not set(phonemes) & ARPABET_VOWELS, (word, phonemes)  # no unmarked vowel
        assert any(p.endswith("1") for p in vowels), (word, phonemes)


def test_the_g2p_model_ships_with_its_recipe_figures_and_license(g2p_dir):
    size = sum(p.stat().st_size for p in g2p_dir.iterdir())
    assert size <= 16 * 2**20  # "at most about 15 MB"
    assert "CMUdict" in (g2p_dir / "LICENSE").read_text()
    figures = json.loads((g2p_dir / "figures.json").read_text())
    assert {"test_wer", "test_per", "train_seconds"} <= set(figures)
    assert (g2p_dir / "RECIPE.md").read_text().strip()


@pytest.mark.slow
def test_the_g2p_model_reaches_its_recorded_test_figures_on_a_sample(g2p_dir):
    """On the stressless references, and for the stressed model on the stressed ones too."""
    from skattn.datasets import group_pronunciations, load_cmudict, strip_stress
    from skattn.metrics import phoneme_error_rate, word_error_rate

    words, references = group_pronunciations(*load_cmudict("test"))
    sample = slice(0, len(words), 12)  # 1,000 of the 11,994 test words, spread over the list
    words, references = words[sample], references[sample]
    predictions = serving.load(g2p_dir, intra_op_num_threads=1).predict(words)
    figures = json.loads((g2p_dir / "figures.json").read_text())
    stressless = strip_stress(predictions)
    assert (stressless != predictions) == figures.get("stress", False)
    # A 1,000-word sample of a WER near 25 % has a standard error of about 1.4 points.
    assert 100 * word_error_rate(references, stressless) <= figures["test_wer"] + 5.0
    assert 100 * phoneme_error_rate(references, stressless) <= figures["test_per"] + 2.0
    if figures.get("stress"):
        stressed = dict(zip(*group_pronunciations(*load_cmudict("test", stress=True)), strict=True))
        pairs = [(stressed[w], p) for w, p in zip(words, predictions, strict=True) if w in stressed]
        references, kept = [r for r, _ in pairs], [p for _, p in pairs]
        assert len(pairs) > 950
        assert 100 * word_error_rate(references, kept) <= figures["stressed_test_wer"] + 5.0
        assert 100 * phoneme_error_rate(references, kept) <= figures["stressed_test_per"] + 2.0


def test_two_models_under_one_name_are_refused_before_loading(fake_root, capsys, keep_logging):
    with pytest.raises(SystemExit):
        main(["--model", "rev", "--model", "rev"])
    assert "--model rev: another model is served under that name too" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "rev", "--model-name", "x"])
    assert "packaged --model NAMEs keep their names" in capsys.readouterr().err


def _package_script():
    """scripts/package_g2p.py as a module (scripts/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "package_g2p.py"
    spec = importlib.util.spec_from_file_location("package_g2p", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_packaging_script_refuses_before_it_exports_or_deletes(tmp_path, capsys):
    """--out was replaced whole, whatever it held (--out . would have emptied the checkout);
    missing inputs and a bad --max-mb failed late, in tracebacks."""
    script = _package_script()
    model, results = tmp_path / "m.joblib", tmp_path / "r.json"
    model.write_bytes(b"x")
    results.write_text("{}")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "important.txt").write_text("keep")
    base = ["--model", str(model), "--results", str(results)]
    for argv, words in (
        ([*base, "--out", str(precious)], "holds something other than a package"),
        ([*base, "--out", str(results)], "a file, not a folder"),
        (
            ["--model", str(tmp_path / "no.joblib"), "--results", str(results), "--out", "o"],
            "no such file",
        ),
        ([*base, "--out", str(tmp_path / "new"), "--max-mb", "nan"], "--max-mb must be a positive"),
        ([*base, "--out", str(tmp_path / "new"), "--max-mb", "-5"], "--max-mb must be a positive"),
    ):
        with pytest.raises(SystemExit) as refused:
            script.main(argv)
        assert refused.value.code == 2
        assert words in capsys.readouterr().err
    assert (precious / "important.txt").read_text() == "keep"


def _results(stress: bool) -> dict:
    """The fields of ``examples/g2p_cmudict.py --out`` that the packaging script reads."""
    rows = {}
    for split, (words, per, wer) in {"test": (11994, 5.7, 24.4), "dev": (3000, 5.9, 24.6)}.items():
        rows[f"skattn_{split}"] = {"words": words, "per": per, "wer": wer}
        if stress:
            rows[f"skattn_{split}"]["stressed"] = {"words": words - 79, "per": 7.5, "wer": 29.3}
    return {"config": {"beam_size": 3, "stress": stress}, **rows}


@pytest.mark.parametrize("stress", [False, True])
def test_the_packaging_script_says_whether_the_model_gives_stress(
    tmp_path, fitted_reversal, stress
):
    """A model trained on CMUdict's stress (``--stress``) is packaged with its figures both
    ways, and its recipe says that its vowels carry stress digits."""
    import joblib

    script = _package_script()
    model, results = tmp_path / "m.joblib", tmp_path / "r.json"
    joblib.dump(fitted_reversal, model)
    results.write_text(json.dumps(_results(stress)))
    out = script.main(
        ["--model", str(model), "--results", str(results), "--out", str(tmp_path / "g2p")]
    )
    figures = json.loads((out / "figures.json").read_text())
    recipe = (out / "RECIPE.md").read_text()
    assert serving.load(out, "cpu").manifest.beam_size == 3  # the beam the figures were at
    assert (figures["test_wer"], figures["dev_per"], figures["stress"]) == (24.4, 5.9, stress)
    stressed = {k: v for k, v in figures.items() if k.startswith("stressed_")}
    if stress:
        assert stressed == {
            "stressed_test_per": 7.5,
            "stressed_test_wer": 29.3,
            "stressed_test_words": 11915,
            "stressed_dev_per": 7.5,
            "stressed_dev_wer": 29.3,
            "stressed_dev_words": 2921,
        }
        assert "(CMUdict ARPAbet, with stress)" in recipe and "--stress`" in recipe
        assert "test (11,915 words): PER 7.5 %, WER 29.3 %" in recipe
    else:
        assert stressed == {}
        assert "(CMUdict ARPAbet, stress removed)" in recipe and "--stress" not in recipe
