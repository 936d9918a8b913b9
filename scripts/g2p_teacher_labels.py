"""Pronunciations for English words outside CMUdict, written by a teacher: a student's extra data.

Sequence-level distillation with unlabeled words (Sun et al., 2019: the table's best published
G2P result) trains a student on a teacher's answers for words nobody transcribed. The words
here are the English word list that PyPI's ``pyspellchecker`` ships (``en.json.gz``: words and
their counts in subtitles), in upper case, letters only, none of them a word of CMUdict's
standard split (training, dev or test): nothing of the test set is read. The teacher is a saved
skattn model reranking Phonetisaurus' n-best lists (:class:`skattn.rescoring.NBestReranker`),
the pair that reached 21.34 % test WER beside the two-layer model's 24.23 % alone; its weight and
length exponent are chosen on the 3,000 dev words, and its training time is the model's plus
Phonetisaurus'.

    python scripts/g2p_teacher_labels.py --model benchmarks/results/g2p/layers2.joblib \\
        --out runs/teacher_labels.tsv          # then: g2p_cmudict.py --extra-pairs that file
    python scripts/g2p_teacher_labels.py --quick --model M.joblib --out labels.tsv
                                           # Phonetisaurus on 2,000 words; 100 dev words, 50
                                           # labelled: a smoke run, not a measurement

Writes ``WORD<TAB>PHONEMES`` lines (best first by the word list's counts) and, beside it,
``.json`` with what the teacher was and how long labelling took.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import joblib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import phonetisaurus_g2p as ps  # noqa: E402
from g2p_cmudict import load_splits, training_seconds  # noqa: E402

import serving  # noqa: E402
from skattn.core.checks import usable_cores  # noqa: E402
from skattn.datasets import group_pronunciations  # noqa: E402
from skattn.rescoring import NBestReranker  # noqa: E402


def unlabeled_words(exclude: set[str], max_length: int) -> tuple[list[str], list[int]]:
    """pyspellchecker's English words (upper case, 2 to ``max_length`` letters, most frequent
    first) that are not in ``exclude``, and their counts."""
    try:
        import spellchecker
    except ImportError as error:
        raise SystemExit(
            "the word list comes from PyPI's pyspellchecker: pip install it"
        ) from error
    path = Path(spellchecker.__file__).parent / "resources" / "en.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        counts = json.load(f)
    pairs = sorted(((-c, w.upper()) for w, c in counts.items() if re.fullmatch(r"[a-z]+", w)))
    kept = [(w, -c) for c, w in pairs if 2 <= len(w) <= max_length and w not in exclude]
    return [w for w, _ in kept], [c for _, c in kept]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", type=Path, required=True, help="a saved Seq2Seq (joblib): the teacher's network")
    add("--out", type=Path, required=True, help="the TSV to write")
    add("--nbest", type=int, default=10, help="Phonetisaurus' candidates a word")
    add("--words", type=int, default=None, help="label only the most frequent this many words")
    add("--dev-words", type=int, default=3000, help="as g2p_cmudict.py: the words held out")
    add("--seed", type=int, default=0, help="as g2p_cmudict.py: the dev split's random state")
    add("--quick", action="store_true", help="a smoke run on a few words")
    args = parser.parse_args(argv)
    if args.quick:
        args.dev_words, args.words = 100, min(args.words or 50, 50)
    if args.nbest < 1 or (args.words is not None and args.words < 1):
        parser.error("--nbest and --words must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    ps.require()
    data = load_splits(args.dev_words, None, args.seed)
    split_words = {w for X, _ in data.values() for w in X}  # every word of the split, test too
    longest = max(len(w) for w in data["train"][0])
    if args.quick:  # after the split's words are known: none of them is labelled either way
        data = load_splits(args.dev_words, 2000, args.seed)
    words, _ = unlabeled_words(split_words, longest)
    words = words[: args.words]  # all of them when --words is None
    print(f"{len(words):,} words outside CMUdict's split to label", flush=True)

    model = joblib.load(args.model)
    jobs = usable_cores()
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        phonetisaurus = ps.Phonetisaurus(ps.Options(order=7), workdir).fit(*data["train"])
        model.export_onnx(Path(workdir) / "teacher")
        runtime = serving.load(Path(workdir) / "teacher", device="cpu", max_batch_size=256)
        reranker = NBestReranker(
            runtime, lambda ws: phonetisaurus.nbest(ws, args.nbest, n_jobs=jobs)
        )
        reranker.fit(*group_pronunciations(*data["dev"]))
        fit_seconds = time.perf_counter() - start
        chosen = (reranker.weight_, reranker.length_exponent_)
        print(
            f"teacher ready in {fit_seconds:.0f} s: weight {chosen[0]:g}, length exponent "
            f"{chosen[1]:g} (dev exact match {reranker.fit_scores_[chosen]:.4f})",
            flush=True,
        )
        start = time.perf_counter()
        labels = []
        for i in range(0, len(words), 4096):
            labels += reranker.predict(words[i : i + 4096])
            print(f"  {len(labels):,} words labelled", flush=True)
        label_seconds = time.perf_counter() - start

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        "".join(f"{w}\t{' '.join(p)}\n" for w, p in zip(words, labels, strict=True))
    )
    summary = {
        "teacher_model": str(args.model),
        "teacher_model_seconds": training_seconds([model]),
        "phonetisaurus_seconds": phonetisaurus.train_cost_.seconds,
        "nbest": args.nbest,
        "weight": chosen[0],
        "length_exponent": chosen[1],
        "dev_exact_match": reranker.fit_scores_[chosen],
        "words": len(words),
        "word_list": "pyspellchecker en.json.gz, letters only, no word of CMUdict's split",
        "fit_seconds": fit_seconds,
        "label_seconds": label_seconds,
    }
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    print(f"{args.out}: {len(words):,} words in {label_seconds / 60:.1f} min", flush=True)
    return summary


if __name__ == "__main__":
    main()
