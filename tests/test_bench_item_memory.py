"""benchmarks/bench_item_memory.py: beam search with one copy of an item's memory against one
per beam (in ``decode.onnx`` and in the NumPy search over the step graphs), and two artifacts of
one model compared as they are. Each run is a process of its
own: the script pins itself to one core and one thread, which must not outlast it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import serving

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_item_memory.py"


def run(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_the_quick_run_times_both_layouts_with_the_same_answers():
    rows = re.findall(
        r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s.* (\d+)/(\d+) batches$", run("--quick"), re.M
    )
    assert [int(row[0]) for row in rows] == [1, 8, 32]
    for _, per_row, per_item, same, batches in rows:
        # the same sums in another order: a near-tie of this briefly trained model may flip
        assert float(per_row) > 0 and float(per_item) > 0
        assert 0.9 * int(batches) <= int(same) <= int(batches)


@pytest.mark.slow
def test_two_artifacts_are_compared_as_they_are():
    packaged = str(serving.packaged_model_dir("cmudict-g2p-int8"))
    options = ["--batch-sizes", "1", "16", "--n-inputs", "32", "--repeats", "1"]
    out = run("--artifacts", packaged, packaged, *options)
    assert "equal answers: 11994 of 11994 test words" in out  # an artifact and itself
    assert re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M) == ["1", "16"]


@pytest.mark.slow
def test_the_step_path_is_compared_per_row_and_per_item():
    packaged = str(serving.packaged_model_dir("cmudict-g2p"))  # no decode.onnx: the step path
    options = ["--batch-sizes", "1", "16", "--n-inputs", "32", "--repeats", "1"]
    out = run("--step-path", packaged, *options)
    assert "equal answers: 32 of 32 test words" in out
    assert re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M) == ["1", "16"]


@pytest.mark.slow
def test_n_best_scoring_is_compared_per_row_and_per_item():
    packaged = str(serving.packaged_model_dir("cmudict-g2p"))
    out = run("--step-path", packaged, "--n-best", "4", "--n-inputs", "16", "--repeats", "1")
    assert re.search(
        r"^16 words, 4 candidates each: scores differ by [\d.e+-]+ at most$", out, re.M
    )
    assert re.search(r"^per row [\d.]+ ms a pair, per item [\d.]+: [\d.]+x$", out, re.M)


@pytest.mark.slow
def test_the_estimators_own_predict_is_compared_per_row_and_per_item():
    options = ["--batch-sizes", "1", "16", "--n-inputs", "32", "--repeats", "1"]
    out = run("--estimator", *options)
    assert "equal answers: 32 of 32 test words" in out
    assert re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+x$", out, re.M) == ["1", "16"]


@pytest.mark.slow
def test_a_transformers_layouts_are_compared():
    options = ["--batch-sizes", "1", "8", "--n-inputs", "16", "--repeats", "1"]
    out = run("--transformer", "--train-steps", "5", "--quantize", "none", *options)
    assert "Transformer (reversal), beam 5" in out
    rows = re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s.* (\d+)/(\d+) batches$", out, re.M)
    assert [row[0] for row in rows] == ["1", "8"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--beam-size", "1"], "--beam-size must be at least 2"),
        (["--n-best", "10"], "--n-best and --io-binding go with --step-path"),
        (["--io-binding"], "--n-best and --io-binding go with --step-path"),
        (["--step-path", "x", "--n-best", "-1"], "--n-best must be at least 1"),
    ],
)
def test_bad_options_are_refused(args, message):
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr
