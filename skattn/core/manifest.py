"""The artifact contract: what ``manifest.json`` holds, the graphs' names, and their checks.

An artifact is a directory that ``Seq2Seq.export_onnx`` writes and ``serving.load`` reads::

    model_dir/
      manifest.json      a Manifest (below), as JSON
      encoder.onnx       src (B, T) int64, src_lengths (B,) int64
                         -> memory, keys, mask, <state_names...>
      decoder_step.onnx  y_prev (B,) int64, <state_names...>, memory, keys, mask,
                         temperature () float32, position () int64
                         -> log_probs (B, V), <new_ + state_names...>, weights (B, T)
      decode.onnx        (optional) the whole search, the manifest's beam_size:
                         src (B, T) int64, src_lengths (B,) int64, max_length () int64,
                         temperature () float32
                         -> tokens (B, L) int64, lengths (B,) int64, attention (B, L, T),
                            scores (B,) float32
      attention.onnx     (optional, Transformer decoder) every layer's and head's maps:
                         src (B, T) int64, src_lengths (B,) int64, tokens (B, L) int64,
                         temperature () float32 -> weights (B, layers, heads, L, T) float32

:class:`Manifest` is the one record both halves share: the exporter builds it and calls
:meth:`Manifest.to_json`; the server calls :meth:`Manifest.from_json`, which validates every
field and raises :class:`ArtifactError` naming the file. The graph input and output names are
methods of the record, so the writer and the reader cannot disagree about them.

Format versions: 1 (the first); 2 adds ``model`` (the model's hyperparameters) and ``binding``
(a digest of the vocabularies and the model, also stored in each graph's metadata, so that a
manifest whose vocabulary was edited, or a graph from another model, is refused at load), and
later ``export_id`` (a digest of the weights, counted in the binding when present, so that the
graphs of two models of one configuration cannot be mixed either). Version 3 adds
``output_order`` and is written only for a model that writes its outputs right to left, so that
a reader from before it refuses such an artifact rather than serve its outputs backwards; every
other artifact is written as version 2. Version 1 artifacts still load, without the binding
check, and graphs that carry a binding are refused beside a version-1 manifest.
``decode.onnx``'s metadata also holds its search (``SEARCH_KEY``), checked against the
manifest's ``beam_size`` and ``length_penalty``. ``decode.onnx`` and ``attention.onnx``
are optional in both versions: an artifact that lists one in ``files`` has its checksum and
(format 2) binding checked like the step graphs'; one without it still loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from skattn.core.checks import FLOAT32_MAX
from skattn.core.items import encodes_to_utf8
from skattn.core.text import SPECIAL_TOKENS, TOKENIZERS

__all__ = [
    "ATTENTION_FILE",
    "BINDING_KEY",
    "DECODER_FILE",
    "DECODE_FILE",
    "ENCODER_FILE",
    "BASE_FORMAT_VERSION",
    "FORMAT_VERSION",
    "GRAPH_FILES",
    "ITEM_MEMORY_KEY",
    "MANIFEST_FILE",
    "MEMORY_NAMES",
    "OPTIONAL_GRAPH_FILES",
    "OUTPUT_ORDERS",
    "CPU_ONLY_QUANTIZATIONS",
    "QUANTIZATIONS",
    "SEARCH_KEY",
    "TEXT_KEY",
    "STAGING_PREFIX",
    "ArtifactError",
    "Manifest",
    "binding_digest",
    "format_version_for",
    "sha256_file",
]

#: The newest manifest format this code reads (and writes for a right-to-left model).
FORMAT_VERSION = 3
#: The format every other artifact is written in, which readers from before version 3 read.
BASE_FORMAT_VERSION = 2
#: The encoder's outputs that the decoder step reads, each ``(B, T, ...)``: the source axis 1.
MEMORY_NAMES = ("memory", "keys", "mask")
MANIFEST_FILE = "manifest.json"
#: The hidden folders an export stages its files in, inside the artifact's: never part of it.
STAGING_PREFIX = ".skattn-export-"
ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder_step.onnx"
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE)
#: The whole search in one graph (optional: artifacts written before it still load).
DECODE_FILE = "decode.onnx"
#: Every layer's and head's cross-attention maps of the Transformer decoder (optional too).
ATTENTION_FILE = "attention.onnx"
OPTIONAL_GRAPH_FILES = (DECODE_FILE, ATTENTION_FILE)
HEX_DIGITS = frozenset("0123456789abcdef")

#: The key of the graphs' ``metadata_props`` entry that holds :attr:`Manifest.binding`.
BINDING_KEY = "skattn.binding"
#: The key of ``decode.onnx``'s entry that holds its search (:meth:`Manifest.search`, JSON).
SEARCH_KEY = "skattn.search"
#: The key of every graph's entry that holds how its text is read and written
#: (:meth:`Manifest.text_form`, JSON): outside the binding, which artifacts written before it
#: keep; graphs written without it are not checked.
TEXT_KEY = "skattn.text"
#: The key of ``decoder_step.onnx``'s entry (``"1"``) saying that the step reads ``memory``,
#: ``keys`` and ``mask`` with one row per item, whatever ``R >= 1`` rows of ``y_prev`` and the
#: state each item has (item-major): beam search then carries one copy of an item's memory, not
#: one per beam. Graphs written without it read one memory row per row.
ITEM_MEMORY_KEY = "skattn.item_memory"

SPECIAL_IDS = {"pad": 0, "bos": 1, "eos": 2, "unk": 3}
OUTPUT_KINDS = ("str", "tokens")
#: How the graphs write an output: from its first token, or from its last (a model trained on
#: reversed outputs, ``skattn.right_to_left.RightToLeft``), which the runtime reads back.
OUTPUT_ORDERS = ("left_to_right", "right_to_left")
#: How the graphs' weights are stored besides float32: int8 products (:mod:`skattn.quantize`),
#: or float16 weights computed in float32 (:mod:`skattn.float16_weights`).
QUANTIZATIONS = ("int8", "float16")
#: The quantizations whose graphs run on the CPU only.
CPU_ONLY_QUANTIZATIONS = ("int8",)
#: Upper bounds a manifest may ask for: past them one request could hold the server for hours.
MAX_BEAM_SIZE = 64
MAX_OUTPUT_LENGTH = 4096
MAX_SOURCE_LENGTH = 65536
#: Beyond it ``length ** length_penalty`` overflows a float for long outputs (85 at 4,096
#: tokens), long before it ranks anything usefully (GNMT's ``alpha`` is 0.6-1).
MAX_LENGTH_PENALTY = 10.0


class ArtifactError(ValueError):
    """An artifact directory that cannot be served: missing, corrupt, or from a newer writer."""


@dataclass(frozen=True)
class Manifest:
    """Everything the graphs need around them, as ``manifest.json`` stores it.

    Attributes
    ----------
    tokenizer : {"char", "space"}
    source_vocabulary, target_vocabulary : tuple of str
        All tokens in id order, the specials ``<pad> <s> </s> <unk>`` first.
    decoder, attention, scorer, cell : str
        The model's kind (for clients and the explorer; the graphs compute it).
    input_feeding : bool
        Whether the decoder feeds its attentional vector back (Luong's input feeding; false for
        every other decoder, whatever the estimator's setting).
    state_names : tuple of str
        The decoder state tensors, in graph order.
    max_source_length, max_output_length : int
        Limits in tokens (EOS not counted).
    beam_size : int
        1 decodes greedily.
    length_penalty : float
        Beam hypotheses are ranked by ``sum(log p) / length ** length_penalty``.
    temperature : float
        The default attention softmax temperature.
    output_kind : {"str", "tokens"}
        What a prediction is.
    files : mapping of str to str
        Graph file name -> SHA-256 of its bytes (empty until :meth:`with_files`; an artifact
        must list both step graphs, and may list ``decode.onnx`` and ``attention.onnx``).
    model : mapping
        The model's hyperparameters (format 2; empty in format 1): ``ModelConfig.to_dict()``,
        or for an ensemble ``{"ensemble": [each member's], "combination": ...}``.
    format_version : int
    writer : mapping
        Who wrote it (``opset``, ``torch_version``); informative only.
    quantization : {"none", "int8", "float16"}
        ``"int8"``: the weight products are onnxruntime's ``MatMulIntegerToFloat`` with int8
        weights and fixed input ranges (:mod:`skattn.quantize`), which runs on the CPU only.
        ``"float16"``: the weights are stored in float16 and cast to float32 as the graph
        opens (:mod:`skattn.float16_weights`): half the bytes, float32 arithmetic, any device.
        Absent means ``"none"``.
    export_id : str
        SHA-256 of the exported weights (``""``: an artifact written before it existed), part
        of the binding: a graph of another model of the same configuration is refused too.
    output_order : {"left_to_right", "right_to_left"}
        ``"right_to_left"``: the graphs write each output from its last token to its first (a
        model trained on reversed outputs), and the runtime reverses what they write, so
        predictions, attention rows and scored outputs read in the usual order. Absent means
        ``"left_to_right"``; part of :meth:`text_form`; ``"right_to_left"`` needs format 3
        (:func:`format_version_for`).
    """

    tokenizer: str
    source_vocabulary: tuple[str, ...]
    target_vocabulary: tuple[str, ...]
    decoder: str
    attention: str
    scorer: str
    cell: str
    input_feeding: bool
    state_names: tuple[str, ...]
    max_source_length: int
    max_output_length: int
    beam_size: int
    length_penalty: float
    temperature: float
    output_kind: str
    files: Mapping[str, str] = field(default_factory=dict)
    model: Mapping[str, Any] = field(default_factory=dict)
    format_version: int = BASE_FORMAT_VERSION
    writer: Mapping[str, Any] = field(default_factory=dict)
    quantization: str = "none"
    export_id: str = ""
    output_order: str = "left_to_right"

    # -- graph names ------------------------------------------------------------------------

    @staticmethod
    def encoder_inputs() -> list[str]:
        """Inputs of ``encoder.onnx``, in order."""
        return ["src", "src_lengths"]

    def encoder_outputs(self) -> list[str]:
        """Outputs of ``encoder.onnx``: ``memory, keys, mask, <state_names...>``."""
        return [*MEMORY_NAMES, *self.state_names]

    def decoder_inputs(self) -> list[str]:
        """Inputs of ``decoder_step.onnx``, in order."""
        return ["y_prev", *self.state_names, *MEMORY_NAMES, "temperature", "position"]

    def decoder_outputs(self) -> list[str]:
        """Outputs of ``decoder_step.onnx``: ``log_probs, new_<state>..., weights``."""
        return ["log_probs", *(f"new_{name}" for name in self.state_names), "weights"]

    @staticmethod
    def decode_inputs() -> list[str]:
        """Inputs of ``decode.onnx``, in order."""
        return ["src", "src_lengths", "max_length", "temperature"]

    @staticmethod
    def decode_outputs() -> list[str]:
        """Outputs of ``decode.onnx``, in order."""
        return ["tokens", "lengths", "attention", "scores"]

    @staticmethod
    def attention_inputs() -> list[str]:
        """Inputs of ``attention.onnx``, in order."""
        return ["src", "src_lengths", "tokens", "temperature"]

    @staticmethod
    def attention_outputs() -> list[str]:
        """Outputs of ``attention.onnx``: ``weights (B, layers, heads, L, T)``."""
        return ["weights"]

    @property
    def step_reads_position(self) -> bool:
        """Whether ``decoder_step.onnx`` reads its ``position`` input: a Transformer decoder
        (positions and a key-value cache as long as the prefix) or local-m attention (centred
        on the position), in the model or in any ensemble member (read from ``model``; a
        format-1 manifest, without it, from ``decoder`` and ``attention``). Rows at different
        target positions then cannot share a step; the other models' steps ignore it."""
        configs = self.model.get("ensemble", [self.model]) if self.model else []
        if not configs:
            return "transformer" in self.decoder or "local-m" in self.attention
        return any(
            config.get("decoder") == "transformer" or config.get("attention") == "local-m"
            for config in configs
        )

    def carry_names(self) -> list[str]:
        """What the search carries between steps: the state, then the encoder's outputs."""
        return [*self.state_names, *MEMORY_NAMES]

    # -- the binding between the manifest and its graphs ------------------------------------

    @property
    def binding(self) -> str:
        """SHA-256 of what the graphs were built for: vocabularies, state names, the model,
        and its weights (``export_id``, when the manifest has one).

        Written into each graph's metadata at export; a graph whose binding differs was not
        exported with this manifest (an edited vocabulary, a graph from another model).
        """
        return binding_digest(
            self.source_vocabulary,
            self.target_vocabulary,
            self.state_names,
            self.model,
            self.export_id,
        )

    def text_form(self) -> dict[str, str]:
        """How the graphs' ids become text: ``{"tokenizer", "output_kind"}`` (and
        ``"output_order"`` when it is ``"right_to_left"``), also stored in their metadata
        (``TEXT_KEY``), since a manifest edited to another tokenizer, output kind or order would
        read and write other text with the same graphs (a reader older than the order refuses
        a right-to-left model's graphs rather than serve its outputs backwards)."""
        form = {"tokenizer": self.tokenizer, "output_kind": self.output_kind}
        if self.output_order != "left_to_right":
            form["output_order"] = self.output_order
        return form

    def search(self) -> dict[str, Any]:
        """The search ``decode.onnx`` runs: ``{"beam_size", "length_penalty"}``, also stored
        in its metadata (``SEARCH_KEY``), since the graph cannot search otherwise."""
        return {"beam_size": self.beam_size, "length_penalty": self.length_penalty}

    # -- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``manifest.json`` holds (version 1's layout, plus version 2's keys)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["source_vocabulary"] = list(self.source_vocabulary)
        data["target_vocabulary"] = list(self.target_vocabulary)
        data["state_names"] = list(self.state_names)
        data["special_ids"] = dict(SPECIAL_IDS)
        data["limits"] = {
            "max_source_length": data.pop("max_source_length"),
            "max_output_length": data.pop("max_output_length"),
        }
        data["files"] = dict(self.files)
        data["model"] = dict(self.model)
        if not self.export_id:  # written before export ids: the layout it was read from
            del data["export_id"]
        if self.output_order == "left_to_right":  # the layout before right-to-left models
            del data["output_order"]
        data["binding"] = self.binding
        writer = data.pop("writer")
        return {**data, **writer}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = MANIFEST_FILE) -> Manifest:
        """Parse and validate ``manifest.json``; :class:`ArtifactError` names ``where``."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as error:  # bad JSON, a number too long to convert
            raise ArtifactError(f"{where}: not valid JSON ({error})") from None
        # A lone surrogate reaches the parsed strings only from the text itself or from a
        # "\udXXX" escape in it: both are found by a pass over the text each (an encode and a
        # regex search, in C), where encoding the parsed manifest again (from_dict's check)
        # took 43 ms at 200,000 tokens.
        if not isinstance(text, str) or not encodes_to_utf8(text) or _SURROGATE_ESCAPE.search(text):
            _check_unicode(data, where)  # (bytes, which json.loads also reads: the full check)
        return cls._validate(data, where)

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_FILE) -> Manifest:
        """Validate a parsed manifest (see :meth:`from_json`)."""
        _check_unicode(data, where)
        return cls._validate(data, where)

    @classmethod
    def _validate(cls, data: Any, where: str) -> Manifest:
        reader = _Reader(data, where)
        version = reader.integer("format_version", 1)
        if version > FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: format_version {version} is newer than this reader's "
                f"({FORMAT_VERSION}); upgrade skattn/serving to load this model"
            )
        if reader.take("special_ids", dict) != SPECIAL_IDS:
            raise ArtifactError(f"{where}: special_ids must be {SPECIAL_IDS}")
        limits = reader.take("limits", dict)
        model = reader.take("model", dict) if version >= 2 else {}
        manifest = cls(
            format_version=version,
            tokenizer=reader.choice("tokenizer", tuple(TOKENIZERS)),
            source_vocabulary=reader.vocabulary("source_vocabulary"),
            target_vocabulary=reader.vocabulary("target_vocabulary"),
            decoder=reader.take("decoder", str),
            attention=reader.take("attention", str),
            scorer=reader.take("scorer", str),
            cell=reader.take("cell", str),
            input_feeding=reader.take("input_feeding", bool),
            state_names=reader.state_names(),
            max_source_length=_Reader(limits, where, "limits").integer(
                "max_source_length", 1, MAX_SOURCE_LENGTH
            ),
            max_output_length=_Reader(limits, where, "limits").integer(
                "max_output_length", 1, MAX_OUTPUT_LENGTH
            ),
            beam_size=reader.integer("beam_size", 1, MAX_BEAM_SIZE),
            length_penalty=reader.real("length_penalty", 0.0, MAX_LENGTH_PENALTY),
            temperature=reader.real("temperature", 0.0, FLOAT32_MAX, low_open=True),
            output_kind=reader.choice("output_kind", OUTPUT_KINDS),
            files=reader.files(),
            model=model,
            writer={k: data[k] for k in ("opset", "torch_version") if k in data},
            quantization=reader.choice("quantization", ("none", *QUANTIZATIONS))
            if "quantization" in data
            else "none",
            export_id=reader.digest("export_id") if "export_id" in data else "",
            output_order=reader.choice("output_order", OUTPUT_ORDERS)
            if "output_order" in data
            else "left_to_right",
        )
        if manifest.output_order != "left_to_right" and version < FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: 'output_order' {manifest.output_order!r} needs format_version "
                f"{FORMAT_VERSION}, got {version}: the manifest was edited; re-export the model"
            )
        if version >= 2 and reader.take("binding", str) != manifest.binding:
            raise ArtifactError(
                f"{where}: 'binding' does not match the vocabularies and model it lists: the "
                "manifest was edited after export"
            )
        return manifest

    def with_files(self, directory: str | os.PathLike) -> Manifest:
        """A copy whose ``files`` hold the SHA-256 of the graphs now in ``directory``
        (the step graphs, and the optional ones that are there)."""
        directory = Path(directory)
        names = [*GRAPH_FILES, *(n for n in OPTIONAL_GRAPH_FILES if (directory / n).is_file())]
        digests = {name: sha256_file(directory / name) for name in names}
        return dataclasses.replace(self, files=digests)


def format_version_for(output_order: str) -> int:
    """The format an artifact of ``output_order`` is written in: 3 for a right-to-left model
    (readers from before ``output_order`` refuse it), else 2 (they read it)."""
    return BASE_FORMAT_VERSION if output_order == "left_to_right" else FORMAT_VERSION


def binding_digest(
    source_vocabulary: Sequence[str],
    target_vocabulary: Sequence[str],
    state_names: Sequence[str],
    model: Mapping[str, Any],
    export_id: str = "",
) -> str:
    """SHA-256 of canonical JSON of what a pair of graphs was exported for (``export_id``
    counted when there is one: artifacts written before it keep their binding)."""
    bound = [list(source_vocabulary), list(target_vocabulary), list(state_names), dict(model)]
    if export_id:
        bound.append(export_id)
    text = json.dumps(bound, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: A JSON escape of a UTF-16 surrogate (``\\ud800``-``\\udfff``); a valid pair matches too.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_unicode(data: Any, where: str) -> None:
    """ArtifactError where a string of ``data`` holds a lone surrogate (JSON parses the escape
    ``"\\ud800"``, which no UTF-8 text holds)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ArtifactError(
            f"{where}: holds a string that is not valid Unicode (an unpaired surrogate)"
        ) from None
    except (TypeError, ValueError, RecursionError):
        pass  # not JSON's types, or a cycle: the validation names what is wrong


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Reader:
    """Typed reads of one JSON object, each failure an ArtifactError naming the key."""

    def __init__(self, data: Any, where: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: must hold a JSON object, got {type(data).__name__}")
        self.data, self.where = data, where
        self.prefix = f"{prefix}." if prefix else ""

    def fail(self, key: str, expected: str) -> ArtifactError:
        value = repr(self.data.get(key))
        if len(value) > 60:
            value = value[:57] + "..."
        return ArtifactError(f"{self.where}: {self.prefix}{key!r} must be {expected}, got {value}")

    def take(self, key: str, kind: type) -> Any:
        if key not in self.data:
            raise ArtifactError(f"{self.where}: missing key {self.prefix}{key!r}")
        value = self.data[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            raise self.fail(key, f"a {kind.__name__}")
        return value

    def integer(self, key: str, low: int, high: int | None = None) -> int:
        value = self.data.get(key)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
        if not ok or (high is not None and value > high):
            raise self.fail(key, f"an int in [{low}, {high}]" if high else f"an int >= {low}")
        return value

    def real(
        self, key: str, low: float, high: float = math.inf, *, low_open: bool = False
    ) -> float:
        value = self.data.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (value > low if low_open else value >= low)
        if not (ok and value <= high):
            bound = "" if high == math.inf else f" and <= {high:g}"
            raise self.fail(key, f"a finite number {'>' if low_open else '>='} {low}{bound}")
        return float(value)

    def choice(self, key: str, options: tuple[str, ...]) -> str:
        value = self.data.get(key)
        if value not in options:
            raise self.fail(key, f"one of {list(options)}")
        return value

    def digest(self, key: str) -> str:
        value = self.data.get(key)
        if not (isinstance(value, str) and len(value) == 64 and set(value) <= HEX_DIGITS):
            raise self.fail(key, "a SHA-256 in 64 lower-case hex digits")
        return value

    def vocabulary(self, key: str) -> tuple[str, ...]:
        tokens = self.take(key, list)
        kinds = set(map(type, tokens))  # a pass in C: a word-level vocabulary holds 10^5 tokens
        if not all(issubclass(k, str) for k in kinds) or len(tokens) <= len(SPECIAL_TOKENS):
            raise ArtifactError(f"{self.where}: {key!r} must be a list of str beyond the specials")
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ArtifactError(f"{self.where}: {key!r} must start with {list(SPECIAL_TOKENS)}")
        if len(set(tokens)) != len(tokens):
            raise ArtifactError(f"{self.where}: {key!r} holds a token twice")
        return tuple(tokens)

    def state_names(self) -> tuple[str, ...]:
        names = self.take("state_names", list)
        if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ArtifactError(
                f"{self.where}: 'state_names' must be a non-empty list of identifiers"
            )
        return tuple(names)

    def files(self) -> dict[str, str]:
        files = self.take("files", dict)
        digests_ok = all(isinstance(v, str) for v in files.values())
        if not set(files) <= {*GRAPH_FILES, *OPTIONAL_GRAPH_FILES} or not digests_ok:
            raise ArtifactError(
                f"{self.where}: 'files' must map {list(GRAPH_FILES)} (and optionally "
                f"{list(OPTIONAL_GRAPH_FILES)}) to their SHA-256"
            )
        return dict(files)
