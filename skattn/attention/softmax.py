"""Masked softmax with temperature, safe on fully masked rows and traceable for ONNX export."""

from __future__ import annotations

from numbers import Real

import torch
from torch import Tensor


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

        \alpha_j = \frac{m_j \exp(e_j / \tau - \max_k e_k / \tau)}
                        {\sum_k m_k \exp(e_k / \tau - \max_k e_k / \tau)},
        \qquad \alpha = 0 \text{ when } \sum_k m_k = 0.

    Padding is excluded with ``torch.where`` rather than ``masked_fill(-inf)``, so a padded
    position gets exactly 0, a row with no real position gives zeros (never NaN), and the
    gradient of such a row is zero as well.

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
        Weights with the shape of ``scores``; each row sums to 1, or to 0 when fully masked.

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
    z = scores / temperature  # (..., T)
    if mask is None:
        return torch.softmax(z, dim=-1)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be a boolean tensor, got dtype {mask.dtype}")
    # Scalars rather than full_like / zeros_like: the same values, and no shape-dependent
    # ConstantOfShape nodes in an exported decoder step.
    z = torch.where(mask, z, torch.finfo(z.dtype).min)  # (..., T)
    z_max = z.amax(dim=-1, keepdim=True).detach()  # (..., 1), a shift: no gradient needed
    e = torch.where(mask, torch.exp(z - z_max), 0.0)  # (..., T)
    total = e.sum(dim=-1, keepdim=True)  # (..., 1)
    return e / torch.where(total > 0, total, 1.0)
