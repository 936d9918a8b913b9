"""The benchmarks without a test of their own run end to end in their quick modes: a script that
imports but fails halfway (a renamed keyword, a changed signature) fails here. Their figures
are not checked: the benchmarks' own runs give those."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
QUICK = {
    "bench_decode_graph": ["--quick"],
    "bench_infer": ["--quick"],
    "bench_scorers": ["--quick"],
    "bench_train": ["--quick"],
    "bench_ensemble": ["--quick"],
    "bench_g2p_budget": ["--quick"],
    "bench_large_batch": ["--random-states", "0", "--examples", "2000"],
    "bench_defaults": ["--random-states", "0"],
    "bench_optimizer": ["--steps", "2"],
    "bench_data_parallel": ["--quick"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_the_benchmark_runs_in_its_quick_mode(name):
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *QUICK[name]],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "it printed no results"
