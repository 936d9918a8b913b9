#!/usr/bin/env bash
# The GPU check: one prepared run for a machine with an NVIDIA GPU, printing one table.
#
#   benchmarks/gpu_check.sh             # on CUDA (needs torch with CUDA and onnxruntime-gpu)
#   benchmarks/gpu_check.sh --dry-run   # the same steps on the CPU, small and quick (CI)
#   benchmarks/gpu_check.sh --keep=DIR  # also keep the exported artifact in DIR
#
# Steps: one training epoch on the device; export; runtime parity device against CPU (the step
# graphs with IO binding on, and decode.onnx on the device); items/s at batch 1, 64 and 256 for
# the CPU runtime, the device's step graphs with IO binding, and the device's decode graph;
# bench_server.py --device cuda on the exported model (batched and --max-batch-size 1).
# Exit status 1 when a parity check fails or the server answered wrongly.
#
# Environment: PYTHON (default: .venv/bin/python when present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
for arg in "$@"; do
  case "$arg" in
    --dry-run|--keep=?*) ;;
    *) echo "usage: $0 [--dry-run] [--keep=DIR]" >&2; exit 2 ;;
  esac
done
exec "$PYTHON" - "$@" <<'PY'
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import serving
from skattn import Seq2Seq
from skattn.datasets import make_reversal

DRY = "--dry-run" in sys.argv
KEEP = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--keep=")), None)
DEVICE = "cpu" if DRY else "cuda"
SIZES = dict(hidden_size=16, embedding_dim=8) if DRY else dict(hidden_size=256, embedding_dim=64)
N_TRAIN, N_TEST = (300, 64) if DRY else (20000, 2048)
rows = []  # (check, setting, result)
failed = False


def row(check: str, setting: str, result: str) -> None:
    rows.append((check, setting, result))
    print(f"  {check}: {setting}: {result}", file=sys.stderr, flush=True)


if not DRY:
    missing = []
    if not torch.cuda.is_available():
        missing.append("torch has no CUDA device")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        missing.append("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    if missing:
        sys.exit("gpu_check: " + "; ".join(missing) + " (use --dry-run for the CPU run)")
    row("device", "cuda", torch.cuda.get_device_name(0))

X, y = make_reversal(N_TRAIN, min_length=4, max_length=12, random_state=0)
X_test, _ = make_reversal(N_TEST, min_length=4, max_length=12, random_state=1)

# 1. One training epoch on the device.
model = Seq2Seq(decoder="luong", scorer="general", max_epochs=1, batch_size=64,
                learning_rate=3e-3, device=DEVICE, random_state=0, **SIZES)
start = time.perf_counter()
model.fit(X, y)
row("train", f"1 epoch, {N_TRAIN} pairs, {DEVICE}", f"{time.perf_counter() - start:.2f} s")

with tempfile.TemporaryDirectory() as scratch:
    # 2. Export (the step graphs and decode.onnx, each verified at export).
    start = time.perf_counter()
    directory = Path(model.export_onnx(Path(KEEP or scratch) / "model"))
    row("export", "encoder, decoder_step, decode.onnx", f"{time.perf_counter() - start:.2f} s")

    # 3. Parity: the device against the CPU runtime (step graphs, no IO binding).
    cpu = serving.load(directory, device="cpu", decode_graph=False)
    paths = {
        "cpu": cpu,
        f"{DEVICE} steps + io_binding": serving.load(
            directory, device=DEVICE, io_binding=True, decode_graph=False),
        f"{DEVICE} decode.onnx": serving.load(directory, device=DEVICE, decode_graph=True),
    }
    want, want_maps = cpu.predict_batch(X_test, with_attention=True)
    for name, runtime in list(paths.items())[1:]:
        got, maps = runtime.predict_batch(X_test, with_attention=True)
        differ = sum(a != b for a, b in zip(got, want))
        gap = max((np.abs(a - b).max() for a, b, g, w in zip(maps, want_maps, got, want)
                   if g == w and a.size), default=0.0)  # maps of the same answers
        ok = differ == 0
        failed |= not ok
        row("parity vs cpu", f"{name} ({runtime.provider})",
            f"{'identical' if ok else f'{differ} of {len(want)} differ'}, "
            f"attention max |diff| {gap:.1e} (same answers)")

    # 4. Items per second at batch 1, 64, 256 (batch 1 over a tenth of the inputs).
    for batch in (1, 64, 256):
        sources = X_test[: max(batch, len(X_test) // 10)] if batch == 1 else X_test
        for name, runtime in paths.items():
            runtime.predict(sources[:batch])  # warm-up: kernels, arenas
            start = time.perf_counter()
            for i in range(0, len(sources), batch):
                runtime.predict(sources[i : i + batch])
            rate = len(sources) / (time.perf_counter() - start)
            row("items/s", f"batch {batch:>3}, {name}", f"{rate:,.0f}")

    # 5. The server on the device: batched against --max-batch-size 1.
    report = Path(scratch) / "bench_server.json"
    command = [sys.executable, "benchmarks/bench_server.py", "--model-dir", str(directory),
               "--device", DEVICE, "--json", str(report), "--mixes", "fixed"]
    if DRY:
        command += ["--concurrency", "4", "--duration", "1", "--warmup", "0.3",
                    "--clients", "python"]
    else:
        command += ["--concurrency", "1", "64", "256", "--duration", "5"]
    server = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if server.returncode not in (0, 1) or not report.exists():
        sys.exit(f"gpu_check: bench_server.py failed:\n{server.stderr[-2000:]}")
    for r in json.loads(report.read_text()):
        failed |= bool(r["errors"] or r["mismatches"])
        row("bench_server", f"{DEVICE}, {r['mode']}, {r['client']}, concurrency "
            f"{r['concurrency']}", f"{r['throughput']:.1f} req/s, p99 {r['p99_ms']:.1f} ms, "
            f"{r['errors']} errors, {r['mismatches']} wrong")

widths = [max(len(r[i]) for r in rows + [("check", "setting", "result")]) for i in range(3)]
print(f"gpu_check ({'dry run on the CPU' if DRY else 'CUDA'}); torch {torch.__version__}, "
      f"onnxruntime {ort.__version__}")
for r in [("check", "setting", "result"), tuple("-" * w for w in widths), *rows]:
    print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
sys.exit(1 if failed else 0)
PY
