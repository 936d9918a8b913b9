"""benchmarks/bench_server.py's repeated windows (``--repeats`` is checked, and the ratios are
taken from each level's median window; the full load test runs in gpu_check's test), and
benchmarks/bench_batcher_overhead.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_server  # noqa: E402


def window(mode: str, throughput: float, cpu_ms: float, p99_ms: float = 5.0, **labels):
    fields = dict(model="reversal", client="python", mix="fixed", concurrency=1)
    fields.update(labels)
    return bench_server.LevelResult(
        mode=mode,
        requests=100,
        errors=0,
        mismatches=0,
        seconds=1.0,
        throughput=throughput,
        p50_ms=2.0,
        p99_ms=p99_ms,
        server_cpu_ms=cpu_ms,
        **fields,
    )


def test_repeats_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench_server.parse_args(["--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err
    assert bench_server.parse_args(["--repeats", "3"]).repeats == 3


def test_each_level_reads_its_median_window():
    results = [
        window("batched", 300.0, 2.0, 9.0),
        window("batched", 100.0, 9.0, 1.0),  # an outlier window either way
        window("batched", 310.0, 2.1, 6.0),
        window("unbatched", 320.0, 2.2),
        window("batched", 50.0, 1.0, concurrency=8),  # another level: not mixed in
    ]
    medians = bench_server.median_results(results)
    level = medians[("reversal", "python", "fixed", 1, "batched")]
    assert (level.throughput, level.server_cpu_ms, level.p99_ms) == (300.0, 2.1, 6.0)
    assert medians[("reversal", "python", "fixed", 8, "batched")].throughput == 50.0
    assert len(medians) == 3


def test_ratios_come_from_the_medians(capsys):
    results = [window("batched", t, 2.0) for t in (300.0, 100.0, 310.0)]
    results.append(window("unbatched", 300.0, 2.0))
    bench_server.print_ratios(results)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reversal"))
    assert line.split()[4] == "1.00x"  # 300 / 300, not the mean 236.7 / 300


def test_the_batcher_overhead_benchmark_prints_both_sizes_and_a_ratio(capsys):
    import bench_batcher_overhead

    assert bench_batcher_overhead.main(["--requests", "50", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[1:3]]
    assert [row[0] for row in rows] == ["64", "1"]
    assert all(float(x) > 0 for row in rows for x in row[1:])
    assert out[-1].startswith("64 / 1: cpu ")
