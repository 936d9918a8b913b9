"""benchmarks/bench_quantize.py: float32, int8 and float16-weight artifacts side by side, with
their accuracy."""

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


def check_row(row: dict, items: int, kinds=bench_quantize.KINDS) -> None:
    assert row["items"] == items
    assert [kind for kind in row if isinstance(row[kind], dict)] == list(kinds)
    first = row[kinds[0]]
    assert first["ratio"] == 1.0 and first["shared_answers"] == 1.0
    for kind in kinds:
        result = row[kind]
        assert result["items_per_second"] > 0 and 0.0 <= result["shared_answers"] <= 1.0
        assert result["ratio"] == pytest.approx(
            result["items_per_second"] / first["items_per_second"]
        )
    if kinds == bench_quantize.KINDS:
        # int8 weights take a quarter of float32's bytes (plus a scale per column), float16
        # ones half; the graphs' nodes do not shrink, and weigh most in a tiny model
        assert row["int8"]["megabytes"] < row["float32"]["megabytes"]
        assert row["float16"]["megabytes"] < row["float32"]["megabytes"]


def test_the_quick_run_compares_both_artifacts_on_the_same_sources(capsys):
    rows = bench_quantize.main(["--quick"])
    assert [(row["model"], row["beam_size"]) for row in rows] == [("reversal", 1)]
    check_row(rows[0], 300)
    out = capsys.readouterr().out
    for kind in bench_quantize.KINDS:
        assert len(rows[0][kind]["round_ratios"]) == 2
        assert 0.0 <= rows[0][kind]["exact"] <= 1.0
        assert f"  {kind} " in out


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
    check_row(row, 30, kinds=("float16", "int8"))  # the two-layer ensemble, both ways
    assert "decode.onnx: False" in row["float16"]["layout"]  # left out of the float package
    assert "decode.onnx: True" in row["int8"]["layout"]  # the int8 one ships its search graph


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--beam-sizes", "0"], ["--g2p-words", "-1"]])
def test_bad_options_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bench_quantize.parse_args(bad)
    assert "must be >=" in capsys.readouterr().err
