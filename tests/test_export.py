"""Tests for skattn.export: every model kind exports, and the graphs equal the torch module.

The graphs are checked directly against ``Seq2SeqModule.encode`` / ``step`` (the runtime's
end-to-end parity with ``Seq2Seq.predict`` is in test_runtime.py), at batch sizes and source
lengths other than the traced ones, longer than any the module was traced or trained with.
"""

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import serving
from serving.artifact import read_artifact
from skattn import Seq2Seq, Seq2SeqEnsemble
from skattn.core.manifest import (
    BINDING_KEY,
    ITEM_MEMORY_KEY,
    MEMORY_NAMES,
    Manifest,
    sha256_file,
)
from skattn.core.text import EOS, SPECIAL_TOKENS
from skattn.export import export_module, export_onnx
from skattn.models import Seq2SeqModule
from skattn.models.config import ModelConfig

SOURCE_VOCABULARY = [*SPECIAL_TOKENS, *"abcdefghij"]
TARGET_VOCABULARY = [*SPECIAL_TOKENS, *"klmnop"]

# Every scorer x decoder x attention kind ("none" ignores the scorer), plus the LSTM cell and
# Luong without input feeding.
KINDS = [
    dict(decoder=decoder, attention=attention, scorer=scorer)
    for decoder in ("bahdanau", "luong")
    for attention in ("global", "local-m", "local-p")
    for scorer in ("dot", "general", "additive", "scaled_dot")
] + [
    dict(decoder="bahdanau", attention="none", scorer="additive"),
    dict(decoder="luong", attention="none", scorer="additive"),
    dict(decoder="luong", attention="global", scorer="general", input_feeding=False),
    dict(decoder="luong", attention="local-p", scorer="additive", cell="lstm"),
    dict(decoder="bahdanau", attention="local-m", scorer="dot", cell="lstm", num_layers=2),
]


def kind_id(kind: dict) -> str:
    return "-".join(str(v) for v in kind.values())


def make_module(seed: int = 0, **kind) -> Seq2SeqModule:
    torch.manual_seed(seed)
    kind = {"window": 2, **kind}
    config = ModelConfig(
        len(SOURCE_VOCABULARY), len(TARGET_VOCABULARY), embedding_dim=6, hidden_size=8, **kind
    )
    return Seq2SeqModule(config).eval()


def make_transformer(seed: int = 0) -> Seq2SeqModule:
    """A Transformer encoder and decoder of width 32 and 2 heads: weights of 1,024 elements
    and more, as quantization and float16 storage take them."""
    torch.manual_seed(seed)
    config = ModelConfig(
        len(SOURCE_VOCABULARY),
        len(TARGET_VOCABULARY),
        hidden_size=32,
        num_heads=2,
        encoder="transformer",
        decoder="transformer",
    )
    return Seq2SeqModule(config).eval()


def export(module: Seq2SeqModule, path, **kwargs):
    return export_module(
        module,
        path,
        source_vocabulary=SOURCE_VOCABULARY,
        target_vocabulary=TARGET_VOCABULARY,
        tokenizer="char",
        **kwargs,
    )


def random_source(B: int, T: int, rng: np.random.Generator):
    """``(B, T)`` ids with lengths in ``1..T`` (one item of each extreme), ending in EOS."""
    lengths = rng.integers(1, T + 1, size=B)
    lengths[0] = T
    lengths[-1] = 1 if B > 1 else T
    src = np.zeros((B, T), dtype=np.int64)
    for row, length in enumerate(lengths):
        src[row, : length - 1] = rng.integers(4, len(SOURCE_VOCABULARY), size=length - 1)
        src[row, length - 1] = EOS
    return src, lengths.astype(np.int64)


def sessions(directory):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return [
        ort.InferenceSession(str(directory / name), options, providers=["CPUExecutionProvider"])
        for name in ("encoder.onnx", "decoder_step.onnx")
    ]


# A quick run (-m "not slow") keeps one kind per decoder and the multi-state ones.
QUICK = {0, 12, len(KINDS) - 2, len(KINDS) - 1}


@pytest.mark.parametrize(
    "kind",
    [k if i in QUICK else pytest.param(k, marks=pytest.mark.slow) for i, k in enumerate(KINDS)],
    ids=kind_id,
)
def test_every_kind_exports_and_matches_torch_at_dynamic_shapes(kind, tmp_path):
    module = make_module(**kind)
    directory = export(module, tmp_path / "model")

    assert sorted(p.name for p in directory.iterdir()) == [
        "decode.onnx",
        "decoder_step.onnx",
        "encoder.onnx",
        "manifest.json",
    ]
    manifest = read_artifact(directory).manifest
    assert manifest.state_names == tuple(module.state_names)
    signatures = {
        "encoder.onnx": (manifest.encoder_inputs(), manifest.encoder_outputs()),
        "decoder_step.onnx": (manifest.decoder_inputs(), manifest.decoder_outputs()),
    }
    for file, (inputs, outputs) in signatures.items():
        proto = onnx.load(directory / file)
        onnx.checker.check_model(proto, full_check=True)
        assert [i.name for i in proto.graph.input] == inputs
        assert [o.name for o in proto.graph.output] == outputs
        assert {p.key: p.value for p in proto.metadata_props}[BINDING_KEY] == manifest.binding
        assert proto.graph.initializer, "weights must live inside the graph"
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)

    encoder, decoder = sessions(directory)
    rng = np.random.default_rng(0)
    # B and T other than the traced (3, 7); T=40 is longer than any traced or trained length.
    for B in (1, 7, 64):
        for T in (1, 8, 40):
            src, lengths = random_source(B, T, rng)
            with torch.no_grad():
                memory, keys, mask, state = module.encode(
                    torch.from_numpy(src), torch.from_numpy(lengths)
                )
            encoded = encoder.run(None, {"src": src, "src_lengths": lengths})
            for got, want in zip(encoded, (memory, keys, mask, *state), strict=True):
                np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-4)

            y_prev = rng.integers(1, len(TARGET_VOCABULARY), size=B)
            temperature, position = 0.6, int(rng.integers(0, 2 * T + 1))
            with torch.no_grad():
                log_probs, new_state, weights = module.step(
                    torch.from_numpy(y_prev),
                    state,
                    memory,
                    keys,
                    mask,
                    torch.tensor(temperature),
                    torch.tensor(position),
                )
            feeds = dict(zip(manifest.encoder_outputs(), encoded, strict=True))
            feeds |= {
                "y_prev": y_prev,
                "temperature": np.array(temperature, dtype=np.float32),
                "position": np.array(position, dtype=np.int64),
            }
            stepped = decoder.run(None, feeds)
            for got, want in zip(stepped, (log_probs, *new_state, weights), strict=True):
                np.testing.assert_allclose(got, want.numpy(), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(stepped[-1].sum(axis=1), 1.0, atol=1e-5)

            # R = 3 rows per item (beams), each item's memory, keys and mask once: the rows
            # of the same step with the memory copied per row
            R = 3
            rows = {name: np.repeat(value, R, axis=0) if value.ndim else value
                    for name, value in feeds.items()}  # fmt: skip
            rows["y_prev"] = rng.integers(1, len(TARGET_VOCABULARY), size=B * R)
            per_row = decoder.run(None, rows)
            per_item = decoder.run(None, {**rows, **{n: feeds[n] for n in MEMORY_NAMES}})
            for got, want in zip(per_item, per_row, strict=True):
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    assert {p.key: p.value for p in onnx.load(directory / "decoder_step.onnx").metadata_props}[
        ITEM_MEMORY_KEY
    ] == "1"

    # no rows: empty outputs, not a Reshape whose -1 is undefined for 0 elements
    src, lengths = np.zeros((0, 5), np.int64), np.zeros(0, np.int64)
    encoded = encoder.run(None, {"src": src, "src_lengths": lengths})
    feeds = dict(zip(manifest.encoder_outputs(), encoded, strict=True))
    feeds |= {"y_prev": np.zeros(0, np.int64), "temperature": np.array(1.0, np.float32)}
    stepped = decoder.run(None, feeds | {"position": np.array(0, np.int64)})
    assert stepped[0].shape == (0, len(TARGET_VOCABULARY)) and stepped[-1].shape == (0, 5)
    assert all(state.shape[0] == 0 for state in stepped[1:-1])


def test_manifest_records_the_model_and_checksums(tmp_path):
    module = make_module(decoder="luong", attention="local-m", scorer="general", cell="lstm")
    directory = export(
        module,
        tmp_path / "model",
        output_kind="tokens",
        beam_size=3,
        length_penalty=0.5,
        temperature=0.8,
        max_source_length=50,
        max_output_length=12,
    )
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    assert manifest["model"] == module.config.to_dict()
    assert manifest["source_vocabulary"] == SOURCE_VOCABULARY
    assert manifest["target_vocabulary"] == TARGET_VOCABULARY
    assert manifest["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert (manifest["decoder"], manifest["attention"], manifest["scorer"]) == (
        "luong",
        "local-m",
        "general",
    )
    assert manifest["cell"] == "lstm" and manifest["input_feeding"] is True
    assert manifest["state_names"] == ["hidden", "cell", "feed"]
    assert manifest["limits"] == {"max_source_length": 50, "max_output_length": 12}
    assert (manifest["beam_size"], manifest["length_penalty"], manifest["temperature"]) == (
        3,
        0.5,
        0.8,
    )
    assert manifest["output_kind"] == "tokens" and manifest["tokenizer"] == "char"
    assert manifest["files"] == {
        name: sha256_file(directory / name)
        for name in ("encoder.onnx", "decoder_step.onnx", "decode.onnx")
    }
    read = read_artifact(directory).manifest
    assert read.to_dict() == manifest
    assert Manifest.from_json(read.to_json()) == read


@pytest.mark.parametrize(
    ("kind", "feeds"),
    [
        (dict(decoder="luong"), True),
        (dict(decoder="luong", input_feeding=False), False),
        (dict(decoder="bahdanau"), False),  # takes input_feeding=True, its default, and ignores it
    ],
)
def test_manifest_says_whether_the_model_feeds_its_input(tmp_path, kind, feeds):
    module = make_module(**kind)
    assert module.config.input_feeding is kind.get("input_feeding", True)
    manifest = read_artifact(export(module, tmp_path / "model")).manifest
    assert manifest.input_feeding is feeds


def test_export_leaves_the_module_untouched(tmp_path):
    module = make_module()
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    export(module, tmp_path / "model")
    assert module.training
    after = module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("training", [False, True])
def test_a_model_with_dropout_exports_its_eval_mode(training, tmp_path):
    # torch.onnx.export restores the traced wrapper's mode afterwards; a wrapper left in training
    # mode used to switch dropout on in the model being verified, and every export with
    # dropout > 0 failed its own verification.
    module = make_module(dropout=0.5, num_layers=2, decoder="luong", scorer="general")
    module.train(training)
    export(module, tmp_path / "model")
    encoder, _ = sessions(tmp_path / "model")
    src = torch.tensor([[4, 5, 6, 2], [7, 2, 0, 0]])
    lengths = torch.tensor([4, 2])
    got = encoder.run(["memory"], {"src": src.numpy(), "src_lengths": lengths.numpy()})[0]
    with torch.no_grad():
        want = module.eval().encode(src, lengths)[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_reexport_overwrites_a_previous_artifact(tmp_path):
    export(make_module(seed=0), tmp_path / "model")
    first = sha256_file(tmp_path / "model" / "encoder.onnx")
    export(make_module(seed=1), tmp_path / "model")
    assert sha256_file(tmp_path / "model" / "encoder.onnx") != first
    read_artifact(tmp_path / "model")  # checksums match the new files


@pytest.mark.parametrize(
    ("stage", "call", "error"),
    [
        ("save", 2, OSError(28, "No space left on device")),  # writing the second graph
        ("replace", 2, KeyboardInterrupt()),  # the swap: moving the previous files out
        ("replace", 6, KeyboardInterrupt()),  # the swap: moving the new ones in
    ],
)
def test_a_failed_reexport_leaves_the_previous_artifact_as_it_was(
    stage, call, error, tmp_path, monkeypatch
):
    """The export deleted the manifest and overwrote graphs in place before the last one was
    written: an error (a full disk, Ctrl-C) there lost the working artifact."""
    import skattn.artifact_writer

    export(make_module(seed=0), tmp_path / "model")
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    target = (onnx, "save_model") if stage == "save" else (skattn.artifact_writer.os, "replace")
    original = getattr(*target)
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(*target, failing)
    with pytest.raises(type(error)):
        export(make_module(seed=1), tmp_path / "model")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before
    read_artifact(tmp_path / "model")
    export(make_module(seed=1), tmp_path / "model")  # and a re-export then succeeds
    assert sha256_file(tmp_path / "model" / "encoder.onnx") != sha256_file_of(before)


def _failing_after(target, call: int, error: BaseException, monkeypatch, also: int = 0):
    """Make ``target`` (module, name) raise ``error`` at its ``call``-th call (and ``also``-th)."""
    original = getattr(*target)
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        if len(calls) in (call, also):
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(*target, failing)


def test_a_previous_artifact_a_cut_swap_could_not_put_back_is_restored_by_the_next_export(
    tmp_path, monkeypatch
):
    """A second Ctrl-C during the roll-back (or a kill during the swap) left the previous
    files in the staging folder, which was then deleted with them."""
    import skattn.artifact_writer

    export(make_module(seed=0), tmp_path / "model")
    before = {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()}
    # the swap's 6th rename (moving the new files in) and the first restore both interrupted
    _failing_after(
        (skattn.artifact_writer.os, "replace"), 6, KeyboardInterrupt(), monkeypatch, also=7
    )
    with pytest.raises(KeyboardInterrupt):
        export(make_module(seed=1), tmp_path / "model")
    monkeypatch.undo()
    assert not (tmp_path / "model" / "manifest.json").exists()  # cut short
    # the next export puts the previous artifact back before anything, even if it then fails
    _failing_after((onnx, "save_model"), 1, OSError(28, "No space left"), monkeypatch)
    with pytest.raises(OSError):
        export(make_module(seed=2), tmp_path / "model")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (tmp_path / "model").iterdir()} == before


def test_an_export_where_flock_is_not_supported_goes_on_unlocked(tmp_path, monkeypatch):
    """NFS and Lustre answer flock with ENOLCK or ENOSYS: every export failed."""
    import errno
    import fcntl

    def unsupported(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", unsupported)
    export(make_module(), tmp_path / "model")
    read_artifact(tmp_path / "model")


def test_another_users_staging_folder_is_left_alone(tmp_path, monkeypatch):
    """Opening a staging folder another user made (mode 0700) failed every export."""
    import skattn.artifact_writer

    other = tmp_path / "model" / ".skattn-export-other"
    other.mkdir(parents=True)
    opened = skattn.artifact_writer.os.open

    def refusing(path, *args, **kwargs):
        if Path(path) == other:
            raise PermissionError(13, "Permission denied")
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(skattn.artifact_writer.os, "open", refusing)
    export(make_module(), tmp_path / "model")
    read_artifact(tmp_path / "model")
    assert other.exists()


def test_a_staging_folder_a_killed_export_left_is_removed_by_the_next(tmp_path):
    stale = tmp_path / "model" / ".skattn-export-killed"
    stale.mkdir(parents=True)
    (stale / "encoder.onnx").write_bytes(b"half")
    export(make_module(), tmp_path / "model")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        "decode.onnx", "decoder_step.onnx", "encoder.onnx", "manifest.json",
    ]  # fmt: skip


def sha256_file_of(files: dict) -> str:
    import hashlib

    return hashlib.sha256(files["encoder.onnx"]).hexdigest()


@pytest.mark.slow  # two processes each import torch: about 10 s
def test_concurrent_exports_to_one_path_leave_one_whole_artifact(tmp_path):
    """Two exports at once mixed their files (each moved its graphs in, then wrote checksums of
    whatever was there): both returned, and the folder did not load. (torch.onnx's export is
    one at a time in a process: these are two processes.)"""
    import subprocess
    import sys

    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[3]); import test_export as t; "
        "t.export(t.make_module(seed=int(sys.argv[1])), sys.argv[2])"
    )
    tests = str(Path(__file__).parent)
    digests = []
    for seed in (0, 1):  # each model's graphs, exported alone
        export(make_module(seed=seed), tmp_path / f"alone{seed}")
        digests.append(sha256_file(tmp_path / f"alone{seed}" / "encoder.onnx"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for trial in range(2):
        target = tmp_path / f"shared{trial}"
        runs = [
            subprocess.Popen([sys.executable, "-c", script, str(seed), str(target), tests], env=env)
            for seed in (0, 1)
        ]
        assert [run.wait(timeout=300) for run in runs] == [0, 0]
        read_artifact(target)  # checksums and bindings of one export
        assert sha256_file(target / "encoder.onnx") in digests
        assert [p.name for p in target.iterdir() if p.name.startswith(".")] == []


def test_export_refuses_a_directory_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="path"):
        export(make_module(), tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="path"):
        export(make_module(), tmp_path / "file")


@pytest.mark.parametrize("path", [123, None, b"model"])
def test_export_refuses_a_path_that_is_not_a_str_or_path_like(path, fitted_reversal):
    with pytest.raises(ValueError, match="path must be a str or os.PathLike"):
        fitted_reversal.export_onnx(path)
    with pytest.raises(ValueError, match="path must be a str or os.PathLike"):
        Seq2SeqEnsemble.from_fitted([fitted_reversal]).export_onnx(path)


class PositionAsConstant(Seq2SeqModule):
    """A step that reads ``position`` as a Python float: tracing bakes it into the graph."""

    def step(self, y_prev, state, memory, keys, mask, temperature, position):
        log_probs, state, weights = super().step(
            y_prev, state, memory, keys, mask, temperature, position
        )
        return log_probs + 0.01 * float(position), state, weights


def test_export_detects_a_graph_that_differs_from_torch(tmp_path):
    torch.manual_seed(0)
    module = PositionAsConstant(
        ModelConfig(len(SOURCE_VOCABULARY), len(TARGET_VOCABULARY), hidden_size=8)
    )
    with pytest.raises(RuntimeError, match="decoder_step.onnx.*log_probs"):
        export(module.eval(), tmp_path / "model")
    assert not (tmp_path / "model" / "manifest.json").exists()


def test_export_onnx_needs_a_fitted_estimator(tmp_path):
    with pytest.raises(ValueError, match="fitted"):
        export_onnx(Seq2Seq(), tmp_path / "model")


@pytest.mark.parametrize(
    "tokenizer, sources, bad",
    [("char", [["one", "two"], ["two"]], "one"), ("space", [["a b", "c"], ["c"]], "a b")],
)
def test_export_refuses_source_tokens_that_strings_cannot_give(tokenizer, sources, bad, tmp_path):
    # The runtime splits source strings with the tokenizer: word tokens under "char" (or tokens
    # with a space under "space") could never be looked up, and every answer would be wrong.
    model = Seq2Seq(tokenizer=tokenizer, max_steps=1, early_stopping=False, hidden_size=8,
                    embedding_dim=4, device="cpu", random_state=0)  # fmt: skip
    model.fit(sources * 4, [["x"], ["y"]] * 4)
    with pytest.raises(ValueError, match=f"source token {bad!r}.*tokenizer={tokenizer!r}"):
        export_onnx(model, tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_token_list_sources_that_the_space_tokenizer_splits_export_and_serve(tmp_path):
    sources = [["one", "two"], ["two", "one", "one"], ["two"]] * 4
    model = Seq2Seq(tokenizer="space", max_steps=3, early_stopping=False, hidden_size=8,
                    embedding_dim=4, device="cpu", random_state=0)  # fmt: skip
    model.fit(sources, [list(reversed(s)) for s in sources])
    runtime = serving.load(export_onnx(model, tmp_path / "model"))
    assert runtime.predict(["one two", "two"]) == model.predict([["one", "two"], ["two"]])


@pytest.mark.parametrize("scorer", ["dot", "general", "scaled_dot"])
def test_a_single_head_dot_score_exports_as_a_matrix_product_not_an_einsum(scorer, tmp_path):
    """``q . k_j`` of one head is ``q keys^T``: an ONNX ``MatMul`` (onnxruntime folds the
    transpose into it), not the ``Einsum`` that onnxruntime ran 4x slower in a decoder step."""
    export(make_module(decoder="luong", scorer=scorer), tmp_path / "model")
    step = onnx.load(tmp_path / "model" / "decoder_step.onnx")
    ops = {node.op_type for node in step.graph.node}
    assert "Einsum" not in ops and "MatMul" in ops


def _float_constants(graph: onnx.GraphProto):
    """Every float tensor a graph (or a subgraph of it) holds as an initializer or Constant."""
    for tensor in graph.initializer:
        yield onnx.numpy_helper.to_array(tensor)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield onnx.numpy_helper.to_array(attribute.t)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                yield from _float_constants(attribute.g)


@pytest.mark.parametrize(
    "kind",
    [
        dict(decoder="bahdanau", attention="global", scorer="additive"),
        dict(encoder="transformer", decoder="transformer", num_heads=2),
    ],
    ids=kind_id,
)
def test_exported_graphs_never_mask_with_minus_infinity(kind, tmp_path):
    """Padding enters no softmax as -inf: onnxruntime's Exp and Softmax run 10-20x slower on
    exponents below -87 (``skattn.attention.softmax.EXP_FLOOR``). The Transformer's attention
    is written out in the export (``F.scaled_dot_product_attention`` would mask with -inf)."""
    torch.manual_seed(0)
    sizes = dict(hidden_size=8) if "encoder" in kind else dict(embedding_dim=6, hidden_size=8)
    config = ModelConfig(len(SOURCE_VOCABULARY), len(TARGET_VOCABULARY), **sizes, **kind)
    directory = export(Seq2SeqModule(config).eval(), tmp_path / "model")
    for name in ("encoder.onnx", "decoder_step.onnx"):
        graph = onnx.load(directory / name).graph
        for value in _float_constants(graph):
            if value.dtype.kind == "f":
                assert not np.any(np.isneginf(value)), name
        assert "Softmax" not in {node.op_type for node in graph.node}, name


def test_max_source_length_sets_what_the_runtime_accepts(fitted_reversal, tmp_path):
    long = ["1234567890" * 150]  # 1,500 tokens: past the default guard of 1,024
    default = serving.load(fitted_reversal.export_onnx(tmp_path / "default"), device="cpu")
    assert default.info.max_source_length == 1024
    with pytest.raises(ValueError, match="max_source_length"):
        default.predict(long)
    raised = fitted_reversal.export_onnx(tmp_path / "raised", max_source_length=2000)
    runtime = serving.load(raised, device="cpu")
    assert runtime.info.max_source_length == 2000
    assert runtime.predict(long) == fitted_reversal.predict(long)  # as the estimator does
    for bad in (0, 65537, True, 1.5, "2000"):
        with pytest.raises(ValueError, match="max_source_length"):
            fitted_reversal.export_onnx(tmp_path / "bad", max_source_length=bad)
    from skattn import Seq2SeqEnsemble

    ensemble = Seq2SeqEnsemble.from_fitted([fitted_reversal, fitted_reversal])
    directory = ensemble.export_onnx(tmp_path / "ensemble", max_source_length=3000)
    assert serving.load(directory, device="cpu").info.max_source_length == 3000


_EMPTY_BATCH = r"""
import sys, numpy as np, onnxruntime as ort
directory, T = sys.argv[1], 4
def session(name):
    return ort.InferenceSession(f"{directory}/{name}", providers=["CPUExecutionProvider"])
feeds = {"src": np.zeros((0, T), np.int64), "src_lengths": np.zeros(0, np.int64)}
print([o.shape for o in session("encoder.onnx").run(None, feeds)][0])
feeds.update(max_length=np.array(5, np.int64), temperature=np.array(1.0, np.float32))
print([o.shape for o in session("decode.onnx").run(None, feeds)])
"""


@pytest.mark.parametrize(
    "kind",
    [
        dict(cell="gru"),
        dict(cell="lstm"),
        dict(cell="gru", beam_size=3),
        dict(encoder="transformer", decoder="transformer", num_heads=4, num_kv_heads=2),
        dict(encoder="transformer", decoder="luong", num_heads=2, beam_size=3),
    ],
)
def test_an_empty_batch_never_ends_the_process_that_runs_the_graphs(kind, tmp_path):
    """onnxruntime's fused GRU / LSTM kernels call std::terminate on a batch of 0 rows: the
    encoder's cells are guarded, and neither search runs a segment for no rows. The
    Transformer's heads were merged by a Reshape to (B, T, -1), which fails for B = 0."""
    import subprocess
    import sys

    X = ["ab", "abc", "ba", "cab"] * 10
    model = Seq2Seq(hidden_size=16, max_steps=2, device="cpu", **kind)
    directory = model.fit(X, [x[::-1] for x in X]).export_onnx(tmp_path / "model")
    graph = onnx.load(directory / "encoder.onnx").graph
    assert not any(node.op_type in ("GRU", "LSTM") for node in graph.node)  # each in an If
    run = subprocess.run(
        [sys.executable, "-c", _EMPTY_BATCH, str(directory)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[:2] == ["(0, 4, 16)", "[(0, 0), (0,), (0, 0, 4), (0,)]"]
    runtime = serving.load(directory, "cpu")
    assert runtime.predict(X[:3]) == model.predict(X[:3])  # the guard changes no answer


def test_the_default_source_limit_is_capped_at_what_an_artifact_carries(fitted_reversal, tmp_path):
    """A model fitted on a source longer than 65,536 tokens failed to export with the defaults
    (the manifest refused the limit export_onnx chose itself)."""
    import copy

    model = copy.deepcopy(fitted_reversal)
    model.max_source_length_ = 70_000  # as a fit on such a source leaves it
    directory = model.export_onnx(tmp_path / "model")
    assert read_artifact(directory).manifest.max_source_length == 65_536


def test_an_unknown_output_order_is_refused_before_tracing(fitted_reversal, tmp_path):
    with pytest.raises(ValueError, match=r"output_order must be one of \['left_to_right'"):
        fitted_reversal.export_onnx(tmp_path / "m", output_order="upside_down")
    assert not (tmp_path / "m").exists()
