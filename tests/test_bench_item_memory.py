"""benchmarks/bench_item_memory.py: beam search with one copy of an item's memory against one
per beam, and two artifacts of one model compared as they are."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_item_memory  # noqa: E402

import serving  # noqa: E402


def test_the_quick_run_times_both_layouts_with_the_same_answers(capsys):
    rows = bench_item_memory.main(["--quick"])
    assert [row[0] for row in rows] == [1, 8, 32]
    for _, per_row, per_item, same, batches in rows:
        # the same sums in another order: a near-tie of this briefly trained model may flip
        assert per_row > 0 and per_item > 0 and 0.9 * batches <= same <= batches
    assert "per item ms/item" in capsys.readouterr().out


@pytest.mark.slow
def test_two_artifacts_are_compared_as_they_are():
    packaged = serving.packaged_model_dir("cmudict-g2p-int8")
    argv = ["--artifacts", str(packaged), str(packaged), "--batch-sizes", "1", "16"]
    rows = bench_item_memory.main([*argv, "--n-inputs", "32", "--repeats", "1"])
    assert [row[0] for row in rows] == [1, 16]
    assert all(same == words == 11_994 for *_, same, words in rows)  # an artifact and itself


def test_a_greedy_beam_is_refused():
    with pytest.raises(SystemExit):
        bench_item_memory.parse_args(["--beam-size", "1"])
