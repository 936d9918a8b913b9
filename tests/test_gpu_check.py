"""benchmarks/gpu_check.sh --dry-run: every step of the GPU check, on the CPU, prints its table.

The dry run trains one epoch of a tiny model, exports it, checks the runtime's step graphs with
IO binding and decode.onnx against the plain CPU runtime, times batches of 1, 64 and 256 and
runs bench_server.py briefly on the exported model (the GPU run does the same on CUDA).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_prints_one_table_of_every_step(tmp_path):
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", f"--keep={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout.splitlines()
    assert table[0].startswith("gpu_check (dry run on the CPU)")
    checks = [line.split()[0] for line in table[3:]]
    assert {"train", "export", "parity", "items/s", "bench_server"} <= set(checks)
    parity = [line for line in table if line.startswith("parity")]
    assert len(parity) == 2 and all("identical" in line for line in parity), parity
    assert sum(line.startswith("items/s") for line in table) == 9  # 3 batch sizes x 3 paths
    assert any("batched" in line and "0 errors, 0 wrong" in line for line in table)
    assert any("unbatched" in line and "0 errors, 0 wrong" in line for line in table)
    assert (tmp_path / "model" / "decode.onnx").is_file()  # --keep kept the artifact


def test_gpu_check_refuses_unknown_arguments():
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--gpu"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "usage" in result.stderr
