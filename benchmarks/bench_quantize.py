"""float32 against int8 and float16-weight artifacts (``export_onnx(quantize=...)``), side by
side on the CPU.

Each model is exported three times: as float32, with its weight products in int8
(:mod:`skattn.quantize`), and with its weights stored in float16 and computed in float32
(:mod:`skattn.float16_weights`); all are loaded with ``serving.load(dir, "cpu")``'s default
layout (the runtime's width-sized chunks, one worker per usable core). Rounds rotate the
artifacts' order over the same inputs; the table gives each one's median items/s, its ratio to
float32's median (and each round's), the accuracy of each, how many answers each shares with
float32, and the artifacts' sizes.

Models: the small reversal model (``bench_runtime_chunks``', trained here briefly), scored by
exact match; with ``--g2p PATH`` (a fitted G2P ``Seq2Seq`` or ensemble saved with joblib, e.g.
``benchmarks/results/g2p/member0cc.joblib``), that model on the CMUdict test words, scored by
PER and WER (a word is right when it matches any of its pronunciations); each greedy and with
beam 5. ``--packaged`` adds the two packaged G2P artifacts as they ship, the same two-layer
ensemble twice (``cmudict-g2p``, float16 weights without ``decode.onnx``, and
``cmudict-g2p-int8``, int8 products with it), at their beam.

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

KINDS = ("float32", "int8", "float16")


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
    """The artifacts of ``directories`` (kind -> directory; ratios and shared answers are
    against the first) over ``sources``, each round in another order; one row."""
    kinds = list(directories)
    runtimes = {kind: serving.load(d, "cpu") for kind, d in directories.items()}
    for runtime in runtimes.values():
        runtime.predict(sources[:8])  # warm up the sessions
    rates = {kind: [] for kind in kinds}
    answers = {}
    for round_ in range(args.repeats):
        shift = round_ % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            start = time.perf_counter()
            answers[kind] = runtimes[kind].predict(sources)
            rates[kind].append(len(sources) / (time.perf_counter() - start))
    base = kinds[0]
    medians = {kind: statistics.median(rates[kind]) for kind in kinds}
    row = {"model": name, "beam_size": beam_size, "items": len(sources)}
    for kind in kinds:
        runtime = runtimes[kind]
        row[kind] = {
            "layout": f"chunks of {runtime.translator.max_batch_size}, {runtime.workers} at a "
            f"time, decode.onnx: {runtime.decode_graph}",
            "items_per_second": medians[kind],
            "spread": (max(rates[kind]) - min(rates[kind])) / medians[kind],
            "megabytes": directory_megabytes(directories[kind]),
            "ratio": medians[kind] / medians[base],
            "round_ratios": [k / b for b, k in zip(rates[base], rates[kind], strict=True)],
            "shared_answers": sum(a == b for a, b in zip(answers[kind], answers[base], strict=True))
            / len(sources),
            **score(answers[kind]),
        }
    print_row(row)
    return row


def measure(name: str, task, args) -> list[dict]:
    """A fitted model exported each way (:data:`KINDS`) at each of ``args.beam_sizes``."""
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
    """The two packaged G2P artifacts as they ship (``cmudict-g2p``, float16 weights, and
    ``cmudict-g2p-int8``), at their beam."""
    directories = {
        "float16": serving.packaged_model_dir("cmudict-g2p"),
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
    """One line per artifact kind: items/s, its ratio to the first kind's (the median, then
    each round's), its score, the answers it shares with the first kind, its size."""
    print(f"{row['model']} beam {row['beam_size']}, {row['items']} items")
    for kind in (k for k in row if isinstance(row[k], dict)):
        r = row[kind]
        rounds = " ".join(f"{x:.2f}" for x in r["round_ratios"])
        print(
            f"  {kind:8} {r['items_per_second']:9.0f}/s {r['ratio']:6.2f}x ({rounds})  "
            f"{format_scores(r):>22}  same {r['shared_answers']:6.1%}  {r['megabytes']:5.1f} MB"
            f"  ({r['layout']})",
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
