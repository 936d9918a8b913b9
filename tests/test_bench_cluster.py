"""benchmarks/bench_cluster.py's search half, quick: every engine's search equals n_jobs=1's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cluster.py"
ENGINES = [
    "n_jobs=1",
    "n_jobs=1, n_threads=1",
    "loky, 2 processes",
    "dask, 2 workers",
    "dask, 2 workers, DASK_WORKER_CONFIG",
    "ray, 2 CPUs",
]


@pytest.mark.slow  # starts two Dask clusters and a Ray head in a process of its own
def test_quick_search_rounds_report_every_engine_equal_to_serial(tmp_path):
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--only", "search", "--rounds", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    timed = [line.split(": ")[0] for line in run.stdout.splitlines() if ", search on " in line]
    first = [f"round 1, search on {name}" for name in ENGINES]
    second = [f"round 2, search on {name}" for name in [*ENGINES[-2::-1], ENGINES[-1]]]
    assert timed == first + second  # the second round in reverse order, Ray last in both
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| ")]
    table = {row[0].lstrip("| "): row for row in rows if row[0].lstrip("| ") in ENGINES}
    assert list(table) == ENGINES  # printed in the canonical order, whatever the timing order
    assert [row[-1].rstrip(" |") for row in table.values()] == ["True"] * len(ENGINES)
    assert table["n_jobs=1"][4:6] == ["1.00x", "1.00x"]
