"""benchmarks/bench_runtime_chunks.py runs its quick configuration, checks that every layout
predicts the same, and prints one row per configuration with its ratio to the first."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_runtime_chunks  # noqa: E402

from skattn.core.checks import usable_cores  # noqa: E402


def test_the_quick_run_gives_a_row_per_configuration(capsys):
    rows = bench_runtime_chunks.main(["--quick"])
    cores = usable_cores()
    labels = [label for label, _ in bench_runtime_chunks.configurations(cores, quick=True)]
    assert [(name, beam, label) for name, beam, label, *_ in rows] == [
        ("reversal", 1, label) for label in labels
    ]
    assert rows[0][-1] == 1.0  # the first row is the base of the ratios
    assert all(rate > 0 and ratio > 0 for *_, rate, _, ratio in rows)
    printed = capsys.readouterr().out
    assert all(label in printed for label in labels)


def test_every_configuration_loads_as_its_label_says(tmp_path, monkeypatch):
    """The rows' thread layouts are what the runtime was asked for (4 cores faked)."""
    calls = []
    monkeypatch.setattr(
        bench_runtime_chunks.serving, "load", lambda directory, **options: calls.append(options)
    )
    for label, options in bench_runtime_chunks.configurations(4, quick=False):
        bench_runtime_chunks.load(tmp_path, options, 4)
        got = calls[-1]
        assert got.get("max_batch_size") == options.get("max_batch_size")
        if "1 at a time" in label:
            assert got["workers"] == 1
            assert got["intra_op_num_threads"] == (1 if "1 thread" in label else 4)
        else:  # the runtime's default layout: a worker per core, one thread each
            assert "workers" not in got and "intra_op_num_threads" not in got
        if "default" in label:  # and its chunks by the model's width
            assert "max_batch_size" not in got


@pytest.mark.parametrize("bad", [["--repeats", "0"], ["--beam-sizes", "0"], ["--g2p-words", "0"]])
def test_bad_options_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bench_runtime_chunks.parse_args(bad)
    assert "must be >= 1" in capsys.readouterr().err
