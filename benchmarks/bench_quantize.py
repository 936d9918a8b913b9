"""float32 against int8 artifacts (``export_onnx(quantize="int8")``), side by side on the CPU.

Each model is exported twice, as float32 and with its weight products in int8
(:mod:`skattn.quantize`), and both are loaded with ``serving.load(dir, "cpu")``'s default
layout (the runtime's width-sized chunks, one worker per usable core). Rounds alternate the two
artifacts' order over the same inputs; the table gives each one's median items/s, the spread of
its rounds, the int8 / float32 ratio of the medians, the accuracy of each, how many answers the
two share, and the artifacts' sizes.

Models: the small reversal model (``bench_runtime_chunks``', trained here briefly), scored by
exact match; with ``--g2p PATH`` (a fitted G2P ``Seq2Seq`` or ensemble saved with joblib, e.g.
``benchmarks/results/g2p/member0cc.joblib``), that model on the CMUdict test words, scored by
PER and WER (a word is right when it matches any of its pronunciations); each greedy and with
beam 5. ``--packaged`` adds the two packaged G2P artifacts as they ship (``cmudict-g2p``, the
one-layer ensemble in float32 without ``decode.onnx``, and ``cmudict-g2p-int8``, the two-layer
ensemble in int8 with it: since 2026-12-04 two models, so their speeds and scores side by side,
not how often they agree), at their beam.

    python benchmarks/bench_quantize.py --g2p benchmarks/results/g2p/member0cc.joblib
    python benchmarks/bench_quantize.py --quick     # seconds: the small model, greedy
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import bench_runtime_chunks
import machine

import serving
from skattn.datasets import group_pronunciations, load_cmudict
from skattn.metrics import exact_match, phoneme_error_rate, word_error_rate

KINDS = ("float32", "int8")


def directory_megabytes(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.iterdir()) / 1e6


def reversal_task(train_steps: int, seed: int, count: int):
    """``bench_runtime_chunks``' small reversal model, ``count`` of its sources and a scorer."""
    model, sources = bench_runtime_chunks.reversal_model(train_steps, seed)
    sources = sources[:count]
    targets = [source[::-1] for source in sources]
    return model, sources, lambda answers: {"exact": exact_match(targets, answers)}


def g2p_task(path: Path, n_words: int):
    """A joblib-saved G2P model, the CMUdict test words (every ``n``-th of them for
    ``n_words``; all for 0) and a PER / WER scorer."""
    import joblib

    words, references = group_pronunciations(*load_cmudict("test"))
    if n_words:
        step = max(1, len(words) // n_words)
        words, references = words[::step][:n_words], references[::step][:n_words]

    def score(answers):
        return {
            "per": 100 * phoneme_error_rate(references, answers),
            "wer": 100 * word_error_rate(references, answers),
        }

    return (joblib.load(path) if path is not None else None), words, score


def compare(name: str, beam_size: int, directories: dict, sources, score, args) -> dict:
    """The two artifacts of ``directories`` (kind -> directory) over ``sources``, rounds
    alternating; one row."""
    runtimes = {kind: serving.load(d, "cpu") for kind, d in directories.items()}
    for runtime in runtimes.values():
        runtime.predict(sources[:8])  # warm up the sessions
    rates = {kind: [] for kind in KINDS}
    answers = {}
    for round_ in range(args.repeats):
        for kind in KINDS if round_ % 2 == 0 else KINDS[::-1]:
            start = time.perf_counter()
            answers[kind] = runtimes[kind].predict(sources)
            rates[kind].append(len(sources) / (time.perf_counter() - start))
    shared = sum(a == b for a, b in zip(*answers.values(), strict=True)) / len(sources)
    medians = {kind: statistics.median(rates[kind]) for kind in KINDS}
    int8 = runtimes["int8"]
    row = {
        "model": name,
        "beam_size": beam_size,
        "items": len(sources),
        "layout": f"chunks of {int8.translator.max_batch_size}, {int8.workers} at a time, "
        f"decode.onnx: {int8.decode_graph}",
        "shared_answers": shared,
        "ratio": medians["int8"] / medians["float32"],
        "round_ratios": [i / f for f, i in zip(rates["float32"], rates["int8"], strict=True)],
    }
    for kind in KINDS:
        row[kind] = {
            "items_per_second": medians[kind],
            "spread": (max(rates[kind]) - min(rates[kind])) / medians[kind],
            "megabytes": directory_megabytes(directories[kind]),
            **score(answers[kind]),
        }
    print_row(row)
    return row


def measure(name: str, task, args) -> list[dict]:
    """A fitted model exported both ways at each of ``args.beam_sizes``."""
    model, sources, score = task
    rows = []
    for beam_size in args.beam_sizes:
        model.set_params(beam_size=beam_size)
        with tempfile.TemporaryDirectory() as scratch:
            directories = {
                kind: model.export_onnx(
                    Path(scratch) / kind, quantize=None if kind == "float32" else kind
                )
                for kind in KINDS
            }
            rows.append(compare(name, beam_size, directories, sources, score, args))
    return rows


def packaged(args) -> dict:
    """The two packaged G2P artifacts as they ship (``cmudict-g2p`` and ``-int8``: since
    2026-12-04 two models, the one-layer ensemble and the two-layer one)."""
    directories = {
        "float32": serving.packaged_model_dir("cmudict-g2p"),
        "int8": serving.packaged_model_dir("cmudict-g2p-int8"),
    }
    _, words, score = g2p_task(None, args.g2p_words)
    beam = serving.load(directories["int8"], "cpu").manifest.beam_size
    return compare("packaged", beam, directories, words, score, args)


def format_scores(result: dict) -> str:
    parts = [f"exact {result['exact']:.3f}"] if "exact" in result else []
    parts += [f"{k.upper()} {result[k]:.2f}" for k in ("per", "wer") if k in result]
    return ", ".join(parts)


def print_row(row: dict) -> None:
    if not hasattr(print_row, "header"):
        print_row.header = True
        print(
            f"{'model':9} {'beam':>4} {'float32/s':>10} {'int8/s':>8} {'int8/float':>10} "
            f"{'rounds':>22}  {'float32 score':>22} {'int8 score':>22} {'same':>6} {'MB':>11}"
        )
    f, i = row["float32"], row["int8"]
    rounds = " ".join(f"{r:.2f}" for r in row["round_ratios"])
    sizes = f"{f['megabytes']:.1f}/{i['megabytes']:.1f}"
    print(
        f"{row['model']:9} {row['beam_size']:4d} {f['items_per_second']:10.0f} "
        f"{i['items_per_second']:8.0f} {row['ratio']:9.2f}x {rounds:>22}  "
        f"{format_scores(f):>22} {format_scores(i):>22} {row['shared_answers']:6.1%} {sizes:>11}",
        flush=True,
    )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--g2p", type=Path, default=None, help="a fitted G2P model (joblib)")
    parser.add_argument("--g2p-words", type=int, default=0, help="test words (0: all 11,994)")
    parser.add_argument(
        "--packaged",
        action="store_true",
        help="also the packaged cmudict-g2p against cmudict-g2p-int8, as they ship",
    )
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=6, help="rounds, order alternating")
    parser.add_argument("--quick", action="store_true", help="the small model, greedy, 2 rounds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.g2p_words < 0 or args.train_steps < 1:
        parser.error("--repeats and --train-steps must be >= 1, --g2p-words >= 0")
    if any(b < 1 for b in args.beam_sizes):
        parser.error("--beam-sizes must be >= 1")
    if args.quick:
        args.g2p, args.train_steps, args.repeats, args.beam_sizes = None, 30, 2, [1]
        args.packaged = False
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    print(f"{machine.describe()}; median of {args.repeats} rounds", flush=True)
    task = reversal_task(args.train_steps, args.seed, 300 if args.quick else 8192)
    rows = measure("reversal", task, args)
    if args.g2p is not None:
        rows += measure("g2p", g2p_task(args.g2p, args.g2p_words), args)
    if args.packaged:
        rows.append(packaged(args))
    return rows


if __name__ == "__main__":
    main()
