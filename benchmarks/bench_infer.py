"""Inference throughput: greedy decoding with the estimator (torch) and the runtime (onnxruntime).

One run fits a ``Seq2Seq`` briefly on string reversal (accuracy does not matter, realistic output
lengths do), exports it, and decodes the same 2,048 sources with ``Seq2Seq.predict`` and with
``serving.load(...).predict`` in chunks of 1, 16, 64 and 256 items. Both use the same number of
threads, both must give identical predictions, and each timing is the best of ``--repeats``
interleaved runs.

Achieved GFLOP/s counts the matrix-multiply FLOPs of the decode (``torch.utils.flop_counter``
over one untimed torch pass: the runtime runs the same graphs for the same steps), beside the
machine's float32 matmul peak measured here (the best of a few ``n x n`` products).

    python benchmarks/bench_infer.py            # full run, the defaults below
    python benchmarks/bench_infer.py --quick    # a few seconds: smaller model, 256 inputs
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import machine
import numpy as np
import onnxruntime as ort
import torch
from torch.utils.flop_counter import FlopCounterMode

import serving
from skattn import Seq2Seq
from skattn.core.checks import usable_cores
from skattn.datasets import make_reversal


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, 256 inputs")
    parser.add_argument("--n-inputs", type=int, default=2048)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--scorer", default="additive")
    parser.add_argument("--decoder", default="bahdanau")
    parser.add_argument("--threads", type=int, default=None, help="default: all cores")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.n_inputs, args.hidden_size, args.embedding_dim, args.repeats = 256, 32, 16, 1
    return args


def matmul_peak_gflops(threads: int, n: int = 1024, repeats: int = 5) -> float:
    """Best float32 ``n x n @ n x n`` rate (torch's BLAS, ``threads`` threads) in GFLOP/s."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def best_times(
    predictors: dict, batches: list[list[str]], repeats: int
) -> tuple[dict[str, float], dict[str, list]]:
    """Best wall time of each predictor over every batch, runs interleaved (A, B, A, B, ...).

    Interleaving spreads the noise of a shared machine over both sides evenly.
    """
    best = dict.fromkeys(predictors, float("inf"))
    outputs: dict[str, list] = {}
    for _ in range(repeats):
        for name, predict in predictors.items():
            start = time.perf_counter()
            outputs[name] = [p for batch in batches for p in predict(batch)]
            best[name] = min(best[name], time.perf_counter() - start)
    return best, outputs


def useful_flops(estimator: Seq2Seq, sources: list[str], sample: int = 256) -> float:
    """Matmul FLOPs of decoding ``sources`` one at a time (no padding), estimated on a sample.

    Counted by ``FlopCounterMode`` over an untimed torch pass on the first ``sample`` sources,
    scaled to all of them. Padded batches execute somewhat more; this is the useful work.
    """
    counted = sources[:sample]
    with FlopCounterMode(display=False) as counter:
        for source in counted:
            estimator.predict([source])
    return counter.get_total_flops() * len(sources) / len(counted)


def main() -> None:
    args = parse_args()
    threads = args.threads or usable_cores()

    X_train, y_train = make_reversal(2000, 4, 16, random_state=0)
    sources, _ = make_reversal(args.n_inputs, 4, 16, random_state=1)
    start = time.perf_counter()
    estimator = Seq2Seq(
        decoder=args.decoder,
        scorer=args.scorer,
        embedding_dim=args.embedding_dim,
        hidden_size=args.hidden_size,
        max_steps=60 if args.quick else 150,
        batch_size=64,
        learning_rate=1e-2,
        early_stopping=False,
        device="cpu",
        n_threads=1,
        random_state=0,
    ).fit(X_train, y_train)
    fit_seconds = time.perf_counter() - start
    # predict sets torch's threads to n_threads (None: every usable core), whatever
    # torch.set_num_threads said before: the same count as onnxruntime's.
    estimator.set_params(n_threads=threads)

    with tempfile.TemporaryDirectory() as directory:
        runtime = serving.load(
            estimator.export_onnx(os.path.join(directory, "model")),
            device="cpu",
            intra_op_num_threads=threads,
            max_batch_size=max(args.batch_sizes),  # a row's batch is one chunk
        )
    flops = useful_flops(estimator, sources)
    peak = matmul_peak_gflops(threads)  # also sets torch's threads for the timings below

    print(
        f"# {machine.describe()}; "
        f"threads={threads} (torch and onnxruntime); torch {torch.__version__}, "
        f"onnxruntime {ort.__version__}"
    )
    print(
        f"# model: {args.decoder}/{args.scorer}, hidden {args.hidden_size}, embedding "
        f"{args.embedding_dim}, fitted in {fit_seconds:.1f}s; {args.n_inputs} inputs of 4-16 "
        f"chars, greedy; {flops / 1e9:.2f} GFLOP of useful matmul work; float32 matmul peak "
        f"{peak:.1f} GFLOP/s"
    )
    header = (
        "batch",
        "torch s",
        "torch items/s",
        "onnxrt s",
        "onnxrt items/s",
        "speedup",
        "torch GFLOP/s",
        "onnxrt GFLOP/s",
        "onnxrt % peak",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for batch_size in args.batch_sizes:
        batches = chunks(sources, batch_size)
        seconds, outputs = best_times(
            {"torch": estimator.predict, "onnxruntime": runtime.predict}, batches, args.repeats
        )
        torch_s, ort_s = seconds["torch"], seconds["onnxruntime"]
        torch_out, ort_out = outputs["torch"], outputs["onnxruntime"]
        if torch_out != ort_out:
            mismatches = sum(a != b for a, b in zip(torch_out, ort_out, strict=True))
            raise SystemExit(f"batch {batch_size}: {mismatches} predictions differ")
        n = len(sources)
        row = (
            f"{batch_size}",
            f"{torch_s:.3f}",
            f"{n / torch_s:.0f}",
            f"{ort_s:.3f}",
            f"{n / ort_s:.0f}",
            f"{torch_s / ort_s:.2f}x",
            f"{flops / torch_s / 1e9:.2f}",
            f"{flops / ort_s / 1e9:.2f}",
            f"{100 * flops / ort_s / 1e9 / peak:.1f}",
        )
        print("| " + " | ".join(row) + " |", flush=True)
    accuracy = np.mean([p == s[::-1] for p, s in zip(torch_out, sources, strict=True)])
    print(f"# exact match of the briefly fitted model: {accuracy:.2f} (not the point here)")


if __name__ == "__main__":
    main()
