"""How ``serving.load(...).predict`` should cut a long input: chunk size and threads, side by side.

A bulk call (a batch job, an evaluation, ``bench_g2p_peers``' served rows) hands the runtime many
inputs at once; it sorts them by length and decodes them in chunks. Two choices set its speed:

- the chunk size (``max_batch_size``): a larger chunk spreads each weight read over more rows,
  until a step's carry (memory, keys, states of every row) no longer fits the caches;
- how the cores are used: one chunk at a time on ``cores`` intra-op threads, or ``workers``
  chunks at once (onnxruntime releases the GIL in ``session.run``) on one thread each.

Each configuration decodes the same inputs; predictions must be identical in every one. Rounds
rotate the configurations' order (a slow spell of a shared machine hits each alike); the table
gives the median words/s and its ratio to the first row, the runtime's previous default
(chunks of 256 on every core's intra-op thread).

Models: the small reversal model (Bahdanau / additive, hidden 64; ``bench_decode_graph``'s,
trained here briefly), and,
with ``--g2p PATH`` (a fitted G2P ``Seq2Seq`` saved with joblib, e.g.
``benchmarks/results/g2p/member0cc.joblib``, bi-GRU 256), the G2P model on CMUdict test words;
each greedy and with beam 5.

    python benchmarks/bench_runtime_chunks.py --g2p benchmarks/results/g2p/member0cc.joblib
    python benchmarks/bench_runtime_chunks.py --quick     # seconds: the small model, 2 rows
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import bench_decode_graph
import machine

import serving
from skattn.core.checks import usable_cores


def configurations(cores: int, quick: bool) -> list[tuple[str, dict]]:
    """(label, ``serving.load`` options); the first is the ratios' base."""
    rows = [
        (f"chunks of 256, 1 at a time, {cores} threads", dict(max_batch_size=256, workers=1)),
        (f"chunks of 64, 1 at a time, {cores} threads", dict(max_batch_size=64, workers=1)),
        ("chunks of 256, 1 at a time, 1 thread", dict(max_batch_size=256, workers=1, intra=1)),
        ("chunks of 64, 1 at a time, 1 thread", dict(max_batch_size=64, workers=1, intra=1)),
        (f"chunks of 32, {cores} at a time, 1 thread each", dict(max_batch_size=32)),
        (f"chunks of 64, {cores} at a time, 1 thread each", dict(max_batch_size=64)),
        (f"chunks of 128, {cores} at a time, 1 thread each", dict(max_batch_size=128)),
        (f"chunks of 256, {cores} at a time, 1 thread each", dict(max_batch_size=256)),
        ("the default: chunks by the model's width", dict()),
    ]
    return [rows[0], rows[-1]] if quick else rows


def load(directory: Path, options: dict, cores: int):
    options = dict(options)
    intra = options.pop("intra", None)
    workers = options.get("workers")
    if workers is None:  # the runtime's default: one thread a worker, one worker a core
        return serving.load(directory, device="cpu", **options)
    threads = intra if intra is not None else cores
    return serving.load(directory, device="cpu", intra_op_num_threads=threads, **options)


def reversal_model(train_steps: int, seed: int):
    """``bench_decode_graph``'s small reversal model, fitted for ``train_steps``, and 8,192
    sources to decode."""
    args = SimpleNamespace(train_steps=train_steps, seed=seed)
    return bench_decode_graph.fit("small", args), bench_decode_graph.reversal_data(8192, seed + 1)


def g2p_model(path: Path, n_words: int):
    import joblib

    from skattn.datasets import load_cmudict

    X, _ = load_cmudict("test")
    words = sorted(set(X))
    step = max(1, len(words) // n_words)
    return joblib.load(path), words[::step][:n_words]


def measure(name: str, model, sources: list[str], args, cores: int) -> list[tuple]:
    rows = []
    configs = configurations(cores, args.quick)
    for beam_size in args.beam_sizes:
        model.set_params(beam_size=beam_size)
        with tempfile.TemporaryDirectory() as scratch:
            directory = model.export_onnx(Path(scratch) / f"{name}-{beam_size}")
            runtimes = [(label, load(directory, options, cores)) for label, options in configs]
            default = runtimes[-1][1]
            print(
                f"{name}, beam {beam_size}: the default layout is chunks of "
                f"{default.translator.max_batch_size}, {default.workers} at a time",
                flush=True,
            )
            for _, runtime in runtimes:
                runtime.predict(sources[:8])  # warm up the sessions
            rates = {label: [] for label, _ in configs}
            outputs = {}
            for round_ in range(args.repeats):
                shift = round_ % len(runtimes)
                for label, runtime in runtimes[shift:] + runtimes[:shift]:
                    start = time.perf_counter()
                    outputs[label] = runtime.predict(sources)
                    rates[label].append(len(sources) / (time.perf_counter() - start))
            first = outputs[configs[0][0]]
            for label, output in outputs.items():
                if output != first:
                    raise SystemExit(f"{name}, beam {beam_size}: {label!r} predicts otherwise")
            base = statistics.median(rates[configs[0][0]])
            for label, _ in configs:
                median = statistics.median(rates[label])
                spread = (max(rates[label]) - min(rates[label])) / median
                rows.append((name, beam_size, label, median, spread, median / base))
                print_row(*rows[-1])
    return rows


def print_row(name, beam_size, label, rate, spread, ratio) -> None:
    if not hasattr(print_row, "header"):
        print_row.header = True
        print(f"{'model':9} {'beam':>4}  {'configuration':52} {'items/s':>8} {'spread':>7} "
              f"{'vs first':>8}")  # fmt: skip
    print(
        f"{name:9} {beam_size:4d}  {label:52} {rate:8.0f} {spread:6.0%} {ratio:7.2f}x", flush=True
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--g2p", type=Path, default=None, help="a fitted G2P Seq2Seq (joblib)")
    parser.add_argument("--g2p-words", type=int, default=1024, help="test words decoded")
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5, help="rounds over the configurations")
    parser.add_argument("--quick", action="store_true", help="the small model, 2 rows, 1 round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.g2p_words < 1 or args.train_steps < 1:
        parser.error("--repeats, --g2p-words and --train-steps must be >= 1")
    if any(b < 1 for b in args.beam_sizes):
        parser.error("--beam-sizes must be >= 1")
    if args.quick:
        args.g2p, args.train_steps, args.repeats, args.beam_sizes = None, 30, 1, [1]
    return args


def main(argv=None) -> list[tuple]:
    args = parse_args(argv)
    cores = usable_cores()
    print(f"{machine.describe()}; median of {args.repeats} rotated rounds", flush=True)
    model, sources = reversal_model(args.train_steps, args.seed)
    if args.quick:
        sources = sources[:300]
    rows = measure("reversal", model, sources, args, cores)
    if args.g2p is not None:
        model, words = g2p_model(args.g2p, args.g2p_words)
        rows += measure("g2p", model, words, args, cores)
    return rows


if __name__ == "__main__":
    main()
