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


def _serving(tmp_path, *options: str, timeout: float = 300) -> str:
    """The serving half's output, 2 s windows after 0.5 s of warm-up, with ``options``."""
    run = subprocess.run(
        [sys.executable, str(BENCH), "--only", "serving", "--duration", "2", "--warmup", "0.5",
         *options],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow  # starts two servers of the packaged G2P model
def test_serving_any_artifact_checks_its_answers_in_their_wire_form(tmp_path):
    """A token model's answers (lists) arrive joined by spaces: the client compares the wire
    form, so a right answer is never counted wrong."""
    words = tmp_path / "words.txt"
    words.write_text("HELLO  HH EH L OW\nWORLD  W ER L D\nSPEECH  S P IY CH\n", encoding="utf-8")
    model_dir = BENCH.parents[1] / "serving" / "models" / "cmudict-g2p-int8"
    out = _serving(tmp_path, "--model-dir", str(model_dir), "--sources", str(words),
                   "--servers", "plain", "plain-2-instances", "--clients", "4")  # fmt: skip
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| plain")]
    assert [row[0].lstrip("| ") for row in rows] == ["plain server", "plain server, --instances 2"]
    for row in rows:
        requests_per_s, errors, wrong = float(row[2]), row[6], row[7]
        assert requests_per_s > 0 and (errors, wrong) == ("0", "0"), row


@pytest.mark.slow  # starts the plain server and a Ray head with two replicas
def test_serving_reads_the_shared_port_replicas_and_the_clients_own_cores(tmp_path):
    out = _serving(tmp_path, "--servers", "plain", "ray-shared-1", "ray-shared-2",
                   "--clients", "8", "--wrk", "--lean", timeout=400)  # fmt: skip
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")][1:]
    names = [(row[0].lstrip("| "), row[1]) for row in rows]
    servers = [
        "plain server",
        "ray serve, shared port, 1 replica",
        "ray serve, shared port, 2 replicas",
    ]
    clients = ("python", "python-lean", "wrk")
    assert names == [(server, client) for server in servers for client in clients]
    for row in rows:
        errors, wrong, busy, client = row[6], row[7], float(row[8]), float(row[9])
        assert errors == "0" and wrong in ("0", "not read"), row
        assert 0 < client <= busy + 0.05, row  # the client's cores are a part of the machine's
    ratios = [line for line in out.splitlines() if line.startswith("ray serve (shared")]
    assert [line.split(":")[0] for line in ratios] == [
        f"ray serve (shared port), {client}" for client in clients
    ]
