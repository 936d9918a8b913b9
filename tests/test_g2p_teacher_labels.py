"""A distilled student's extra words: ``scripts/g2p_teacher_labels.py`` and the example's
``--extra-pairs``. None of the extra words may be a word of CMUdict's split (the test words
above all), and the quick run goes end to end: a saved teacher network, Phonetisaurus beside
it, labels written, a student trained on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "examples"))

import g2p_cmudict  # noqa: E402
import g2p_teacher_labels  # noqa: E402

from skattn.datasets import load_cmudict  # noqa: E402


def test_unlabeled_words_leave_out_the_split_and_come_most_frequent_first():
    pytest.importorskip("spellchecker")
    train, test = load_cmudict("train")[0], load_cmudict("test")[0]
    split = set(train) | set(test)
    words, counts = g2p_teacher_labels.unlabeled_words(split, max_length=6)
    assert len(words) > 1000 and len(words) == len(counts)
    assert not split & set(words)
    assert all(w.isalpha() and w.isupper() and 2 <= len(w) <= 6 for w in words)
    assert counts == sorted(counts, reverse=True)
    # and without the split, CMUdict's own words are in the list: the exclusion did the work
    every, _ = g2p_teacher_labels.unlabeled_words(set(), max_length=6)
    assert split & set(every)


def test_extra_pairs_are_read_and_words_of_the_split_refused(tmp_path):
    good = tmp_path / "good.tsv"
    good.write_text("ZZYZX\tZ IH Z IH K S\nQWERTY\tK W ER T IY\n")
    assert g2p_cmudict.read_pairs(good) == (
        ["ZZYZX", "QWERTY"],
        [["Z", "IH", "Z", "IH", "K", "S"], ["K", "W", "ER", "T", "IY"]],
    )
    test_word, training_word = load_cmudict("test")[0][0], load_cmudict("train")[0][-1]
    for text, message in [
        (f"ZZYZX\tZ IH\n{test_word}\tA B\n", "bad.tsv:2: .* a word of CMUdict's split"),
        (f"{training_word}\tA B\n", "a word of CMUdict's split"),
        ("ZZYZX\n", "expected WORD<TAB>PHONEMES"),
        ("ZZYZX\t \n", "expected WORD<TAB>PHONEMES"),
    ]:
        bad = tmp_path / "bad.tsv"
        bad.write_text(text)
        with pytest.raises(SystemExit, match=message):
            g2p_cmudict.read_pairs(bad)


@pytest.mark.slow
def test_quick_teacher_labels_train_a_student(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import phonetisaurus_g2p

    if (reason := phonetisaurus_g2p.unavailable_reason()) is not None:
        pytest.skip(reason)
    pytest.importorskip("spellchecker")

    def run(script: Path, *args: str) -> None:
        # one intra-op thread, as test_examples.run_example's quick runs: OpenMP threads of
        # tiny models spin against other jobs on shared cores
        done = subprocess.run(
            [sys.executable, str(script), "--quick", *args],
            cwd=ROOT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    teacher, labels, student = tmp_path / "t.joblib", tmp_path / "l.tsv", tmp_path / "s.json"
    run(ROOT / "examples" / "g2p_cmudict.py", "--no-g2p-en", "--save", str(teacher))
    run(ROOT / "scripts" / "g2p_teacher_labels.py", "--model", str(teacher), "--out", str(labels))
    lines = labels.read_text().splitlines()
    assert len(lines) == 50 and all(len(line.split("\t")[1].split()) >= 1 for line in lines)
    summary = json.loads(labels.with_suffix(".json").read_text())
    assert summary["words"] == 50 and summary["teacher_model_seconds"] > 0
    assert summary["label_seconds"] > 0 and 0 <= summary["dev_exact_match"] <= 1
    args = ["--no-g2p-en", "--no-early-stopping", "--extra-pairs", str(labels)]
    run(ROOT / "examples" / "g2p_cmudict.py", *args, "--out", str(student))
    results = json.loads(student.read_text())
    assert results["extra_pairs"] == {"path": str(labels), "words": 50}
    assert results["config"]["early_stopping"] is False
