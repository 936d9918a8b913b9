"""A runtime's greedy search over a running set of items, for continuous batching.

:class:`RunningDecode` is :class:`skattn.core.greedy.GreedySearch` over a
:class:`serving.runtime.Runtime`'s step graphs: new sources are encoded and join the running
rows between two steps (``NumpyBackend.merge`` pads the source axis to the longest), and each
item leaves with its prediction the step it ends::

    admit(sources) --tokenize, ids + EOS, pad--> encoder.onnx --merge--> running carry
    step()         --decoder_step.onnx over every row--> the items that ended: prediction, map

The items' predictions and maps are those of ``runtime.predict_batch`` for the same sources:
the same ids, the same step graph, the same decisions, and each row reads only its own state
and unpadded source. :func:`continuous_support` says which runtimes can do this.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from serving.backends import NumpyBackend
from skattn.core.inference import attention_rows
from skattn.core.search import GreedySearch
from skattn.core.text import tokenize

__all__ = ["RunningDecode", "continuous_support"]


def continuous_support(runtime: object) -> str | None:
    """Why ``runtime`` cannot decode a running set of items, or None when it can.

    It can when it is a :class:`serving.runtime.Runtime` that decodes greedily over the step
    graphs on host memory, and its decoder step ignores the target position (no Transformer
    decoder, no local-m attention: rows that joined at different steps share each step).
    """
    manifest = getattr(runtime, "manifest", None)
    backend = getattr(runtime, "backend", None)
    if manifest is None or type(backend) is not NumpyBackend:
        return "it does not decode over the step graphs on host memory (IO binding is on)"
    if manifest.beam_size != 1:
        return f"it decodes with beam search (beam_size={manifest.beam_size}); only greedy runs"
    if manifest.step_reads_position:
        return (
            f"its decoder step reads the target position (decoder={manifest.decoder!r}, "
            f"attention={manifest.attention!r})"
        )
    return None


class RunningDecode:
    """The greedy search of a runtime over items that join and leave between steps.

    Parameters
    ----------
    runtime : serving.runtime.Runtime
        One for which :func:`continuous_support` is None.
    temperature : float or None
        The attention temperature of every item in the search (None: the manifest's).
    """

    def __init__(self, runtime: Any, temperature: float | None) -> None:
        reason = continuous_support(runtime)
        if reason is not None:
            raise ValueError(f"runtime {runtime!r} cannot decode continuously: {reason}")
        self.runtime = runtime
        self.translator = runtime.step_translator
        self.backend: NumpyBackend = runtime.backend
        self.temperature = temperature
        settings = runtime.search_settings(temperature)
        step = functools.partial(self.backend.step, temperature=settings.temperature)
        self.search = GreedySearch(
            step, self.backend.select, settings.max_length, position_free=True
        )

    @property
    def size(self) -> int:
        """The number of items being decoded."""
        return self.search.size

    def admit(self, keys: Sequence[Any], sources: Sequence[str]) -> None:
        """Encode ``sources`` (already checked with ``runtime.check_source``) and add them to
        the rows, each under its key, to start at the next step."""
        token_lists = [tokenize(text, self.runtime.tokenizer) for text in sources]
        id_lists = self.translator.source_ids(token_lists)
        carry = self.translator.encode(id_lists)
        widths = [len(ids) for ids in id_lists]
        self.search.admit(carry, keys, merge=self.backend.merge, widths=widths)

    def drop(self, keys: Collection[Any]) -> None:
        """Stop decoding the items of ``keys`` (their callers have gone)."""
        self.search.drop(keys)
        self._trim()

    def step(self) -> list[tuple[Any, Any, np.ndarray]]:
        """One decoder step over every row: ``(key, prediction, attention)`` of the items that
        ended, ``attention (T_y, T_x)`` float64 as ``runtime.predict_batch`` gives it."""
        ended = []
        for key, hypothesis in self.search.step():
            h = self.translator.read(hypothesis)  # the usual order (a right-to-left model's)
            ended.append((key, self.translator.output(h.tokens), attention_rows(h)))
        if ended:
            self._trim()
        return ended

    def _trim(self) -> None:
        """Cut the carry's source axis to the longest source still decoding."""
        if self.search.size:
            width = max(self.search.widths)
            self.search.carry = self.backend.trim(self.search.carry, width)
