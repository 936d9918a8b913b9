"""Attention scorers: one class per score function, looked up by name in ``SCORE_FUNCTIONS``.

Every scorer splits its work in two, so that a decoder pays per step only for the query side:

- ``precompute(H)``: the query-independent keys, once per source sentence;
- ``forward(s, keys)``: the scores of one query ``s (B, d_s) -> (B, heads, T)`` or of all
  decoder steps at once ``s (B, T_y, d_s) -> (B, T_y, heads, T)``.

Notation follows the papers: ``s`` is the decoder state (the query, size ``d_s``), ``h_j`` the
encoder annotation ``j`` (size ``d_h``), row vectors throughout (``s @ W_a``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn

from skattn.core.checks import check_int


class Scorer(nn.Module, ABC):
    """Base class: input checks, head splitting and the single-query / all-steps dispatch.

    Subclasses implement ``precompute`` and ``_score(q (B, T_y, d_s), keys) -> (B, T_y, h, T)``.

    Parameters
    ----------
    query_size : int
        Size ``d_s`` of the decoder state.
    key_size : int
        Size ``d_h`` of the encoder annotations ``H``.
    attention_size : int, optional
        Hidden size of the scorers that have one (additive); ignored by the others.
    num_heads : int, default=1
        Number of heads; each head scores its own slice of the query and of the keys.

    Attributes
    ----------
    keys_size : int
        Last dimension of the precomputed keys.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
    ) -> None:
        super().__init__()
        self.query_size = check_int(query_size, "query_size")
        self.key_size = check_int(key_size, "key_size")
        self.num_heads = check_int(num_heads, "num_heads")
        self.keys_size = self.key_size

    @abstractmethod
    def precompute(self, H: Tensor) -> Tensor:
        """Keys ``(B, T, keys_size)`` from the annotations ``H (B, T, d_h)``."""

    @abstractmethod
    def _score(self, q: Tensor, keys: Tensor) -> Tensor:
        """Scores ``(B, T_y, heads, T)`` of the queries ``q (B, T_y, d_s)``."""

    def forward(self, s: Tensor, keys: Tensor) -> Tensor:
        """Scores of the queries ``s`` against the precomputed ``keys``.

        Parameters
        ----------
        s : Tensor
            One query per item ``(B, d_s)`` or all decoder steps ``(B, T_y, d_s)``.
        keys : Tensor
            Output of ``precompute``, ``(B, T, keys_size)``.

        Returns
        -------
        Tensor
            ``(B, heads, T)`` for a single query, ``(B, T_y, heads, T)`` for all steps.
        """
        self._check_query(s, keys)
        single = s.dim() == 2
        q = s.unsqueeze(1) if single else s  # (B, T_y, d_s)
        scores = self._score(q, keys)  # (B, T_y, h, T)
        return scores.squeeze(1) if single else scores

    # The checks read shapes as Python ints; under torch.jit.trace (the legacy ONNX exporter)
    # shapes are traced values, so the checks are skipped there rather than frozen into the graph.

    def _check_query(self, s: Tensor, keys: Tensor) -> None:
        if torch.jit.is_tracing():
            return
        if s.dim() not in (2, 3) or s.shape[-1] != self.query_size:
            raise ValueError(
                f"s must have shape (B, {self.query_size}) or (B, T_y, {self.query_size}), "
                f"got s of shape {tuple(s.shape)}"
            )
        if keys.dim() != 3 or keys.shape[-1] != self.keys_size or keys.shape[0] != s.shape[0]:
            raise ValueError(
                f"keys must have shape (B, T, {self.keys_size}) with B = {s.shape[0]} "
                f"(from s), got keys of shape {tuple(keys.shape)}"
            )

    def _check_annotations(self, H: Tensor) -> None:
        if torch.jit.is_tracing():
            return
        if H.dim() != 3 or H.shape[-1] != self.key_size:
            raise ValueError(
                f"H must have shape (B, T, {self.key_size}), got H of shape {tuple(H.shape)}"
            )

    def _dot_products(self, q: Tensor, keys: Tensor) -> Tensor:
        """``q_i . k_j`` per head: ``q (B, T_y, d)``, ``keys (B, T, d)`` -> ``(B, T_y, h, T)``.

        One head is the batched product ``q keys^T``: onnxruntime folds the transpose into a
        ``FusedMatMul`` that reads the keys in place (38 us for ``B = 64, T = 12, d = 256`` in
        a Luong decoder step). The einsum it replaces exported as an ``Einsum``: 160 us, a sixth
        of the step; ``keys q^T``, a product with one output column, took 93-101 us."""
        if self.num_heads == 1:
            return (q @ keys.transpose(1, 2)).unsqueeze(2)  # (B, T_y, 1, T)
        q = self._split_heads(q)  # (B, T_y, h, d / h)
        k = self._split_heads(keys)  # (B, T, h, d / h)
        return torch.einsum("byhd,bthd->byht", q, k)  # (B, T_y, h, T)

    def _split_heads(self, x: Tensor) -> Tensor:
        """``(B, L, D) -> (B, L, heads, D / heads)``, ``D = keys_size`` (a query and the keys it
        is dotted with are as wide): sizes the graph holds as constants, so 0 rows stay defined."""
        return x.unflatten(-1, (self.num_heads, self.keys_size // self.num_heads))

    def extra_repr(self) -> str:
        return f"query_size={self.query_size}, key_size={self.key_size}, num_heads={self.num_heads}"


def _check_divisible(num_heads: int, **sizes: int) -> None:
    for name, size in sizes.items():
        if size % num_heads:
            raise ValueError(f"{name}={size} is not divisible by num_heads={num_heads}")


class DotScorer(Scorer):
    r"""Luong's dot score, per head: :math:`e_j = s \cdot h_j`.

    Requires ``query_size == key_size``; the keys are ``H`` itself.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
    ) -> None:
        super().__init__(query_size, key_size, attention_size, num_heads)
        if query_size != key_size:
            raise ValueError(
                f"the {type(self).__name__} needs query_size == key_size, "
                f"got query_size={query_size}, key_size={key_size}"
            )
        _check_divisible(num_heads, query_size=query_size)
        self.scale = 1.0

    def precompute(self, H: Tensor) -> Tensor:
        """Keys ``(B, T, d_h)``: the annotations themselves."""
        self._check_annotations(H)
        return H

    def _score(self, q: Tensor, keys: Tensor) -> Tensor:
        return self._dot_products(q, keys) * self.scale  # (B, T_y, h, T)


class ScaledDotScorer(DotScorer):
    r"""Scaled dot score, per head: :math:`e_j = s \cdot h_j / \sqrt{d_k}`.

    ``d_k = d_h / heads`` is the size of one head's slice.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
    ) -> None:
        super().__init__(query_size, key_size, attention_size, num_heads)
        self.scale = 1.0 / math.sqrt(key_size // num_heads)


class GeneralScorer(Scorer):
    r"""Luong's general (bilinear) score: :math:`e_j = s W_a h_j^\top`, ``W_a (d_s, d_h)``.

    The keys ``k_j = h_j W_a^\top`` are precomputed, so a step costs one dot product
    ``e_j = s \cdot k_j``. With several heads, head ``m`` scores its slice of ``s`` against the
    same slice of ``k_j``.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
    ) -> None:
        super().__init__(query_size, key_size, attention_size, num_heads)
        _check_divisible(num_heads, query_size=query_size, key_size=key_size)
        self.keys_size = query_size
        self.W_a = nn.Parameter(torch.empty(query_size, key_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.key_size)
        nn.init.uniform_(self.W_a, -bound, bound)

    def precompute(self, H: Tensor) -> Tensor:
        """Keys ``H @ W_a^T``, ``(B, T, d_s)``."""
        self._check_annotations(H)
        return H @ self.W_a.T  # (B, T, d_s)

    def _score(self, q: Tensor, keys: Tensor) -> Tensor:
        return self._dot_products(q, keys)  # (B, T_y, h, T)


class AdditiveScorer(Scorer):
    r"""Bahdanau's additive score: :math:`e_j = v_a \cdot \tanh(s W_a + h_j U_a)`.

    ``W_a (d_s, n)``, ``U_a (d_h, n)``, ``v_a (n,)`` with ``n = attention_size``; the keys
    ``h_j U_a`` are precomputed. Luong's concat score is the same function with
    ``[W_a; U_a]`` stacked into one matrix. A single head only.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
    ) -> None:
        super().__init__(query_size, key_size, attention_size, num_heads)
        if num_heads != 1:
            raise ValueError(f"the additive scorer has a single head, got num_heads={num_heads}")
        n = check_int(query_size if attention_size is None else attention_size, "attention_size")
        self.attention_size = n
        self.keys_size = n
        self.W_a = nn.Parameter(torch.empty(query_size, n))
        self.U_a = nn.Parameter(torch.empty(key_size, n))
        self.v_a = nn.Parameter(torch.empty(n))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(
            self.W_a, -1.0 / math.sqrt(self.query_size), 1.0 / math.sqrt(self.query_size)
        )
        nn.init.uniform_(self.U_a, -1.0 / math.sqrt(self.key_size), 1.0 / math.sqrt(self.key_size))
        bound = 1.0 / math.sqrt(self.attention_size)
        nn.init.uniform_(self.v_a, -bound, bound)

    def precompute(self, H: Tensor) -> Tensor:
        """Keys ``H @ U_a``, ``(B, T, n)``."""
        self._check_annotations(H)
        return H @ self.U_a  # (B, T, n)

    def _score(self, q: Tensor, keys: Tensor) -> Tensor:
        sW = q @ self.W_a  # (B, T_y, n)
        hidden = torch.tanh(sW.unsqueeze(2) + keys.unsqueeze(1))  # (B, T_y, T, n)
        # v_a as an (n, 1) matrix: one GEMM over all B * T_y * T rows. (A 1-D v_a exports as
        # an ONNX MatMul that onnxruntime runs as many small products, 30 % of a decoder step.)
        return (hidden @ self.v_a.unsqueeze(1)).squeeze(-1).unsqueeze(2)  # (B, T_y, 1, T)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", attention_size={self.attention_size}"


SCORE_FUNCTIONS: dict[str, type[Scorer]] = {
    "dot": DotScorer,
    "general": GeneralScorer,
    "additive": AdditiveScorer,
    "scaled_dot": ScaledDotScorer,
}


def make_scorer(
    name: str,
    query_size: int,
    key_size: int,
    attention_size: int | None = None,
    num_heads: int = 1,
) -> Scorer:
    """Build the scorer registered under ``name``.

    Parameters
    ----------
    name : {"dot", "general", "additive", "scaled_dot"}
        The score function.
    query_size, key_size : int
        Sizes ``d_s`` of the decoder state and ``d_h`` of the encoder annotations.
    attention_size : int, optional
        Hidden size ``n`` of the additive scorer (default ``query_size``); ignored by the
        others.
    num_heads : int, default=1
        Heads of the multiplicative scorers; the additive scorer accepts only 1.

    Returns
    -------
    Scorer

    Raises
    ------
    ValueError
        If ``name`` is unknown (the message lists the valid names) or the sizes do not fit.
    """
    if not isinstance(name, str) or name not in SCORE_FUNCTIONS:
        raise ValueError(f"scorer must be one of {sorted(SCORE_FUNCTIONS)}, got {name!r}")
    return SCORE_FUNCTIONS[name](query_size, key_size, attention_size, num_heads)
