"""The attention module: score -> mask (padding, local window) -> softmax -> context."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from skattn.attention.local import (
    LOCAL_KINDS,
    PositionPredictor,
    gaussian_log_weights,
    monotonic_positions,
    window_mask,
)
from skattn.attention.scorers import make_scorer
from skattn.attention.softmax import check_temperature, masked_softmax, tempered_scores
from skattn.core.checks import check_int


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for a float64 model: window positions are counts, and bfloat16
    holds every integer only up to 256."""
    return torch.promote_types(dtype, torch.float32)


def _rows_fit(rows: int, items: int) -> bool:
    """Whether ``rows`` queries are ``R >= 1`` per item of ``items`` (0 rows for 0 items)."""
    return rows == 0 if items == 0 else items > 0 and rows > 0 and rows % items == 0


def per_item(s: Tensor, items: int | Tensor, size: int) -> Tensor:
    """One step's queries ``s (B R, d)``, item-major, as ``(B, R, d)``; ``R`` stays free in a
    traced graph, where ``items`` is the memory's size (a tensor)."""
    if isinstance(items, Tensor):  # traced: (max(B, 1), -1, d), which 0 rows leave defined
        return s.reshape(torch.clamp(items, min=1), -1, size)  # (1, 0, d) broadcasts on B = 0
    return s.reshape(items, -1, size) if items else s.unsqueeze(1)  # -1 is undefined for 0


class Attention(nn.Module):
    r"""Global or local attention over encoder annotations, with a pluggable scorer.

    .. math::

        e_{ij} = \operatorname{score}(s_i, h_j), \qquad
        \alpha_{ij} = \operatorname{softmax}_j(e_{ij} / \tau) \text{ over real } j
        \text{ (and } |j - p_i| \le D \text{ when local)}, \qquad
        c_i = \sum_j \alpha_{ij} h_j .

    local-p multiplies the weights by :math:`\exp(-(j - p_i)^2 / (2 \sigma^2))`,
    :math:`\sigma = D / 2`, and renormalises them to sum to 1 (computed in log space as one
    softmax of :math:`e_{ij} / \tau - (j - p_i)^2 / (2 \sigma^2)`).

    With several heads, head ``m`` scores with its slice of the query and keys, reads its slice
    of ``H``, and the heads' contexts are concatenated; the reported weights are the mean over
    heads.

    Parameters
    ----------
    scorer : {"dot", "general", "additive", "scaled_dot"}
        The score function, see ``SCORE_FUNCTIONS``.
    query_size, key_size : int
        Sizes ``d_s`` of the decoder state and ``d_h`` of the encoder annotations.
    attention_size : int, optional
        Hidden size of the additive scorer and of the local-p position predictor (default
        ``query_size``).
    num_heads : int, default=1
        Heads of the multiplicative scorers.
    local : {None, "local-m", "local-p"}, default=None
        ``None`` attends over the whole source.
    window : int, default=10
        Half-width ``D`` of the local window.

    Attributes
    ----------
    scorer : Scorer
    position_predictor : PositionPredictor or None
        The ``W_p``, ``v_p`` of local-p.

    Examples
    --------
    >>> attention = Attention("general", query_size=8, key_size=6, local="local-p", window=2)
    >>> H = torch.randn(2, 5, 6)  # (B, T, d_h)
    >>> mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    >>> keys = attention.precompute(H)  # once per source sentence
    >>> context, weights = attention(torch.randn(2, 8), H, keys, mask)  # one decoder step
    >>> context.shape, weights.shape
    (torch.Size([2, 6]), torch.Size([2, 5]))
    >>> context, weights = attention(torch.randn(2, 4, 8), H, keys, mask)  # all 4 steps
    >>> context.shape, weights.shape
    (torch.Size([2, 4, 6]), torch.Size([2, 4, 5]))
    """

    def __init__(
        self,
        scorer: str,
        query_size: int,
        key_size: int,
        attention_size: int | None = None,
        num_heads: int = 1,
        local: str | None = None,
        window: int = 10,
    ) -> None:
        super().__init__()
        if local is not None and local not in LOCAL_KINDS:
            raise ValueError(f"local must be None or one of {list(LOCAL_KINDS)}, got {local!r}")
        window = check_int(window, "window")
        attention_size = check_int(attention_size, "attention_size", none_ok=True)
        self.scorer = make_scorer(scorer, query_size, key_size, attention_size, num_heads)
        self.query_size = query_size
        self.key_size = key_size
        self.num_heads = num_heads
        self.local = local
        self.window = window
        self.position_predictor = (
            PositionPredictor(query_size, query_size if attention_size is None else attention_size)
            if local == "local-p"
            else None
        )

    def precompute(self, H: Tensor) -> Tensor:
        """Query-independent keys ``(B, T, k)``, computed once per source sentence."""
        return self.scorer.precompute(H)

    def forward(
        self,
        s: Tensor,
        H: Tensor,
        keys: Tensor,
        mask: Tensor | None,
        temperature: float | Tensor = 1.0,
        step: int | Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from the decoder state(s) ``s`` over the annotations ``H``.

        Parameters
        ----------
        s : Tensor
            One step's queries, ``(B R, d_s)``: ``R >= 1`` per item, item-major (an item's
            beams in beam search, each reading the item's one row of ``H``); or all decoder
            steps ``(B, T_y, d_s)``.
        H : Tensor
            Encoder annotations ``(B, T, d_h)`` (the values).
        keys : Tensor
            ``self.precompute(H)``, ``(B, T, k)``.
        mask : Tensor of bool or None
            ``(B, T)``, ``True`` for real source positions (a prefix of each row). ``None``
            means no padding.
        temperature : float or 0-d Tensor, default=1.0
            Softmax temperature ``tau > 0``.
        step : int or 0-d Tensor, optional
            Target position of the (first) query, used by local-m: required with a single
            query; in the all-steps form the positions are ``step + arange(T_y)`` (default
            ``step = 0``).

        Returns
        -------
        context : Tensor
            ``(B R, d_h)``, or ``(B, T_y, d_h)`` in the all-steps form.
        weights : Tensor
            ``(B R, T)``, or ``(B, T_y, T)``; rows sum to 1 (0 for a source with no real
            position).

        Raises
        ------
        ValueError
            If the shapes do not fit (the message names the tensors), or local-m gets a single
            query without ``step``.
        """
        mask = self._check_inputs(s, H, keys, mask)
        check_temperature(temperature)
        single = s.dim() == 2
        B, T = H.shape[:2]
        # One step's queries: R = N / B rows per item, item-major (beam search's R beams of an
        # item read its one row of H), so an item's queries score its keys in one product.
        q = per_item(s, B, self.query_size) if single else s  # (B, T_y or R, d_s)
        T_y = q.shape[1]

        scores = self.scorer(q, keys)  # (B, T_y, h, T)
        valid = mask.unsqueeze(1)  # (B, 1, T)
        if self.local is not None:
            lengths = mask.sum(dim=-1)  # (B,)
            if self.local == "local-m":
                if single and step is None:
                    raise ValueError("local-m attention with a single query needs step")
                # one step's queries share its position; all steps' are step + arange(T_y)
                positions = 1 if single else T_y
                centres = monotonic_positions(0 if step is None else step, positions, lengths)
                centres = centres.to(_wide(scores.dtype))  # (B, T_y)
            elif torch.is_autocast_enabled(q.device.type):  # mixed precision: bfloat16 counts
                with torch.autocast(q.device.type, enabled=False):  # exactly only to 256
                    centres = self.position_predictor(q.to(_wide(q.dtype)), lengths)
            else:
                centres = self.position_predictor(q, lengths)  # (B, T_y)
            valid = valid & window_mask(centres, T, self.window)  # (B, T_y, T)
        valid = valid.unsqueeze(2)  # (B, T_y or 1, 1, T)
        if self.local == "local-p":  # the Gaussian multiplies the tempered softmax's terms
            log_gauss = gaussian_log_weights(centres, T, self.window)  # (B, T_y, T)
            scores = tempered_scores(scores, valid, temperature) + log_gauss.unsqueeze(2)
            weights = masked_softmax(scores, valid)  # (B, T_y, h, T)
        else:
            weights = masked_softmax(scores, valid, temperature)  # (B, T_y, h, T)

        h = self.num_heads
        if h == 1:  # one batched product, and a small graph for export
            weights = weights.squeeze(2)  # (B, T_y, T)
            context = torch.bmm(weights, H)  # (B, T_y, d_h)
        else:
            values = H.reshape(B, T, h, self.key_size // h)  # (B, T, h, d_h / h)
            context = torch.einsum("byht,bthd->byhd", weights, values)  # (B, T_y, h, d_h / h)
            context = context.reshape(B, T_y, self.key_size)  # (B, T_y, d_h)
            weights = weights.mean(dim=2)  # (B, T_y, T)
        if single:  # (N, d_h), (N, T)
            return context.reshape(-1, self.key_size), weights.reshape(-1, T)
        return context, weights

    def _check_inputs(self, s: Tensor, H: Tensor, keys: Tensor, mask: Tensor | None) -> Tensor:
        """Check the shapes; return ``mask``, all ``True`` when ``None``.

        Skipped under ``torch.jit.trace``, where shapes are traced values, not ints.
        """
        if mask is None:
            mask = torch.ones(H.shape[:2], dtype=torch.bool, device=H.device)
        elif mask.dtype != torch.bool:
            raise ValueError(f"mask must be a boolean tensor, got dtype {mask.dtype}")
        if torch.jit.is_tracing():
            return mask
        if s.dim() not in (2, 3) or s.shape[-1] != self.query_size:
            raise ValueError(
                f"s must have shape (B, {self.query_size}) or (B, T_y, {self.query_size}), "
                f"got s of shape {tuple(s.shape)}"
            )
        rows = s.shape[0]  # one step: B R rows (R >= 1 per item); all steps: B
        items = H.shape[0] if H.dim() == 3 else -1
        fits = items == rows if s.dim() == 3 else _rows_fit(rows, items)
        if H.dim() != 3 or H.shape[-1] != self.key_size or not fits:
            expected = (
                f"B = {rows} (from s)"
                if s.dim() == 3
                else f"R >= 1 rows of s per item ({rows} rows: B = 0 for none)"
            )
            raise ValueError(
                f"H must have shape (B, T, {self.key_size}) with {expected}, "
                f"got H of shape {tuple(H.shape)}"
            )
        B, T, _ = H.shape
        if keys.dim() != 3 or keys.shape[:2] != H.shape[:2]:
            raise ValueError(
                f"keys must have shape ({B}, {T}, k) like H, got keys of shape "
                f"{tuple(keys.shape)} and H of shape {tuple(H.shape)}"
            )
        if mask.shape != H.shape[:2]:
            raise ValueError(
                f"mask must have shape ({B}, {T}) like H, got mask of shape "
                f"{tuple(mask.shape)} and H of shape {tuple(H.shape)}"
            )
        return mask

    def extra_repr(self) -> str:
        return f"local={self.local!r}, window={self.window}"
