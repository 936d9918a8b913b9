"""benchmarks/bench_step_cells.py: the three decode graphs (cells fused, the step's expanded,
all expanded) give the same tokens and are timed side by side."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_step_cells  # noqa: E402

import skattn.export  # noqa: E402


def test_a_small_run_prints_a_row_per_search_and_batch(capsys):
    thresholds = dict(skattn.export.STEP_CELLS_EXPANDED_FROM)
    argv = ["--widths", "64", "--n-inputs", "24", "--train-steps", "20", "--repeats", "1"]
    assert bench_step_cells.main([*argv, "--batch-sizes", "1", "8"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    rows = [row for row in rows if row and row[0] == "64"]
    assert [(row[1], row[2]) for row in rows] == [("1", "1"), ("1", "8"), ("5", "1"), ("5", "8")]
    assert all(float(value) > 0 for row in rows for value in row[3:6])
    assert skattn.export.STEP_CELLS_EXPANDED_FROM == thresholds  # put back as it was
