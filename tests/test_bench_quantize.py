"""benchmarks/bench_quantize.py: float32 and int8 artifacts side by side, with their accuracy."""

import sys
from pathlib import Path
from types import SimpleNamespace

import joblib
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_quantize  # noqa: E402

import serving  # noqa: E402
from skattn import Seq2Seq  # noqa: E402
from skattn.datasets import load_cmudict  # noqa: E402


def check_row(row: dict, items: int, one_model: bool = True) -> None:
    assert row["items"] == items and 0.0 <= row["shared_answers"] <= 1.0
    rates = [row[kind]["items_per_second"] for kind in bench_quantize.KINDS]
    assert all(rate > 0 for rate in rates)
    assert row["ratio"] == pytest.approx(rates[1] / rates[0])
    if one_model:
        # int8 weights take a quarter of float32's bytes (plus a scale per column); the
        # graphs' nodes do not shrink, and weigh most in a tiny model
        assert row["int8"]["megabytes"] < row["float32"]["megabytes"]


def test_the_quick_run_compares_both_artifacts_on_the_same_sources(capsys):
    rows = bench_quantize.main(["--quick"])
    assert [(row["model"], row["beam_size"]) for row in rows] == [("reversal", 1)]
    check_row(rows[0], 300)
    assert len(rows[0]["round_ratios"]) == 2
    for kind in bench_quantize.KINDS:
        assert 0.0 <= rows[0][kind]["exact"] <= 1.0
    assert "int8/float" in capsys.readouterr().out


def test_a_g2p_model_is_scored_by_per_and_wer(tmp_path):
    X, y = load_cmudict("train")
    model = Seq2Seq(embedding_dim=16, hidden_size=32, max_epochs=2, random_state=0)
    joblib.dump(model.fit(X[:400], y[:400]), tmp_path / "g2p.joblib")
    task = bench_quantize.g2p_task(tmp_path / "g2p.joblib", 40)
    assert len(task[1]) == 40
    args = SimpleNamespace(beam_sizes=[1, 2], repeats=1)
    rows = bench_quantize.measure("g2p", task, args)
    assert [row["beam_size"] for row in rows] == [1, 2]
    for row in rows:
        check_row(row, 40)
        for kind in bench_quantize.KINDS:
            assert 0.0 <= row[kind]["per"] and 0.0 <= row[kind]["wer"] <= 100.0


def test_the_packaged_artifacts_are_compared_as_they_ship():
    if not {"cmudict-g2p", "cmudict-g2p-int8"} <= set(serving.packaged_models()):
        pytest.skip("the packaged G2P models are not in this install")
    row = bench_quantize.packaged(SimpleNamespace(g2p_words=30, repeats=1))
    assert (row["model"], row["beam_size"]) == ("packaged", 5)
    check_row(row, 30, one_model=False)  # the two-layer ensemble in int8, the one-layer in float
    assert "decode.onnx: True" in row["layout"]  # the int8 one ships its search graph


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--beam-sizes", "0"], ["--g2p-words", "-1"]])
def test_bad_options_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bench_quantize.parse_args(bad)
    assert "must be >=" in capsys.readouterr().err
