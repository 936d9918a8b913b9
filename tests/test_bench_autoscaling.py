"""benchmarks/bench_autoscaling.py, short: its phases against a shared port that autoscales,
every answer checked, and the side-by-side table."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("ray")
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_autoscaling.py"
sys.path.insert(0, str(BENCH.parent))

from bench_autoscaling import least_share, parse_args  # noqa: E402

from serving.shared_port import migrates_queued_connections  # noqa: E402


@pytest.mark.slow  # a Ray head in a process of its own, 18 s of load
def test_a_short_run_scales_up_and_back_and_answers_everything(tmp_path):
    run = subprocess.run(
        [sys.executable, str(BENCH), "--phases", "64:10,2:10", "--close-grace", "0.5",
         "--migrate-req", "keep", "--connections", "keepalive", "--connection-age", "none", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    side_by_side = run.stdout.split("## side by side")[1]
    rows = [line for line in side_by_side.splitlines() if line.startswith("| ") and "0.5" in line]
    assert len(rows) == 2  # without an age limit and with 1 s
    shares = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        ups, downs, answered, errors, wrong = (int(cells[i]) for i in (3, 4, 5, 6, 8))
        assert answered > 0 and wrong == 0
        assert ups >= 1 and downs >= 1  # up to 2 on the shared port's load alone, and back
        if migrates_queued_connections():  # (else a closing socket's waiting connections reset)
            assert errors == 0
        shares[cells[2]] = cells[9]  # the 64-client phase's least-loaded replica's share
    if shutil.which("ss") is not None and os.geteuid() == 0:  # (ss names others' processes)
        # kept-alive clients stay on the first replica, unless their connections age
        assert float(shares["none"]) == 0 and float(shares["1.0"]) > 0, shares


def test_the_least_loaded_replicas_share_counts_a_replica_without_connections():
    assert least_share(Counter({"1": 30, "2": 10}), 2) == 0.25
    assert least_share(Counter({"1": 40}), 2) == 0.0  # the second replica has none
    assert least_share(Counter(), 2) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--phases", "64"], "--phases must be CLIENTS:SECONDS"),
        (["--phases", "0:5"], "--phases must be CLIENTS:SECONDS"),
        (["--max-replicas", "1"], "--max-replicas must be >= 2"),
        (["--connection-age", "old"], "--connection-age takes none or seconds"),
        (["--connection-age", "0"], "--connection-age takes none or seconds"),
        (["--connection-age", "none", "1e6"], "--connection-age takes none or seconds"),
    ],
)
def test_bad_arguments_are_refused_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err
