"""Masked softmax with temperature, safe on fully masked rows and traceable for ONNX export."""

from __future__ import annotations

from numbers import Real

import torch
from torch import Tensor

#: Softmax terms whose exponent is at or below this are exactly 0: ``exp(-80) = 1.8e-35``.
#: Below about -87.3, ``exp`` of a float32 is a denormal or 0, and onnxruntime's ``Exp``,
#: ``Softmax`` and ``LogSoftmax`` kernels take a slow path there, 10-20x slower per element
#: (measured: a ``(64, 4, 17, 17)`` Softmax whose padded keys are ``-inf`` took 0.72 ms against
#: 0.07 ms), so no exponent that low reaches ``exp``. Every exponent is the score minus the
#: row's maximum, so the maximum's term is 1 and the row's sum is at least 1: a dropped term
#: changes no weight by more than 1.8e-35, and a one-hot row stays exactly one-hot.
EXP_FLOOR = -80.0


def check_temperature(temperature: float | Tensor) -> None:
    """Raise ``ValueError`` if ``temperature`` is a number that is not positive.

    A tensor is not checked: reading its value would break tracing for ONNX export.
    """
    if isinstance(temperature, Tensor):
        return
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise ValueError(f"temperature must be a positive float, got {temperature!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature!r}")


def masked_softmax(
    scores: Tensor, mask: Tensor | None = None, temperature: float | Tensor = 1.0
) -> Tensor:
    r"""Softmax over the last axis of ``scores / temperature``, restricted to ``mask``.

    .. math::

        \alpha_j = \frac{m_j \exp((e_j - \max_{k: m_k} e_k) / \tau)}
                        {\sum_k m_k \exp((e_k - \max_{k: m_k} e_k) / \tau)},
        \qquad \alpha = 0 \text{ when } \sum_k m_k = 0.

    The maximum is taken over real positions and subtracted before dividing by ``tau``
    (:func:`tempered_scores`), so no temperature, however small, overflows. A padded position
    gets exactly 0, a row with no real position gives zeros (never NaN), and the gradient of
    such a row is zero as well. A real score of ``-inf`` is never attended; one of ``+inf`` or
    NaN (weights that diverged) leaves the softmax undefined, and its row is zeros too, as in
    :func:`skattn.reference.masked_softmax`.

    Parameters
    ----------
    scores : Tensor
        Attention scores ``(..., T)``.
    mask : Tensor of bool, optional
        Broadcastable to ``scores``; ``True`` marks a real position. ``None`` means all real.
    temperature : float or 0-d Tensor, default=1.0
        Softmax temperature ``tau > 0``: small values sharpen the weights towards a one-hot
        vector, large values flatten them towards uniform. A 0-d tensor (an ONNX graph input)
        is not checked, so that the function stays traceable.

    Returns
    -------
    Tensor
        Weights with the shape of ``scores``; each row sums to 1, or to 0 when fully masked
        (or undefined: a real score of ``+inf`` or NaN).
        float32 for float16 or bfloat16 scores under ``torch.autocast`` (the products of
        mixed-precision training).

    Raises
    ------
    ValueError
        If ``temperature`` is a number that is not positive, or ``mask`` is not boolean.

    Examples
    --------
    >>> scores = torch.tensor([[2.0, 0.0, 2.0], [1.0, 5.0, 3.0]])
    >>> mask = torch.tensor([[True, True, True], [False, False, False]])
    >>> masked_softmax(scores, mask)
    tensor([[0.4683, 0.0634, 0.4683],
            [0.0000, 0.0000, 0.0000]])
    """
    check_temperature(temperature)
    if mask is not None and mask.dtype != torch.bool:
        raise ValueError(f"mask must be a boolean tensor, got dtype {mask.dtype}")
    if scores.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(
        scores.device.type
    ):  # mixed-precision training: the weights in float32 (a bfloat16 model keeps its dtype)
        scores = scores.float()
    z = tempered_scores(scores, mask, temperature)  # (..., T), <= 0 at real positions
    # Terms below the floor are exactly 0 (see EXP_FLOOR), and so is padding; exp reads a 0 in
    # their place (padding's own z may be +inf or NaN: no inf * 0 in the gradient).
    keep = z > EXP_FLOOR if mask is None else mask & (z > EXP_FLOOR)  # (..., T)
    e = torch.where(keep, torch.exp(torch.where(keep, z, 0.0)), 0.0)  # (..., T)
    total = e.sum(dim=-1, keepdim=True)  # (..., 1), >= 1 unless the row has no real position
    return e / torch.where(total > 0, total, 1.0)


def tempered_scores(
    scores: Tensor, mask: Tensor | None, temperature: float | Tensor = 1.0
) -> Tensor:
    """``(e_j - max_k e_k) / tau``, the max over real positions: the softmax's exponents.

    Shifting *before* dividing keeps every real entry finite and ``<= 0`` (0 at the maximum)
    however small ``tau`` is, so ``exp`` never overflows and a tiny temperature gives a one-hot
    row rather than ``inf - inf = NaN``. ``tau`` is floored at the dtype's smallest normal
    number, so that ``0 / tau`` stays 0. Entries at padding positions are left meaningless;
    the caller masks them. A 0-d tensor ``tau`` (an ONNX graph input) is floored in the graph.
    """
    tiny = torch.finfo(scores.dtype).tiny
    real = scores if mask is None else torch.where(mask, scores, torch.finfo(scores.dtype).min)
    shift = real.amax(dim=-1, keepdim=True).detach()  # (..., 1): no gradient needed
    if isinstance(temperature, Tensor):
        temperature = temperature.clamp(min=tiny)
    else:
        temperature = max(float(temperature), tiny)
    return (scores - shift) / temperature
