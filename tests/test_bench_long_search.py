"""benchmarks/bench_long_search.py runs, checks that its two paths agree, and prints one row
per beam width and output limit with the ratio and each path's growth."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_long_search  # noqa: E402


def test_the_benchmark_prints_a_row_per_beam_and_limit(capsys):
    argv = ["--limits", "8", "16", "--beam-sizes", "3", "20", "--repeats", "1"]
    assert bench_long_search.main(argv) == 0
    rows = [line.strip("|").split("|") for line in capsys.readouterr().out.splitlines()]
    rows = [[cell.strip() for cell in row] for row in rows if row[0].strip().isdigit()]
    expected = [("3", "8"), ("3", "16"), ("20", "8"), ("20", "16")]
    assert [(row[0], row[1]) for row in rows] == expected
    for row in rows:
        assert all(float(x) > 0 for x in row[2:5])  # graph s, step graphs s, ratio
        if row[1] == "8":  # the first limit of a beam: no growth yet
            assert row[5:] == ["-", "-"]
        else:
            assert all(float(x) > 0 for x in row[5:])


@pytest.mark.parametrize("flag", [["--limits", "0"], ["--beam-sizes", "0"], ["--repeats", "0"]])
def test_bad_arguments_are_refused(flag):
    with pytest.raises(SystemExit) as raised:
        bench_long_search.parse_args(flag)
    assert raised.value.code == 2
