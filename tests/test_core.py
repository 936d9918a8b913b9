"""skattn.core: the inference layer, the Manifest and the shared checks, with no model at all.

The backend here is a NumPy "reverser": its encoder keeps the source ids, and each step emits
the source token ``T - 1 - i`` (then EOS) with one-hot attention on it. Its answers are known,
so the Translator's chunking, ordering, formatting and attention rows can be checked exactly.
"""

import contextlib
import json
import subprocess
import sys

import numpy as np
import pytest

from skattn.core import checks
from skattn.core.inference import SearchSettings, Translator, as_text
from skattn.core.manifest import (
    BASE_FORMAT_VERSION,
    FORMAT_VERSION,
    MAX_BEAM_SIZE,
    ArtifactError,
    Manifest,
)
from skattn.core.text import EOS, Vocabulary

SOURCE = Vocabulary("abcdefg")
TARGET = Vocabulary("abcdefg")


class ReverserBackend:
    """Reverses the source: step ``i`` emits the token at ``length - 2 - i`` (before EOS)."""

    def __init__(self):
        self.batches: list[int] = []

    def encode(self, src, src_lengths):
        self.batches.append(len(src))
        return {"src": src, "lengths": src_lengths}

    def step(self, y_prev, carry, position, temperature):
        src, lengths = carry["src"], carry["lengths"]  # (N, T), (N,)
        n, T = src.shape
        index = lengths - 2 - position  # the source position to copy; < 0: time for EOS
        token = np.where(index >= 0, src[np.arange(n), np.maximum(index, 0)], EOS)
        log_probs = np.full((n, len(TARGET)), -np.inf)  # one way on: beams agree with greedy
        log_probs[np.arange(n), token] = 0.0  # source and target ids coincide
        weights = np.zeros((n, T), dtype=np.float32)
        weights[np.arange(n), np.where(index >= 0, index, lengths - 1)] = 1.0
        return log_probs, carry, weights

    @staticmethod
    def select(carry, rows):
        return {name: value[rows] for name, value in carry.items()}


def translator(max_batch_size=256, output_kind="str", tokenizer="char"):
    return Translator(ReverserBackend(), SOURCE, TARGET, tokenizer, output_kind, max_batch_size)


SOURCES = ["abc", "", "gfedcba", "a", "ba", "cccc", "defg"] * 5


@pytest.mark.parametrize("beam_size", [1, 3])
def test_translate_restores_the_input_order_whatever_the_chunking(beam_size):
    settings = SearchSettings(beam_size=beam_size, max_length=20)
    tokens = [list(s) for s in SOURCES]
    whole, whole_maps = translator().translate(tokens, settings, with_attention=True)
    assert whole == [s[::-1] for s in SOURCES]
    chunked = translator(max_batch_size=4)
    parts, part_maps = chunked.translate(tokens, settings, with_attention=True)
    assert parts == whole
    assert chunked.backend.batches == [4] * 8 + [3]  # length-sorted chunks of at most 4
    for source, full, part in zip(SOURCES, whole_maps, part_maps, strict=True):
        # One row per output token, one column per source token plus the end marker.
        assert full.shape == (len(source), len(source) + 1) and full.dtype == np.float64
        np.testing.assert_array_equal(full, part)
        np.testing.assert_array_equal(full.argmax(axis=1), np.arange(len(source))[::-1])


def test_output_kinds_and_text():
    tokens = [list("abc")]
    settings = SearchSettings()
    assert translator(output_kind="tokens").translate(tokens, settings)[0] == [["c", "b", "a"]]
    assert translator(output_kind="str", tokenizer="space").translate(tokens, settings)[0] == [
        "c b a"
    ]
    assert as_text(["HH", "AH0"]) == "HH AH0" and as_text("abc") == "abc"


def test_source_ids_end_with_the_marker_and_unknowns_map_to_unk():
    ids = translator().source_ids([list("az"), []])
    assert ids == [[SOURCE.token_to_id("a"), 3, EOS], [EOS]]


def test_max_length_cuts_the_output():
    out, maps = translator().translate(
        [list("abcdef")], SearchSettings(max_length=2), with_attention=True
    )
    assert out == ["fe"] and maps[0].shape == (2, 7)


@pytest.mark.parametrize(
    "field, value",
    [
        ("beam_size", 0), ("max_length", 0), ("length_penalty", -1.0),
        ("length_penalty", 10.5), ("length_penalty", 1e4), ("temperature", 0.0),
    ],
)  # fmt: skip
def test_search_settings_are_validated(field, value):
    name = "max_output_length" if field == "max_length" else field
    with pytest.raises(ValueError, match=name):
        SearchSettings(**{field: value})


# -- Manifest -----------------------------------------------------------------------------------


def manifest(**changes):
    fields = dict(
        tokenizer="char",
        source_vocabulary=tuple(SOURCE.to_list()),
        target_vocabulary=tuple(TARGET.to_list()),
        decoder="luong",
        attention="global",
        scorer="dot",
        cell="gru",
        input_feeding=True,
        state_names=("hidden", "feed"),
        max_source_length=100,
        max_output_length=30,
        beam_size=2,
        length_penalty=0.5,
        temperature=1.0,
        output_kind="str",
        files={"encoder.onnx": "0" * 64, "decoder_step.onnx": "1" * 64},
        model={"hidden_size": 8},
    )
    return Manifest(**{**fields, **changes})


def test_manifest_round_trips_through_json():
    m = manifest()
    data = json.loads(m.to_json())
    assert data["format_version"] == BASE_FORMAT_VERSION == FORMAT_VERSION - 1  # left to right
    assert data["limits"] == {"max_source_length": 100, "max_output_length": 30}
    assert data["special_ids"] == {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
    assert Manifest.from_json(m.to_json()) == m


def test_manifest_names_the_graph_signatures():
    m = manifest()
    assert m.encoder_inputs() == ["src", "src_lengths"]
    assert m.encoder_outputs() == ["memory", "keys", "mask", "hidden", "feed"]
    assert m.decoder_inputs() == [
        "y_prev", "hidden", "feed", "memory", "keys", "mask", "temperature", "position"
    ]  # fmt: skip
    assert m.decoder_outputs() == ["log_probs", "new_hidden", "new_feed", "weights"]


def test_the_binding_covers_vocabularies_state_and_model():
    base = manifest().binding
    swapped = list(TARGET.to_list())
    swapped[4], swapped[5] = swapped[5], swapped[4]
    assert manifest(target_vocabulary=tuple(swapped)).binding != base
    assert manifest(model={"hidden_size": 9}).binding != base
    assert manifest(state_names=("hidden",)).binding != base
    assert manifest(beam_size=5).binding == base  # decoding settings may change


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("beam_size", MAX_BEAM_SIZE + 1, "beam_size"),
        ("beam_size", True, "beam_size"),
        ("length_penalty", 1e4, r"length_penalty.*<= 10"),
        ("tokenizer", "bpe", "tokenizer"),
        ("temperature", 0, "temperature"),
        ("state_names", ["not an identifier"], "state_names"),
        ("files", {"other.onnx": "x"}, "files"),
        ("binding", "0" * 64, "edited after export"),
        ("format_version", FORMAT_VERSION + 1, "newer"),
        ("format_version", 0, "format_version"),
    ],
)
def test_manifest_values_are_checked_naming_the_file(key, value, message):
    data = {**manifest().to_dict(), key: value}
    with pytest.raises(ArtifactError, match=rf"where\.json.*{message}"):
        Manifest.from_dict(data, "where.json")


def _with_target_token(token: str, ensure_ascii: bool) -> str:
    data = manifest().to_dict()
    data["target_vocabulary"] = [*data["target_vocabulary"], token]
    with contextlib.suppress(UnicodeEncodeError):  # a lone surrogate has no binding
        data["binding"] = manifest(target_vocabulary=tuple(data["target_vocabulary"])).binding
    return json.dumps(data, ensure_ascii=ensure_ascii)


@pytest.mark.parametrize(
    "text",
    [
        _with_target_token("\ud800", ensure_ascii=True),  # the escape "\\ud800"
        _with_target_token("\udfff", ensure_ascii=True).replace("\\udfff", "\\uDFFF"),
        _with_target_token("x", ensure_ascii=False).replace('"x"', '"\ud800"'),  # the text's own
    ],
    ids=["escape", "upper-case escape", "in the text"],
)
def test_a_manifest_text_with_a_lone_surrogate_is_an_artifact_error(text):
    with pytest.raises(ArtifactError, match=r"where\.json: holds a string that is not valid"):
        Manifest.from_json(text, "where.json")


def test_a_manifest_in_bytes_reads_and_its_lone_surrogate_is_still_refused():
    assert Manifest.from_json(manifest().to_json().encode()) == manifest()
    text = _with_target_token("\ud800", ensure_ascii=True).encode()
    with pytest.raises(ArtifactError, match="not valid Unicode"):
        Manifest.from_json(text)


@pytest.mark.parametrize(
    "token", ["\U0001f600", "\\ud800"], ids=["a surrogate pair", "an escaped backslash"]
)
def test_a_manifest_text_with_surrogate_pairs_or_backslashes_reads(token):
    for ensure_ascii in (True, False):  # as "\\ud83d\\ude00" and as the character
        text = _with_target_token(token, ensure_ascii)
        assert Manifest.from_json(text).target_vocabulary[-1] == token


def test_a_format_1_manifest_reads_without_model_or_binding():
    data = manifest().to_dict()
    del data["model"], data["binding"]
    m = Manifest.from_dict({**data, "format_version": 1})
    assert m.format_version == 1 and m.model == {}


# -- checks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True, None])
def test_check_int_refuses_and_names_the_parameter(value):
    with pytest.raises(ValueError, match="max_queue must be an int >= 1"):
        checks.check_int(value, "max_queue")


def test_check_int_accepts_numpy_integers_as_python_ints():
    value = checks.check_int(np.int64(4), "window")
    assert value == 4 and type(value) is int
    assert checks.check_int(None, "max_steps", none_ok=True) is None
    with pytest.raises(ValueError, match=r"in \[1, 3\]"):
        checks.check_int(4, "k", 1, 3)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.1, True, "0.5"])
def test_check_real_refuses_non_finite_and_out_of_range(value):
    with pytest.raises(ValueError, match="dropout"):
        checks.check_real(value, "dropout", 0.0, 1.0, high_open=True)


@pytest.mark.parametrize(
    "device, parsed", [("auto", ("auto", None)), ("cpu", ("cpu", None)), ("cuda:2", ("cuda", 2))]
)
def test_parse_device(device, parsed):
    assert checks.parse_device(device) == parsed


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CPU", 0, None])
def test_bad_devices_are_named(device):
    with pytest.raises(ValueError, match="device must be"):
        checks.parse_device(device)


def test_usable_cores_follows_the_affinity_mask_and_the_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(checks.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert checks.usable_cores(tmp_path / "no-cgroup") == 4
    (tmp_path / "cpu.max").write_text("max 100000\n")  # cgroup v2, no quota
    assert checks.usable_cores(tmp_path) == 4
    (tmp_path / "cpu.max").write_text("200000 100000\n")  # two cores' worth
    assert checks.usable_cores(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a core: still one thread
    assert checks.usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()  # cgroup v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert checks.usable_cores(tmp_path) == 3


def test_a_quota_on_the_processs_own_cgroup_or_an_ancestor_bounds_it(tmp_path):
    membership = tmp_path / "self-cgroup"
    root = tmp_path / "fs"
    leaf = root / "system.slice" / "job.service"  # cgroup v2: a systemd CPUQuota= on the slice
    leaf.mkdir(parents=True)
    membership.write_text("0::/system.slice/job.service\n")
    assert checks._cgroup_quota(root, membership) is None
    (leaf / "cpu.max").write_text("max 100000\n")
    (root / "system.slice" / "cpu.max").write_text("150000 100000\n")
    assert checks._cgroup_quota(root, membership) == 1.5
    (leaf / "cpu.max").write_text("50000 100000\n")  # the tighter one counts
    assert checks._cgroup_quota(root, membership) == 0.5
    membership.write_text("0::/elsewhere\n")  # not under the mount: the root alone
    assert checks._cgroup_quota(root, membership) is None
    membership.write_text("0::/../system.slice\n")  # above this namespace's root: the root
    assert checks._cgroup_quota(root, membership) is None
    v1 = root / "cpu" / "review"  # cgroup v1, the cpu controller's own hierarchy
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    membership.write_text("4:memory:/x\n1:cpu,cpuacct:/review\n0::/\n")
    assert checks._cgroup_quota(root, membership) == 1.0


def test_the_core_imports_neither_half():
    code = (
        "import sys, skattn.core.inference, skattn.core.manifest, skattn.core.checks; "
        "print(sorted(m for m in ('torch', 'sklearn', 'serving', 'skattn.estimator', "
        "'skattn.models', 'onnxruntime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_docstring_examples():
    import doctest

    result = doctest.testmod(checks)
    assert result.attempted > 0 and result.failed == 0
