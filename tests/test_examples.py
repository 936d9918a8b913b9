"""The examples: every script's ``--quick`` run end to end, and the helpers they are built on.

The ``--quick`` runs are subprocesses started from the repository root (as a user would run
them), writing into ``tmp_path``; they are marked ``slow`` and still run in CI. One runs without
``--out``, from ``tmp_path``, to check that a smoke run leaves the README's figures alone.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pytest

import serving
from skattn import Seq2Seq
from skattn.right_to_left import RightToLeft

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import demo  # noqa: E402
import explorer  # noqa: E402
import g2p_cmudict  # noqa: E402
import grid_search  # noqa: E402
import grid_search_cluster  # noqa: E402
import reversal_attention  # noqa: E402
import serve_and_query  # noqa: E402
import temperature_local  # noqa: E402
import transformer_tasks  # noqa: E402


def run_example(
    script: str, *args: str, timeout: float = 300, cwd: Path = ROOT, **env_vars: str
) -> str:
    """Run ``examples/<script> --quick <args>`` from ``cwd`` (the repository root by default),
    with ``env_vars`` added to the environment; return its stdout."""
    # One intra-op thread, as in conftest: on shared cores, OpenMP threads of tiny models spin
    # against other jobs and run several times slower than one thread.
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", **env_vars)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--quick", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def table_rows(text: str) -> list[list[str]]:
    """The rows of the Markdown tables in ``text`` (headers included, separators left out)."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    return [row for row in rows if not all(set(cell) <= set("-:") for cell in row)]


def assert_png(path: Path) -> None:
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def docs_pngs() -> dict[str, bytes]:
    """The repository's ``docs/*.png`` (the README's figures), by name."""
    return {path.name: path.read_bytes() for path in (ROOT / "docs").glob("*.png")}


# ---------------------------------------------------------------- --quick runs (slow)


@pytest.mark.slow
def test_reversal_attention_quick(tmp_path):
    out = run_example("reversal_attention.py", "--out", str(tmp_path))
    models = {row[0] for row in table_rows(out)[1:]}
    assert models == {"bahdanau attention", "no attention"}
    assert_png(tmp_path / "reversal_attention.png")


@pytest.mark.slow
def test_quick_without_out_writes_to_a_temporary_folder(tmp_path):
    # Without --out, a smoke run once wrote its 20-step heatmap over docs/: it must go to a
    # fresh temporary folder instead (TMPDIR puts it in tmp_path) and say where.
    before = docs_pngs()
    out = run_example("reversal_attention.py", cwd=tmp_path, TMPDIR=str(tmp_path))
    assert docs_pngs() == before
    assert not (tmp_path / "docs").exists()  # nor docs/ relative to the working directory
    path = Path(re.search(r"heatmap of one length-8 input: (.+)$", out, re.MULTILINE).group(1))
    assert path.name == "reversal_attention.png"
    assert path.parent.name.startswith("skattn-")
    assert path.parent.parent.resolve() == tmp_path.resolve()
    assert_png(path)


@pytest.mark.slow
def test_quickstart_quick():
    out = run_example("quickstart.py")
    assert re.search(r"exact match on 200 new strings: [01]\.\d{3}", out)
    attention_rows = out.split("each row sums to 1")[1].strip().splitlines()[1:]
    prediction = re.search(r"-> '([^']*)'", out).group(1)
    assert len(attention_rows) == len(prediction)  # one row per output token


def test_the_examples_thread_flags_reach_the_estimator():
    # torch.set_num_threads alone would not: the estimator sets torch's threads for each call
    _, models = reversal_attention.run_experiment(2, n_eval=2, hidden_size=8, n_threads=1)
    assert {model.n_threads_ for model in models.values()} == {1}
    args = g2p_cmudict.parse_args(["--quick", "--threads", "1"])
    assert g2p_cmudict.build_model(args).n_threads == 1


@pytest.mark.slow
def test_demo_quick(tmp_path):
    out = run_example("demo.py", "--out", str(tmp_path))
    assert "MISMATCH" not in out
    rows = re.findall(r"^\s+'(\d*)' -> '(\d*)'\s+(right|WRONG)\s+same$", out, flags=re.MULTILINE)
    assert len(rows) >= 4
    for source, served, verdict in rows:  # the table judges the answer, not only the agreement
        assert verdict == ("right" if served == source[::-1] else "WRONG")
    assert "exit code 0" in out
    assert_png(tmp_path / "reversal_attention.png")
    if "cmudict-g2p" in serving.packaged_models():  # served beside the reversal model
        g2p = re.findall(r"^  ([A-Z]+)\s+-> ([A-Z ]+?)\s+(right|CMUdict: .+)$", out, re.MULTILINE)
        assert [word for word, _, _ in g2p] == demo.G2P_WORDS
        assert sum(verdict == "right" for _, _, verdict in g2p) >= 3


@pytest.mark.slow
def test_temperature_local_quick(tmp_path):
    out = run_example("temperature_local.py", "--out", str(tmp_path))
    header, *rows = table_rows(out)
    assert header[0] == "attention"
    assert [row[0] for row in rows] == [
        "additive, tau = 0.1",
        "additive, tau = 1",
        "additive, tau = 10",
        f"local-p, D = {temperature_local.WINDOW}, tau = 1",
    ]
    entropy = [float(row[2]) for row in rows]
    # The same model's rows flatten as tau grows, towards ln(9) (8 digits and the end marker).
    assert entropy[0] < entropy[1] < entropy[2] <= math.log(9) + 1e-6
    assert_png(tmp_path / "temperature_local.png")


@pytest.mark.slow
def test_grid_search_quick():
    out = run_example("grid_search.py")
    header, *rows = table_rows(out)
    assert header[:3] == ["rank", "decoder", "scorer"]
    assert sorted((row[1], row[3]) for row in rows) == [
        ("bahdanau", "-"),
        ("luong", "False"),
        ("luong", "True"),
    ]
    scores = [float(row[4]) for row in rows]
    assert scores == sorted(scores, reverse=True)  # best first
    assert all(0.0 <= s <= 1.0 for s in scores)


@pytest.mark.slow
def test_g2p_cmudict_quick(tmp_path):
    results_path, model_dir = tmp_path / "g2p.json", tmp_path / "g2p_model"
    run_example("g2p_cmudict.py", "--out", str(results_path), "--export", str(model_dir))
    results = json.loads(results_path.read_text())
    test = results["skattn_test"]
    assert test["words"] == 100
    assert 0.0 <= test["wer"] <= 100.0
    assert 0.0 <= test["per"] < 100.0  # it learned something: not every phoneme is wrong
    assert results["skattn_dev"]["words"] == 50
    assert results["skattn_test_greedy"]["words"] == 100  # beam search and greedy, same words
    g2p_en = results["g2p_en"]
    if g2p_en["available"]:  # trained on these very words: it must do well on them
        assert g2p_en["words"] == 100 and g2p_en["per"] < 20.0
    else:
        assert g2p_en["reason"]

    import serving

    runtime = serving.load(model_dir, device="cpu")
    (prediction,) = runtime.predict(["CAT"])
    assert isinstance(prediction, list) and all(isinstance(p, str) for p in prediction)


@pytest.mark.slow
def test_g2p_cmudict_quick_distils_a_saved_teacher(tmp_path):
    teacher, results_path = tmp_path / "teacher.joblib", tmp_path / "student.json"
    run_example("g2p_cmudict.py", "--no-g2p-en", "--save", str(teacher))
    args = ["--no-g2p-en", "--distill-from", str(teacher), "--out", str(results_path)]
    run_example("g2p_cmudict.py", *args)
    results = json.loads(results_path.read_text())
    assert results["teacher"] == [str(teacher)] and results["teacher_seconds"] > 0
    assert results["label_seconds"] > 0 and 0.0 <= results["teacher_train_agreement"] <= 1.0
    assert results["skattn_test"]["words"] == 100


@pytest.mark.slow
def test_g2p_cmudict_quick_trains_right_to_left_and_scores_in_the_usual_order(tmp_path):
    saved, results_path, artifact = tmp_path / "r2l.joblib", tmp_path / "r2l.json", tmp_path / "a"
    args = ["--no-g2p-en", "--right-to-left", "--save", str(saved), "--out", str(results_path)]
    run_example("g2p_cmudict.py", *args, "--export", str(artifact))
    results = json.loads(results_path.read_text())
    assert results["right_to_left"] is True and results["skattn_test"]["words"] == 100
    assert "right to left" in next(iter(results["systems"]))
    r2l = joblib.load(saved)
    assert isinstance(r2l, RightToLeft)
    words = ["CAT", "DOG", "HELLO"]
    served = serving.load(artifact, device="cpu")  # marked right to left: the usual order
    assert served.manifest.output_order == "right_to_left"
    assert served.predict(words) == r2l.predict(words)
    assert r2l.predict(words) == [p[::-1] for p in r2l.estimator_.predict(words)]


@pytest.mark.slow
def test_g2p_cmudict_quick_trains_with_stress_and_scores_with_and_without_it(tmp_path):
    saved, results_path = tmp_path / "stress.joblib", tmp_path / "stress.json"
    args = ["--no-g2p-en", "--stress", "--save", str(saved), "--out", str(results_path)]
    run_example("g2p_cmudict.py", *args)
    model = joblib.load(saved)
    vowels = {"AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY"}
    assert {"AH0", "AH1", "EY1"} <= set(model.target_vocab_.tokens)  # it learned stress
    assert not vowels & set(model.target_vocab_.tokens)
    results = json.loads(results_path.read_text())
    for split, words in (("dev", 50), ("test", 100)):
        row = results[f"skattn_{split}"]
        assert row["words"] == words and 0.0 <= row["per"] < 100.0
        # scored without the stress against the split's references, and with it on the words
        # CMUdict stresses: a word wrong without stress is wrong with it
        stressed = row["stressed"]["words"]
        assert 0 < stressed <= words
        wrong, wrong_stressed = row["wer"] * words / 100, row["stressed"]["wer"] * stressed / 100
        assert wrong_stressed >= wrong - (words - stressed) - 1e-6
    predictions = model.predict(["ABANDONED", "PHOTOGRAPHY"])
    assert all(p[-1:] in ("0", "1", "2") for p in sum(predictions, []) if p[:-1] in vowels)
    with pytest.raises(SystemExit):
        g2p_cmudict.parse_args(["--stress", "--ensemble", str(saved)])


@pytest.mark.slow
def test_serve_and_query_quick(tmp_path):
    out = run_example("serve_and_query.py", "--out", str(tmp_path))
    answers = re.findall(r"^\s+'(\d+)' -> '(\d*)'\s+ok$", out, flags=re.MULTILINE)
    sources = serve_and_query.REVERSAL_SOURCES
    assert [source for source, _ in answers] == sources * 2  # tritonclient, then httpx
    assert answers[: len(sources)] == answers[len(sources) :]
    assert "MISMATCH" not in out
    assert "exit code 0" in out
    assert (tmp_path / "reversal" / "manifest.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not (EXAMPLES / "explorer.py").exists(), reason="no explorer example")
def test_explorer_quick(tmp_path):
    run_example("explorer.py", "--out", str(tmp_path))


# ---------------------------------------------------------------- helpers (fast)


def test_mean_row_entropy_bounds():
    uniform, one_hot = np.full((2, 4), 0.25), np.eye(3)
    assert temperature_local.mean_row_entropy([uniform]) == pytest.approx(math.log(4))
    assert temperature_local.mean_row_entropy([one_hot]) == 0.0
    # mean over all rows of all maps, not over maps
    both = temperature_local.mean_row_entropy([uniform, one_hot])
    assert both == pytest.approx(2 * math.log(4) / 5)


def test_g2p_budget_becomes_max_time():
    model = g2p_cmudict.build_model(g2p_cmudict.parse_args(["--max-minutes", "12.5"]))
    assert model.max_time == 750.0 and model.max_steps is None
    assert g2p_cmudict.build_model(g2p_cmudict.parse_args(["--quick"])).max_time is None


@pytest.mark.parametrize("minutes", ["nan", "inf", "-1"])
def test_g2p_budget_must_be_a_finite_number(minutes, capsys):
    """--max-minutes nan passed the check (NaN < 0 is false) and meant no budget in silence."""
    with pytest.raises(SystemExit) as refused:
        g2p_cmudict.parse_args(["--max-minutes", minutes])
    assert refused.value.code == 2
    assert "--max-minutes must be a finite number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (reversal_attention.main, ["--steps", "0"], "--steps must be >= 1"),
        (demo.main, ["--threads", "0"], r"--threads: must be in \[1, 1024\], got 0"),
        (demo.main, ["--threads", "5000"], r"--threads: must be in \[1, 1024\], got 5000"),
        (transformer_tasks.main, ["--max-time", "nan"], "--max-time must be a finite number"),
        (transformer_tasks.main, ["--max-time", "0"], "--max-time must be a finite number"),
        (g2p_cmudict.parse_args, ["--threads", "0"], "--threads must be >= 1"),
        (g2p_cmudict.parse_args, ["--num-layers", "0"], "--num-layers must be >= 1"),
        (g2p_cmudict.parse_args, ["--train-words", "0"], "--train-words must be >= 1"),
        (g2p_cmudict.parse_args, ["--seed", "-1"], r"--seed must be in \[0, 2\*\*32\)"),
        (g2p_cmudict.parse_args, ["--model-seed", str(2**32)], "--model-seed must be in"),
    ],
)
def test_bad_example_flags_are_refused_by_name_before_any_work(main, argv, message, capsys):
    """They ended in a traceback naming an estimator parameter (n_samples, n_threads,
    max_time, random_state), demo's only after its first part had run."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    err = capsys.readouterr()
    assert re.search(message, err.err) and "==" not in err.out  # demo printed no part


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_paths_and_estimator_settings_are_refused_before_any_training(
    fitted_reversal, tmp_path, capsys
):
    """A run's outputs were written after training: an --out naming a folder lost an hour's
    model and figures to a traceback, and --dropout 2 or a damaged artifact failed only when
    used. Each is now argparse's one line (exit 2) before any data loads."""
    folder, file = tmp_path / "folder", tmp_path / "file"
    folder.mkdir()
    file.write_text("not a model")
    (folder / "other").write_text("")
    damaged = fitted_reversal.export_onnx(tmp_path / "damaged")
    with open(damaged / "decoder_step.onnx", "r+b") as graph:
        graph.truncate(100)
    cases = [
        (g2p_cmudict.parse_args, ["--out", str(folder)], "--out: .* is a folder"),
        (g2p_cmudict.parse_args, ["--save", str(folder)], "--save: .* is a folder"),
        (g2p_cmudict.parse_args, ["--out", f"{file}/x.json"], "is a file, not a folder"),
        (g2p_cmudict.parse_args, ["--export", str(file)], "--export: path must be a directory"),
        (g2p_cmudict.parse_args, ["--export", str(folder)], "not part of an artifact"),
        (g2p_cmudict.parse_args, ["--ensemble", str(tmp_path / "no")], "no such file"),
        (g2p_cmudict.parse_args, ["--extra-pairs", str(folder)], "a folder, not a file"),
        (g2p_cmudict.parse_args, ["--dropout", "2"], "'dropout' parameter of Seq2Seq"),
        (g2p_cmudict.parse_args, ["--threads", "5000"], "'n_threads' parameter"),
        (
            g2p_cmudict.parse_args,
            ["--right-to-left", "--continue-from", str(file)],
            "--right-to-left trains a new network",
        ),
        (serve_and_query.main, ["--model-dir", str(folder)], "--model-dir: .*missing manifest"),
        (serve_and_query.main, ["--out", str(file)], "--out: .*lies inside a file"),
        (serve_and_query.main, ["--model-dir", str(damaged)], "checksum mismatch"),
        (explorer.main, ["--g2p-dir", str(damaged)], "--g2p-dir: .*checksum mismatch"),
        (explorer.main, ["--host", ""], "--host: an empty address"),  # every interface
        (explorer.main, ["--out", str(file)], "--out: .*lies inside a file"),
        # a dead Ray address hung the driver past SIGTERM; a bad Dask one ended in a traceback
        (grid_search_cluster.main, ["--ray", f"127.0.0.1:{closed_port()}"], "nothing answers"),
        (grid_search_cluster.main, ["--scheduler", "foo"], "not an address of the form"),
        (grid_search_cluster.main, ["--workers", "1025"], "--workers: at most the"),
    ]
    for main, argv, message in cases:
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert refused.value.code == 2, argv
        assert re.search(message, capsys.readouterr().err), argv
    pipe = tmp_path / "pipe"  # a shell's <(...) or /dev/stdin: read as before
    os.mkfifo(pipe)
    assert g2p_cmudict.parse_args(["--extra-pairs", str(pipe)]).extra_pairs == pipe
    args = g2p_cmudict.parse_args(["--continue-from", str(file), "--max-minutes", "0"])
    with pytest.raises(SystemExit, match=r"--continue-from .*file: not a saved model"):
        g2p_cmudict.train_or_load(args, ["ABC"], [["EY1"]])


def test_g2p_length_penalty_reaches_the_model_and_the_ensemble(fitted_reversal, tmp_path):
    args = g2p_cmudict.parse_args(["--length-penalty", "0.6", "--beam-size", "3"])
    assert g2p_cmudict.build_model(args).length_penalty == 0.6
    assert g2p_cmudict.build_model(g2p_cmudict.parse_args([])).length_penalty == 1.0
    path = tmp_path / "member.joblib"
    joblib.dump(fitted_reversal, path)
    _, ensemble, _ = g2p_cmudict.load_ensemble([path], 3, 0.6)
    assert (ensemble.beam_size, ensemble.length_penalty) == (3, 0.6)


def test_g2p_transformer_options_reach_the_estimator(tmp_path):
    from skattn.models import ModelConfig

    saved = [str(tmp_path / name) for name in ("a", "b")]  # --ensemble reads existing files
    for path in saved:
        Path(path).write_bytes(b"")

    def config(model):  # what fit builds: raises ValueError for options the family refuses
        return ModelConfig.from_params(
            model.get_params(), source_vocab_size=10, target_vocab_size=10
        )

    args = ["--encoder", "transformer", "--decoder", "transformer", "--num-heads", "2"]
    rnn_options = ["--embedding-dim", "32", "--cell", "lstm", "--scorer", "dot"]
    argv = [*args, "--ffn-size", "96", *rnn_options]
    model = g2p_cmudict.build_model(g2p_cmudict.parse_args(argv))
    assert (model.encoder, model.decoder, model.num_heads, model.ffn_size) == (
        "transformer",
        "transformer",
        2,
        96,
    )
    # the RNN-only options are not passed: the estimator's defaults, which the family accepts
    default = Seq2Seq()
    assert (model.embedding_dim, model.cell, model.scorer, model.input_feeding) == (
        default.embedding_dim,
        default.cell,
        default.scorer,
        default.input_feeding,  # True, where the example's own default is False
    )
    config(model)
    hybrid = g2p_cmudict.build_model(g2p_cmudict.parse_args(["--encoder", "transformer"]))
    assert (hybrid.decoder, hybrid.scorer, hybrid.num_heads) == ("bahdanau", "additive", 4)
    config(hybrid)
    rnn = g2p_cmudict.build_model(g2p_cmudict.parse_args(["--ffn-size", "96"]))
    assert rnn.encoder == "rnn" and rnn.num_heads == default.num_heads  # not the example's 4
    assert rnn.ffn_size is None
    config(rnn)
    with pytest.raises(SystemExit):  # the Transformer decoder needs the Transformer encoder
        g2p_cmudict.parse_args(["--decoder", "transformer"])
    names = [
        g2p_cmudict.system_name(g2p_cmudict.parse_args(argv))
        for argv in ([], ["--encoder", "transformer"], args, ["--ensemble", *saved])
    ]
    assert names == [
        "skattn bahdanau/additive bi-GRU 256",
        "skattn Transformer encoder (1 x 256, 4 heads) / bahdanau/additive GRU",
        "skattn Transformer (1 x 256, 2 heads)",
        "skattn ensemble of 2",
    ]
    # a continued run is named after the saved model, not the command line's defaults
    assert g2p_cmudict.system_name(g2p_cmudict.parse_args([]), model) == (
        "skattn Transformer (1 x 256, 2 heads)"
    )


def test_g2p_evaluate_counts_any_reference_and_closest_per():
    X = ["READ", "READ", "CAT"]
    y = [["R", "IY", "D"], ["R", "EH", "D"], ["K", "AE", "T"]]
    predictions = {"READ": ["R", "EH", "D"], "CAT": ["K", "AH", "T", "S"]}
    row = g2p_cmudict.evaluate(lambda words: [predictions[w] for w in words], X, y)
    assert row["words"] == 2
    assert row["wer"] == pytest.approx(50.0)  # READ matches its second reference
    assert row["per"] == pytest.approx(100.0 * 2 / 6)  # CAT: 1 substitution + 1 insertion


def test_g2p_splits_are_disjoint_by_word():
    data = g2p_cmudict.load_splits(dev_words=100, train_words=500, seed=0)
    train, dev, test = (set(data[s][0]) for s in ("train", "dev", "test"))
    assert len(train) == 500 and len(dev) == 100
    assert not train & dev and not train & test and not dev & test


def test_g2p_format_table_lists_published_and_measured():
    row = {"per": 6.0, "wer": 25.0, "words_per_second": 1000.0}
    text = g2p_cmudict.format_table({"systems": {"ours": row}})
    cells = table_rows(text)
    assert cells[-1] == ["ours", "6.00", "25.00", "1000"]
    assert len(cells) == 1 + len(g2p_cmudict.PUBLISHED) + 1


def test_grid_search_table_sorted_by_rank():
    cv_results = {
        "params": [
            {"decoder": "bahdanau", "scorer": "dot"},
            {"decoder": "luong", "scorer": "general", "input_feeding": True},
        ],
        "rank_test_score": np.array([2, 1]),
        "mean_test_score": np.array([0.5, 0.9]),
        "std_test_score": np.array([0.1, 0.0]),
        "mean_fit_time": np.array([3.0, 4.0]),
    }
    _, first, second = table_rows(grid_search.results_table(cv_results))
    assert first[:5] == ["1", "luong", "general", "True", "0.900"]
    assert second[:5] == ["2", "bahdanau", "dot", "-", "0.500"]


def test_unpad_restores_each_map():
    padded = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    maps = serve_and_query._unpad(padded, np.array([[3, 4], [1, 2]]))
    assert [m.shape for m in maps] == [(3, 4), (1, 2)]
    np.testing.assert_array_equal(maps[1], padded[1, :1, :2])


@pytest.mark.slow
def test_g2p_rerank_quick_run_tables_the_three_systems():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import phonetisaurus_g2p

    if (reason := phonetisaurus_g2p.unavailable_reason()) is not None:
        pytest.skip(reason)
    out = run_example("g2p_rerank.py")
    rows = {row[0]: row for row in table_rows(out)[1:]}
    assert len(rows) == 3 and any("reranking Phonetisaurus' 10-best" in name for name in rows)
    for row in rows.values():
        assert 0 <= float(row[1]) <= 100 and 0 <= float(row[2]) <= 100
    assert "chosen on 100 dev words: weight" in out
