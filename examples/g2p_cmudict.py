"""Grapheme-to-phoneme conversion on CMUdict, beside published results on the same split.

The standard CMUdict 0.7b split (``skattn.datasets.load_cmudict``: 106,794 training words,
11,994 test words, stress removed, all pronunciations of a word on one side). A development set
is taken out of the training words (``split_by_word``); configurations are compared on it, never
on the test words. A bi-GRU encoder with an attention decoder is trained within a wall-clock
budget, then decoded with beam search and scored on the test words:

    PER = sum_n d(r_n*, p_n) / sum_n |r_n*|   (edit distance to the closest reference r_n*)
    WER = fraction of words whose prediction matches none of their references

beside Yao & Zweig (2015), Toshniwal & Livescu (2016), the CMUSphinx g2p-seq2seq Transformer,
and, when it is installed, the neural model of ``g2p_en`` (measured here on the same words).

    python examples/g2p_cmudict.py --quick          # a smoke run in seconds
    python examples/g2p_cmudict.py --eval dev --train-words 30000 --max-minutes 12  # tuning
    python examples/g2p_cmudict.py --threads 2 --export g2p_model --out g2p.json    # < 1 hour
    python examples/g2p_cmudict.py --right-to-left --save r2l.joblib  # a rescorer (below)

The defaults are the configuration chosen on the dev set: Bahdanau's decoder with additive
attention over a bi-GRU of 256 units per direction, batches of 64, Adam at 1e-3 decayed to 0 over
the budget on a cosine (``lr_schedule="cosine"``), dropout 0.3, beam 5, and the weights of the
epoch with the best validation exact match kept (``early_stopping_metric="exact_match"``). On
30,000-word subsets it learned markedly faster per optimizer step than Luong's decoder with the
general scorer (with or without input feeding, 256 or 384 units); on all training words with the
same 11-minute budget and one thread, it reached 34.7 % dev WER (greedy) against 36.1 % for
Luong's decoder without input feeding, although that one's parallel decoder took 1.36x as many
steps. Over the full budget, dropout 0.1 overfitted (training loss 0.05 nats per token against
0.2 on validation; 25.90 % dev WER) where dropout 0.3 reached 24.57 %; label smoothing 0.1
(``--label-smoothing 0.1``) on top raised the validation exact match but not the dev WER
(24.97 %), so it is off by default; two layers (``--num-layers 2``) cost 1.9x per step and
reached 25.70 % in the budget (9 epochs instead of 16); dropout 0.4 reached 25.37 %. On an
idle 2-core machine two torch threads train this model 1.7x faster than one (``--threads 2``);
when anything else runs on the cores, use ``--threads 1`` (two threads then slow down many
times over).

``--encoder transformer`` puts a Transformer encoder under the recurrent decoders, and with
``--decoder transformer`` the whole model is a Transformer (``--num-layers`` blocks on each side
of ``--hidden-size`` = d_model, ``--num-heads``, ``--ffn-size``, ``--positions``); each family is
given only the options it reads. ``--precision bfloat16`` trains in mixed precision
(``Seq2Seq(precision="bfloat16")``): on a CPU with AMX the 2 x 256 Transformer then trained 29
epochs in 55 minutes on two threads instead of 5 (test WER 27.80 %, against 24.23 % for the
two-layer bi-GRU in the same hour); the bi-GRU gains only 1.2-1.3x per step from it.
docs/results.md (its G2P section) gives the Transformer runs' figures.

``--stress`` trains on CMUdict's stressed pronunciations (``load_cmudict(stress=True)``: vowels
marked 0, 1 or 2, what speech synthesis needs; the dev words stay the same) and scores the model
with the digits taken off against the split, and with them on the words CMUdict stresses. For
the hour's recipe the stress cost 0.6 points of stressless test WER (24.42 % against 23.82 %).

``--right-to-left`` trains the same network on every pronunciation reversed
(``skattn.right_to_left.RightToLeft``; scored in the usual order): a second opinion that commits
to a word's ending first, for ``NBestReranker``'s ``rescorers`` (``bench_g2p_peers.py
--rescorer``).

``--max-minutes`` becomes the estimator's ``max_time``: training stops when the budget is spent
(the epoch under way is still validated), and the cosine schedule reaches 0 there, however the
machine's speed varies meanwhile. (An earlier version turned the budget into ``max_steps`` from
a short calibration fit; on this shared virtual machine the time per step drifts by up to 30 %
within minutes, and a calibration taken in a fast spell overran the hour.)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import joblib
import numpy as np

from skattn import Seq2Seq, Seq2SeqEnsemble
from skattn.argtypes import export_directory, input_file, load_saved, output_file
from skattn.datasets import group_pronunciations, load_cmudict, split_by_word, strip_stress
from skattn.distillation import teacher_targets
from skattn.metrics import phoneme_error_rate, word_error_rate
from skattn.models import ModelConfig
from skattn.right_to_left import RightToLeft

#: Published single-split figures on this test set: (system, PER %, WER %).
PUBLISHED = [
    ("Yao & Zweig 2015, bi-LSTM", 5.45, 23.55),
    ("Toshniwal & Livescu 2016, attention (ensemble)", 4.69, 20.24),
    ("CMUSphinx g2p-seq2seq, Transformer 2 x 256", None, 20.2),
]

# ---------------------------------------------------------------- data


def load_splits(
    dev_words: int, train_words: int | None, seed: int, stress: bool = False
) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Train, dev and test entries (one per pronunciation), split by word.

    ``dev_words`` distinct training words are held out as the development set; with
    ``train_words``, a random subset of that many of the remaining words is trained on. With
    ``stress``, the training words' lines carry CMUdict's stress (``load_cmudict(stress=True)``;
    a line without a stressed form is left out); the split is the stressless one's, so the dev
    words are the same, and dev and test keep their stressless references.
    """
    words, prons = load_cmudict("train")
    X_train, X_dev, y_train, y_dev = split_by_word(words, prons, dev_words, random_state=seed)
    if train_words is not None and train_words < len(set(X_train)):
        _, X_train, _, y_train = split_by_word(X_train, y_train, train_words, random_state=seed)
    if stress:
        kept = set(X_train)
        lines = zip(*load_cmudict("train", stress=True), strict=True)
        pairs = [(word, phonemes) for word, phonemes in lines if word in kept]
        X_train, y_train = [word for word, _ in pairs], [phonemes for _, phonemes in pairs]
    return {"train": (X_train, y_train), "dev": (X_dev, y_dev), "test": load_cmudict("test")}


def subsample_words(
    X: list[str], y: list[list[str]], n_words: int, seed: int
) -> tuple[list[str], list[list[str]]]:
    """All entries of ``n_words`` random distinct words (all of them if there are fewer)."""
    if n_words >= len(set(X)):
        return X, y
    _, X_sub, _, y_sub = split_by_word(X, y, n_words, random_state=seed)
    return X_sub, y_sub


# ---------------------------------------------------------------- model

#: The parameters of the model itself (its ModelConfig) and its tokenizer: a continued run
#: (``--continue-from``, ``warm_start``) keeps the saved model's.
MODEL_PARAMS = {field.name for field in dataclasses.fields(ModelConfig)} | {"tokenizer"}


def build_model(args: argparse.Namespace) -> Seq2Seq:
    """The estimator from the command line's hyperparameters."""
    # Each family gets only its own options: a Transformer refuses RNN options set on purpose,
    # and over the RNN encoder num_heads would mean the scorer's heads.
    transformer = dict(num_heads=args.num_heads, ffn_size=args.ffn_size, positions=args.positions)
    rnn_decoder = dict(
        scorer=args.scorer,
        input_feeding=args.input_feeding,
        cell=args.cell,
        embedding_dim=args.embedding_dim,
    )
    return Seq2Seq(
        encoder=args.encoder,
        **(transformer if args.encoder == "transformer" else {}),
        decoder=args.decoder,
        **(rnn_decoder if args.decoder != "transformer" else {}),
        hidden_size=args.hidden_size,
        n_threads=args.threads,
        precision=args.precision,
        num_layers=args.num_layers,
        dropout=args.dropout,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps,
        average_checkpoints=args.average_checkpoints,
        label_smoothing=args.label_smoothing,
        max_epochs=args.max_epochs,
        early_stopping=args.early_stopping,
        early_stopping_metric=args.early_stopping_metric,
        validation_fraction=args.validation_fraction,
        n_iter_no_change=args.n_iter_no_change,
        beam_size=args.beam_size,
        length_penalty=args.length_penalty,
        max_time=60.0 * args.max_minutes if args.max_minutes > 0 else None,
        random_state=args.seed if args.model_seed is None else args.model_seed,
        verbose=True,
    )


def system_name(args: argparse.Namespace, model=None) -> str:
    """The results table's name of the model the command line trains (or ensembles); with
    ``model``, of its own configuration (a run continued with ``--continue-from`` keeps the
    saved model's)."""
    if args.ensemble:
        return f"skattn ensemble of {len(args.ensemble)}"
    network = network_of(model) if model is not None else None
    p = SimpleNamespace(**(network.get_params() if network is not None else vars(args)))
    direction = ", right to left" if args.right_to_left else ""
    if p.encoder == "rnn":
        return f"skattn {p.decoder}/{p.scorer} bi-{p.cell.upper()} {p.hidden_size}{direction}"
    layers = f"{p.num_layers} x {p.hidden_size}, {p.num_heads} heads"
    if p.decoder == "transformer":
        return f"skattn Transformer ({layers}){direction}"
    decoder = f"{p.decoder}/{p.scorer} {p.cell.upper()}"
    return f"skattn Transformer encoder ({layers}) / {decoder}{direction}"


def network_of(model):
    """The fitted network: a ``RightToLeft``'s model of reversed outputs, else the model."""
    return model.estimator_ if isinstance(model, RightToLeft) else model


# ---------------------------------------------------------------- evaluation


def evaluate(predict, X: list[str], y: list[list[str]]) -> dict:
    """PER and WER (in %) of ``predict(words) -> pronunciations`` on the distinct words of X.

    A word counts as right when its prediction equals any of its references; the PER of a word
    is measured against its closest reference. A model trained with stress (``--stress``) is
    scored with its stress digits taken off, against the split's stressless references, and
    also with them, against the stressed references of the words that have one
    (``"stressed"``).
    """
    words, references = group_pronunciations(X, y)
    start = time.perf_counter()
    predictions = predict(words)
    seconds = time.perf_counter() - start
    unstressed = strip_stress(predictions)
    row = {
        "words": len(words),
        "per": 100.0 * phoneme_error_rate(references, unstressed),
        "wer": 100.0 * word_error_rate(references, unstressed),
        "words_per_second": len(words) / seconds,
        "examples": {w: " ".join(p) for w, p in zip(words[:5], predictions[:5], strict=True)},
    }
    if unstressed != [list(p) for p in predictions]:
        row["stressed"] = stressed_errors(words, predictions)
    return row


@functools.cache
def stressed_references() -> dict[str, list[list[str]]]:
    """word -> its stressed CMUdict pronunciations, from both files (read once a process)."""
    stressed = {}
    for split in ("train", "test"):
        grouped = group_pronunciations(*load_cmudict(split, stress=True))
        stressed.update(zip(*grouped, strict=True))
    return stressed


def stressed_errors(words: list[str], predictions: list[list[str]]) -> dict:
    """PER and WER (in %) with stress, on the words with a stressed CMUdict reference (dev
    words come from the training file, test words from the test file)."""
    stressed = stressed_references()
    pairs = [(stressed[w], p) for w, p in zip(words, predictions, strict=True) if w in stressed]
    references, kept = [r for r, _ in pairs], [p for _, p in pairs]
    return {
        "words": len(pairs),
        "per": 100.0 * phoneme_error_rate(references, kept),
        "wer": 100.0 * word_error_rate(references, kept),
    }


def load_g2p_en():
    """``g2p_en``'s neural model (the GRU encoder-decoder in its shipped ``checkpoint20.npz``).

    Returns ``(predict_word, None)`` or ``(None, reason)``. ``import g2p_en`` calls
    ``nltk.download`` for a POS tagger and for CMUdict, and ``G2p()`` fails without the latter;
    neither is needed by the network itself, so the downloads are turned off and the
    dictionary lookup table (which would answer every CMUdict word from the dictionary) is left
    empty. Its output carries stress digits (``AH0``), which are stripped as in our split.
    """
    try:
        import nltk
    except ImportError:
        return None, "g2p_en is not installed (pip install g2p_en)"
    log = io.StringIO()
    try:
        with (
            mock.patch.object(nltk, "download", lambda *a, **k: False),
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
        ):
            import g2p_en.g2p as g2p_module

            with mock.patch.object(g2p_module, "cmudict", SimpleNamespace(dict=dict)):
                model = g2p_module.G2p()
    except ImportError:
        return None, "g2p_en is not installed (pip install g2p_en)"
    except (LookupError, OSError) as error:
        return None, f"g2p_en cannot be built offline: {type(error).__name__}: {error}"

    def predict_word(word: str) -> list[str]:
        return [re.sub(r"\d", "", p) for p in model.predict(word.lower())]

    return predict_word, None


# ---------------------------------------------------------------- report


def format_table(results: dict) -> str:
    """Markdown table: our model (and g2p_en) beside the published figures, on test words."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["| system | PER % | WER % | words/s |", "|---|---:|---:|---:|"]
    for name, per, wer in PUBLISHED:
        lines.append(f"| {name} (published) | {pct(per)} | {pct(wer)} | - |")
    for name, row in results["systems"].items():
        lines.append(
            f"| {name} | {row['per']:.2f} | {row['wer']:.2f} | {row['words_per_second']:.0f} |"
        )
    return "\n".join(lines)


def training_seconds(members: list) -> float:
    """The fitted models' training seconds in all: every epoch of every one in ``history_``, a
    continued run's earlier ones too (0 for a model without a history)."""
    return sum(r["seconds"] for m in members for r in getattr(m, "history_", []))


def load_ensemble(
    paths: list[Path], beam_size: int, length_penalty: float = 1.0
) -> tuple[list, Seq2SeqEnsemble, float]:
    """The saved members, their ensemble at ``beam_size`` (``length_penalty``) and their
    training seconds in all."""
    members = [load_saved(path, "a saved member", Seq2Seq) for path in paths]
    ensemble = Seq2SeqEnsemble.from_fitted(
        members, beam_size=beam_size, length_penalty=length_penalty
    )
    return members, ensemble, training_seconds(members)


def train_or_load(args: argparse.Namespace, X: list[str], y: list[list[str]]) -> tuple:
    """The model to evaluate, its training seconds and what the results record of it: trained
    here, continued from ``--continue-from`` (``warm_start``), or the ensemble of the saved
    ``--ensemble`` members (their training seconds summed)."""
    if args.ensemble:
        members, model, seconds = load_ensemble(args.ensemble, args.beam_size, args.length_penalty)
        print(f"ensemble of {len(members)} saved members: {seconds / 60:.1f} min of training")
        epochs = [m.n_iter_ for m in members]
        return model, seconds, {"members": [str(p) for p in args.ensemble], "epochs": epochs}
    if args.continue_from is not None:  # warm_start: go on from a saved model's weights
        model = load_saved(args.continue_from, "--continue-from", Seq2Seq)
        params = build_model(args).get_params()
        model.set_params(**{k: v for k, v in params.items() if k not in MODEL_PARAMS})
        model.set_params(warm_start=True)
    else:
        model = build_model(args)
    if args.right_to_left:  # the same network, trained on reversed pronunciations
        model = RightToLeft(model)
    print(model)
    start = time.perf_counter()
    model.fit(X, y)
    seconds = time.perf_counter() - start
    network = network_of(model)
    print(
        f"trained in {seconds / 60:.1f} min: {network.n_iter_} epochs, {network.n_steps_} "
        f"steps, best epoch {network.best_epoch_}"
    )
    return (
        model,
        seconds,
        {
            "model": {k: v for k, v in network.get_params().items() if k != "random_state"},
            "right_to_left": args.right_to_left,
            "epochs": network.n_iter_,
            "steps": network.n_steps_,
            "best_epoch": network.best_epoch_,
            "history": network.history_,
        },
    )


def distilled_pairs(args: argparse.Namespace, X: list[str], y: list[list[str]]) -> tuple:
    """The training pairs of a distilled student (``--distill-from``): each distinct training
    word with the pronunciation the teacher (the ensemble of the saved members, at
    ``--beam-size``) ranks first, plus the references with ``--distill-references``; and what
    the results record of the teacher (its members' training seconds, the labelling seconds)."""
    members, teacher, teacher_seconds = load_ensemble(args.distill_from, args.beam_size)
    start = time.perf_counter()
    X_taught, y_taught = teacher_targets(teacher, X, tokenizer=members[0].tokenizer)
    label_seconds = time.perf_counter() - start
    references = dict(zip(*group_pronunciations(X, y), strict=True))
    agree = float(np.mean([p in references[w] for w, p in zip(X_taught, y_taught, strict=True)]))
    print(
        f"teacher ({len(members)} members, {teacher_seconds / 60:.1f} min of training) labelled "
        f"{len(X_taught)} words in {label_seconds / 60:.1f} min; {100 * agree:.2f} % match a "
        "reference"
    )
    if args.distill_references:
        X_taught, y_taught = X_taught + list(X), y_taught + list(y)
    summary = {
        "teacher": [str(p) for p in args.distill_from],
        "teacher_seconds": teacher_seconds,
        "label_seconds": label_seconds,
        "teacher_train_agreement": agree,
    }
    return X_taught, y_taught, summary


def read_pairs(path: Path) -> tuple[list[str], list[list[str]]]:
    """``WORD<TAB>PHONEMES`` lines; a word of CMUdict's standard split (its training words,
    the dev words among them, or its test words) is an error, whatever subset a run trains on:
    the extra words must never include a test word or relabel a transcribed one."""
    refused = set(load_cmudict("train")[0]) | set(load_cmudict("test")[0])
    X, y = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        word, _, phonemes = line.partition("\t")
        if not word or not phonemes.split():
            raise SystemExit(f"{path}:{number}: expected WORD<TAB>PHONEMES, got {line!r:.60}")
        if word in refused:
            raise SystemExit(f"{path}:{number}: {word} is a word of CMUdict's split")
        X.append(word)
        y.append(phonemes.split())
    return X, y


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="a tiny subset and model: a smoke run in seconds")
    add("--max-minutes", type=float, default=50.0, help="wall-clock training budget")
    add("--eval", choices=["dev", "test"], default="test", help="where to score (tune on dev)")
    add("--dev-words", type=int, default=3000, help="training words held out as dev set")
    add("--train-words", type=int, default=None, help="train on a subset of this many words")
    add(
        "--stress",
        action="store_true",
        help="train on CMUdict's stressed pronunciations (scored without the stress too)",
    )
    add("--encoder", choices=["rnn", "transformer"], default="rnn")
    add("--decoder", choices=["bahdanau", "luong", "transformer"], default="bahdanau")
    add("--scorer", choices=["dot", "general", "additive", "scaled_dot"], default="additive")
    add("--input-feeding", action=argparse.BooleanOptionalAction, default=False)
    add("--cell", choices=["gru", "lstm"], default="gru")
    add("--embedding-dim", type=int, default=64)
    add("--hidden-size", type=int, default=256)
    add("--num-layers", type=int, default=1)
    add("--num-heads", type=int, default=4, help="with --encoder transformer")
    add("--ffn-size", type=int, default=None, help="with --encoder transformer (default 4 d)")
    add("--positions", choices=["sinusoidal", "learned"], default="sinusoidal")
    add("--dropout", type=float, default=0.3)
    add("--batch-size", type=int, default=64)
    add("--learning-rate", type=float, default=1e-3)
    add("--weight-decay", type=float, default=0.0, help="AdamW's decoupled weight decay")
    add(
        "--lr-schedule", choices=["constant", "plateau", "cosine", "inverse_sqrt"], default="cosine"
    )
    add("--warmup-steps", type=int, default=0)
    add("--average-checkpoints", type=int, default=1, help="keep the mean of the last k epochs")
    add("--continue-from", type=input_file, default=None, help="a joblib model to warm-start from")
    add(
        "--right-to-left",
        action="store_true",
        help="train on reversed pronunciations (RightToLeft; scored in the usual order)",
    )
    add(
        "--ensemble", type=input_file, nargs="+", help="evaluate the ensemble of these saved models"
    )
    add(
        "--distill-from",
        type=input_file,
        nargs="+",
        help="train on the pronunciations the ensemble of these saved models gives the words",
    )
    add("--distill-references", action="store_true", help="with --distill-from: keep CMUdict's")
    add(
        "--extra-pairs",
        type=input_file,
        default=None,
        help="train on these WORD<TAB>PHONEMES lines too (scripts/g2p_teacher_labels.py's "
        "teacher-labelled words outside CMUdict)",
    )
    add(
        "--early-stopping",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold out --validation-fraction and keep the best epoch (off: the last epoch)",
    )
    add("--label-smoothing", type=float, default=0.0)
    add("--early-stopping-metric", choices=["loss", "exact_match"], default="exact_match")
    add("--max-epochs", type=int, default=100)
    add("--validation-fraction", type=float, default=0.03)
    add("--n-iter-no-change", type=int, default=5)
    add("--beam-size", type=int, default=5)
    add(
        "--length-penalty",
        type=float,
        default=1.0,
        help="beam search ranks a finished hypothesis by its log-probability / length ** this",
    )
    add("--threads", type=int, default=None, help="torch threads (default: the usable cores)")
    add(
        "--precision",
        choices=["float32", "bfloat16"],
        default="float32",
        help="training's products (bfloat16: mixed precision, fast on CPUs with AMX)",
    )
    add("--g2p-en", action=argparse.BooleanOptionalAction, default=True, help="compare g2p_en")
    add("--seed", type=int, default=0, help="the dev split's (and the model's) random state")
    add("--model-seed", type=int, default=None, help="the model's random state (default: --seed)")
    add("--export", type=export_directory, default=None, help="write the ONNX artifact here")
    add("--out", type=output_file, default=None, help="write the results as JSON here")
    add("--save", type=output_file, default=None, help="joblib.dump the fitted estimator here")
    args = parser.parse_args(argv)
    for name in (
        "dev_words", "hidden_size", "batch_size", "beam_size", "max_epochs", "num_layers",
        "train_words", "threads",
    ):  # fmt: skip
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("seed", "model_seed"):  # a random state
        if getattr(args, name) is not None and not 0 <= getattr(args, name) < 2**32:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 2**32)")
    if args.decoder == "transformer" and args.encoder != "transformer":
        parser.error("--decoder transformer needs --encoder transformer")
    if args.distill_from and args.ensemble:
        parser.error("--distill-from trains a student; --ensemble evaluates saved models: not both")
    if args.right_to_left and (args.ensemble or args.continue_from):
        parser.error("--right-to-left trains a new network: not with --ensemble or --continue-from")
    if args.distill_references and not args.distill_from:
        parser.error("--distill-references needs --distill-from")
    if args.stress and (args.distill_from or args.extra_pairs or args.ensemble):
        parser.error(
            "--stress trains on CMUdict's stressed lines: not with --distill-from, "
            "--extra-pairs or --ensemble (a stressed model's output is scored either way)"
        )
    if not (math.isfinite(args.max_minutes) and args.max_minutes >= 0):
        parser.error("--max-minutes must be a finite number >= 0 (0: no budget, --max-epochs)")
    if args.quick:
        args.train_words, args.dev_words, args.hidden_size, args.embedding_dim = 1000, 50, 32, 16
        args.batch_size, args.max_epochs, args.max_minutes, args.beam_size = 32, 4, 0.0, 2
    try:  # every estimator parameter in the library's bounds, before any data loads
        build_model(args)._validate_params()
    except ValueError as error:  # (sklearn's InvalidParameterError names the parameter)
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    data = load_splits(args.dev_words, args.train_words, args.seed, args.stress)
    if args.quick:  # a tiny test set too, so that the smoke run takes seconds
        data["test"] = subsample_words(*data["test"], 100, args.seed)
    X_train, y_train = data["train"]
    print(
        f"CMUdict: {len(set(X_train))} training words ({len(X_train)} pronunciations), "
        f"{len(set(data['dev'][0]))} dev words, {len(set(data['test'][0]))} test words"
    )

    distilled = {}
    if args.distill_from:  # sequence-level distillation: the teacher's outputs are the targets
        X_train, y_train, distilled = distilled_pairs(args, X_train, y_train)
    if args.extra_pairs is not None:  # words outside CMUdict, labelled by a teacher
        X_extra, y_extra = read_pairs(args.extra_pairs)
        X_train, y_train = list(X_train) + X_extra, list(y_train) + y_extra
        distilled["extra_pairs"] = {"path": str(args.extra_pairs), "words": len(X_extra)}
        print(f"{len(X_extra)} teacher-labelled words from {args.extra_pairs}")
    model, train_seconds, summary = train_or_load(args, X_train, y_train)
    results = {
        "config": {k: v for k, v in vars(args).items() if not isinstance(v, Path | list)},
        "train_seconds": train_seconds,
        **summary,
        **distilled,
        "published": [{"system": s, "per": p, "wer": w} for s, p, w in PUBLISHED],
        "systems": {},
    }
    eval_sets = ["dev"] if args.eval == "dev" else ["dev", "test"]
    for split in eval_sets:
        row = evaluate(model.predict, *data[split])
        results[f"skattn_{split}"] = row
        print(
            f"skattn on {split} words (beam {args.beam_size}): PER {row['per']:.2f}%, "
            f"WER {row['wer']:.2f}%, {row['words_per_second']:.0f} words/s"
        )
        if "stressed" in row:
            stressed = row["stressed"]
            print(
                f"  with stress, on the {stressed['words']} of them CMUdict stresses: "
                f"PER {stressed['per']:.2f}%, WER {stressed['wer']:.2f}%"
            )
    name = system_name(args, model)
    results["systems"][f"{name}, beam {args.beam_size}"] = results[f"skattn_{args.eval}"]
    if args.beam_size > 1:  # greedy too: g2p_en decodes greedily
        network_of(model).set_params(beam_size=1)  # a prediction-time setting: no refit
        row = evaluate(model.predict, *data[args.eval])
        network_of(model).set_params(beam_size=args.beam_size)
        results[f"skattn_{args.eval}_greedy"] = row
        results["systems"][f"{name}, greedy"] = row

    if args.g2p_en:
        predict_word, reason = load_g2p_en()
        if predict_word is None:
            results["g2p_en"] = {"available": False, "reason": reason}
            print(reason)
        else:
            row = evaluate(lambda ws: [predict_word(w) for w in ws], *data[args.eval])
            results["g2p_en"] = {"available": True, **row}
            results["systems"]["g2p_en 2.1 GRU, no attention (trained on all CMUdict)"] = row

    print(f"\nCMUdict G2P, {args.eval} words:\n")
    print(format_table(results))
    if args.save is not None:  # first: the model took the time
        joblib.dump(model, args.save)
        print(f"fitted estimator: {args.save} (joblib)")
    if args.out is not None:  # before exporting, so that the measurements survive any failure
        write_json(results, args.out)
    if args.export is not None:
        model.export_onnx(args.export)  # a RightToLeft's is marked right to left
        results["export"] = str(args.export)
        print(f"exported to {args.export} (python -m serving --model-dir {args.export})")
        if args.right_to_left:
            print("  marked right to left: the runtime and the server give it in the usual order")
        if args.out is not None:
            write_json(results, args.out)
    return results


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=_json_default))
    print(f"results: {path}")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


if __name__ == "__main__":
    main()
