"""A deterministic stand-in for ``serving.load(...)``, for the batcher and server tests.

It reverses strings and reports an anti-diagonal attention map softened by the temperature, so
that every answer can be checked exactly. It records every batch it runs, can be held at a
gate (to pile up a queue deterministically), slowed down, or made to fail.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from serving.interface import ModelInfo, vocabulary_id

FAIL_MARKER = "boom"
WARMUP_SOURCE = "<warm-up>"  # translated at start-up; never held, never counted in ``calls``


def check_source(text: object, max_source_length: int) -> None:
    """The runtime's check: a str of at most ``max_source_length`` characters."""
    if not isinstance(text, str):
        raise ValueError(f"sources must be str, got {type(text).__name__}")
    if len(text) > max_source_length:
        raise ValueError(
            f"source has {len(text)} tokens, more than max_source_length={max_source_length}"
        )


class ReverseRuntime:
    """Implements :class:`serving.interface.Runtime`: ``info``, ``check_source`` and
    ``predict_batch`` (plus ``predict`` and ``predict_attention``, as ``serving.load`` gives).

    Parameters
    ----------
    delay : float
        Seconds each batch sleeps, to stand for inference time.
    max_source_length : int
        Longest source (characters) that ``check_source`` admits.
    gated : bool
        If True, every batch waits until ``release()``.
    """

    name = "reverse"
    provider = "CPUExecutionProvider"

    def __init__(
        self, delay: float = 0.0, max_source_length: int = 32, gated: bool = False
    ) -> None:
        self.delay = delay
        self.max_source_length = max_source_length
        self.output_kind = "str"
        self.calls: list[tuple[list[str], float | None, bool]] = []
        self.warmups: list[tuple[list[str], float | None, bool]] = []
        self.started = threading.Semaphore(0)  # released once per batch started
        self._gate = threading.Event()
        if not gated:
            self._gate.set()

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(
            name=self.name,
            provider=self.provider,
            max_source_length=self.max_source_length,
            max_output_length=self.max_source_length,
            output_kind=self.output_kind,
            tokenizer="char",
            decoder="bahdanau",
            attention="global",
            scorer="additive",
            beam_size=1,
            temperature=1.0,
            vocabulary_id=vocabulary_id(list("0123456789"), list("0123456789")),
            warmup_source=WARMUP_SOURCE,
        )

    def release(self) -> None:
        """Let held and future batches run."""
        self._gate.set()

    def check_source(self, text: object) -> None:
        check_source(text, self.max_source_length)

    def predict_batch(
        self, sources: list[str], temperature: float | None = None, with_attention: bool = False
    ) -> tuple[list[str], list[np.ndarray] | None]:
        if list(sources) == [WARMUP_SOURCE]:
            self.warmups.append((list(sources), temperature, with_attention))
            return [WARMUP_SOURCE[::-1]], [reverse_attention(WARMUP_SOURCE, temperature)]
        self.calls.append((list(sources), temperature, with_attention))
        self.started.release()
        if not self._gate.wait(timeout=30):
            raise RuntimeError("test gate never released")
        if self.delay:
            time.sleep(self.delay)
        if any(FAIL_MARKER in source for source in sources):
            raise RuntimeError("injected failure")
        predictions = [source[::-1] for source in sources]
        if not with_attention:
            return predictions, None
        return predictions, [reverse_attention(s, temperature) for s in sources]

    def predict(self, sources: list[str], temperature: float | None = None) -> list[str]:
        return self.predict_batch(sources, temperature)[0]

    def predict_attention(
        self, sources: list[str], temperature: float | None = None
    ) -> list[np.ndarray]:
        return self.predict_batch(sources, temperature, with_attention=True)[1]

    @property
    def batch_sizes(self) -> list[int]:
        return [len(sources) for sources, _, _ in self.calls]

    @property
    def seen(self) -> list[str]:
        return [source for sources, _, _ in self.calls for source in sources]


def reverse_attention(source: str, temperature: float | None = None) -> np.ndarray:
    """Output step i attends to source position T_x - 2 - i: softmax(-|j - target| / temperature).

    ``(T_y, T_x)`` with ``T_y = len(source)``, ``T_x = len(source) + 1`` (end-of-source marker).
    """
    t = 1.0 if temperature is None else temperature
    t_y, t_x = len(source), len(source) + 1
    target = (t_x - 2 - np.arange(t_y))[:, None]  # (T_y, 1)
    scores = -np.abs(np.arange(t_x)[None, :] - target) / t  # (T_y, T_x)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)
