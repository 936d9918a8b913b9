r"""Multi-head scaled dot-product attention with grouped-query key / value heads.

.. math::

    \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}\,\tau}
        + \log M\right) V, \qquad
    \mathrm{head}_h = \mathrm{Attention}(X_q W^Q_h,\; X_{kv} W^K_{g(h)},\; X_{kv} W^V_{g(h)}),

    \mathrm{MultiHead}(X_q, X_{kv}) = [\mathrm{head}_1; \dots; \mathrm{head}_{n_h}]\, W^O,
    \qquad g(h) = \lfloor h / (n_h / n_{kv}) \rfloor .

``M`` is a boolean mask (``True`` = the query may read that key); ``tau`` a softmax temperature
(1 except in cross-attention at decoding time). With ``n_kv = n_h`` this is the Transformer's
multi-head attention, with ``1 < n_kv < n_h`` grouped-query attention (GQA: each run of
``n_h / n_kv`` consecutive query heads shares one key / value head), with ``n_kv = 1``
multi-query attention (MQA). Only the key / value projections shrink, and with them a decoder's
key-value cache; the math of a head is unchanged, so GQA equals multi-head attention whose key
and value weights are copies (``tests/test_transformer.py`` checks it).

Row-vector convention (``x @ W``), batch-first. A fully masked row (a query with no key it may
read) gives zero weights and a zero output, never NaN, with a zero gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from skattn.attention.softmax import masked_softmax
from skattn.core.checks import check_int

__all__ = ["MultiHeadAttention", "repeat_kv", "scaled_dot_product"]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, n_kv, T, d) -> (B, n_kv * n_rep, T, d)``: query head ``h`` reads ``h // n_rep``.

    One ``index_select`` of whole heads, so the export holds no ``Reshape``: a reshape's ``-1``
    cannot be inferred for an empty batch, and the exporter writes one where it may."""
    if n_rep == 1:
        return x
    heads = torch.arange(x.shape[1] * n_rep, device=x.device) // n_rep  # (n_kv * n_rep,)
    return x.index_select(1, heads)


def scaled_dot_product(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    temperature: float | Tensor = 1.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    r"""``softmax(q k^T / (sqrt(d) tau)) v`` over the keys a query may read.

    Parameters
    ----------
    q : Tensor (B, h, T_q, d)
    k, v : Tensor (B, h, T_k, d)
        Heads already repeated for grouped-query attention (:func:`repeat_kv`).
    mask : Tensor of bool, optional
        Broadcastable to ``(B, h, T_q, T_k)``; ``True`` where query ``i`` may read key ``j``.
    temperature : float or 0-d Tensor, default=1.0
        ``tau > 0`` divides the scaled scores.
    need_weights : bool, default=False
        Also return the weights ``(B, h, T_q, T_k)``.

    Returns
    -------
    out : Tensor (B, h, T_q, d)
        Zero for a query whose mask row is all ``False``.
    weights : Tensor (B, h, T_q, T_k) or None

    Without weights and at temperature 1 this is ``F.scaled_dot_product_attention`` (fused
    kernels); otherwise, and in an ONNX export, the same math is written out with
    :func:`~skattn.attention.softmax.masked_softmax`, whose shift-before-divide keeps any
    temperature finite and whose floored exponents keep onnxruntime off its slow path.
    """
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        # Mixed precision on the CPU (``precision="bfloat16"``): attention runs in float32. Its
        # products are a small share of a step, and SDPA's bfloat16 backward took 13x float32's
        # time (torch 2.13, one thread). A GPU keeps its fused bfloat16 kernels.
        with torch.autocast("cpu", enabled=False):
            return scaled_dot_product(
                q.float(), k.float(), v.float(), mask, temperature, need_weights
            )
    plain = not isinstance(temperature, Tensor) and temperature == 1.0
    # An exported graph writes the softmax out: SDPA's masked keys would enter ONNX's Softmax
    # as -inf, onnxruntime's slow path (``skattn.attention.softmax.EXP_FLOOR``).
    if plain and not need_weights and not torch.onnx.is_in_onnx_export():
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v), None
        # A row with no True entry is NaN in some SDPA kernels (torch 2.13's CPU kernel gives
        # zeros, not every backend or version does): open such rows to every key, then zero
        # their output (a constant, so their gradient is zero too).
        readable = mask.any(dim=-1, keepdim=True)  # (B, 1|h, T_q|1, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~readable)  # (B,h,T_q,d)
        return torch.where(readable, out, torch.zeros_like(out)), None
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, h, T_q, T_k): / sqrt(d)
    weights = masked_softmax(scores, mask, temperature)  # (B, h, T_q, T_k), 0-rows if no key
    return weights @ v, (weights if need_weights else None)  # (B, h, T_q, d)


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with ``num_kv_heads`` key / value heads (see the module docstring).

    Parameters
    ----------
    d_model : int
        Input and output size ``D``.
    num_heads : int
        Query heads ``n_h``; must divide ``d_model``. Each head has ``d_head = D / n_h`` units.
    num_kv_heads : int or None, default=None
        Key / value heads ``n_kv``; must divide ``num_heads``. ``None`` means ``num_heads``
        (plain multi-head attention); 1 is multi-query attention.
    bias : bool, default=True
        Biases on the four projections.

    Attributes
    ----------
    W_q : Linear (D, n_h d_head);  W_k, W_v : Linear (D, n_kv d_head);  W_o : Linear (D, D)
    kv_dim : int
        ``n_kv * d_head``, the width of one position's keys (and of its values) in a cache.

    The key / value side is split from the query side (:meth:`project_kv`, :meth:`attend`) so
    that a decoder can project the encoder output once per sentence and cache its own past keys.
    """

    def __init__(
        self, d_model: int, num_heads: int, num_kv_heads: int | None = None, bias: bool = True
    ) -> None:
        super().__init__()
        d_model = check_int(d_model, "d_model", 1)
        num_heads = check_int(num_heads, "num_heads", 1)
        num_kv_heads = check_int(num_kv_heads, "num_kv_heads", 1, none_ok=True) or num_heads
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.d_head = d_model // num_heads
        self.kv_dim = num_kv_heads * self.d_head
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, self.kv_dim, bias=bias)
        self.W_v = nn.Linear(d_model, self.kv_dim, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``K = x W^K``, ``V = x W^V``: ``(B, T, D) -> (B, T, kv_dim)`` each, heads flat."""
        return self.W_k(x), self.W_v(x)

    def attend(
        self,
        x: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        temperature: float | Tensor = 1.0,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Queries from ``x (B, T_q, D)`` read projected ``k, v (B, T_k, kv_dim)``.

        ``mask`` broadcasts to ``(B, T_q, T_k)`` or ``(B, h, T_q, T_k)`` (``True`` = may read).
        Returns the output ``(B, T_q, D)`` and, if asked, per-head weights ``(B, h, T_q, T_k)``.
        """
        n_rep = self.num_heads // self.num_kv_heads
        B, T_q, _ = x.shape  # read before the heads are split: the export keeps them dynamic
        q = self.W_q(x).unflatten(-1, (self.num_heads, self.d_head)).transpose(1, 2)  # (B,h,T_q,d)
        k = k.unflatten(-1, (self.num_kv_heads, self.d_head)).transpose(1, 2)  # (B, n_kv, T_k, d)
        v = v.unflatten(-1, (self.num_kv_heads, self.d_head)).transpose(1, 2)  # (B, n_kv, T_k, d)
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, h, T_k, d)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (B, 1, T_q, T_k): the same for every head
        out, weights = scaled_dot_product(q, k, v, mask, temperature, need_weights)
        # every size named (a -1 cannot be inferred for an empty batch)
        out = out.transpose(1, 2).reshape(B, T_q, self.num_heads * self.d_head)  # (B, T_q, D)
        return self.W_o(out), weights

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Self-attention over ``x (B, T, D)``, or cross-attention over ``memory (B, T_k, D)``.

        Returns ``(B, T, D)`` and optional per-head weights ``(B, h, T, T_k)``.
        """
        k, v = self.project_kv(x if memory is None else memory)  # (B, T_k, kv_dim) each
        return self.attend(x, k, v, mask, need_weights=need_weights)
