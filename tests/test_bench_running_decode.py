"""benchmarks/bench_running_decode.py runs, checks its paths agree, and prints one row per
batch size with both ratios."""

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_running_decode  # noqa: E402


def test_the_benchmark_prints_a_row_and_two_ratios_per_batch_size(capsys):
    cores = os.sched_getaffinity(0)
    assert bench_running_decode.main(["--batch-sizes", "1", "3"]) == 0
    assert os.sched_getaffinity(0) == cores  # its one-core pin is given back
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    rows = [row for row in rows if row and row[0].isdigit()]
    assert [row[0] for row in rows] == ["1", "3"]
    for row in rows:
        assert all(float(x) > 0 for x in row[1:4])
        assert all(re.fullmatch(r"\d+\.\d\dx", x) for x in row[4:6])
