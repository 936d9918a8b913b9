"""``Seq2Seq``'s parameter table: scikit-learn's own constraint objects, one entry a parameter.

``Seq2Seq._parameter_constraints`` is this table, so scikit-learn's ``_fit_context`` checks every
parameter at the start of ``fit`` (``InvalidParameterError``, a ``ValueError`` naming it) and
``sklearn.utils.estimator_checks.check_param_validation`` runs in the suite. Two constraint
classes extend scikit-learn's: integers and reals that refuse booleans, and device strings.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from skattn.core.checks import FLOAT32_MAX, MAX_THREADS, parse_device
from skattn.core.manifest import MAX_BEAM_SIZE, MAX_LENGTH_PENALTY, MAX_OUTPUT_LENGTH
from skattn.core.text import TOKENIZERS
from skattn.models import OPTIONS
from skattn.models.config import MAXIMA
from skattn.training import AUTOCAST_DTYPES

__all__ = ["N_JOBS", "PARAMETER_CONSTRAINTS"]


class _Range(Interval):
    """scikit-learn's ``Interval`` without booleans: ``True`` is an int to Python, never a size
    or a rate to a user."""

    def is_satisfied_by(self, val: Any) -> bool:
        return not isinstance(val, bool | np.bool_) and super().is_satisfied_by(val)


class _Device(StrOptions):
    """``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (see ``core.checks.parse_device``)."""

    def __init__(self) -> None:
        super().__init__({"auto", "cpu", "cuda"})

    def is_satisfied_by(self, val: Any) -> bool:
        try:
            parse_device(val)
        except ValueError:
            return False
        return True

    def __str__(self) -> str:
        return "a str among 'auto', 'cpu', 'cuda' or 'cuda:N'"


#: The largest count a parameter takes (steps, epochs, a batch): past it, the arithmetic of a
#: schedule or of NumPy's 32-bit integers would overflow.
MAX_COUNT = 2**31 - 1


def _at_least(low: int) -> list:
    return [_Range(Integral, low, MAX_COUNT, closed="both")]


def _size(name: str) -> list:
    """An int from 1 to the model's limit for ``name`` (``skattn.models.config.MAXIMA``)."""
    return [_Range(Integral, 1, MAXIMA[name], closed="both")]


def _reals(low: float, high: float = FLOAT32_MAX, closed: str = "right") -> list:
    """Reals in the interval; at most a float32's largest value by default, so that an int
    too large for a float is refused here, not by ``float()`` in ``fit``."""
    return [_Range(Real, low, high, closed=closed)]


#: joblib's ``n_jobs``: None, a positive count, or -1, -2, ... (all cores, all but one, ...);
#: not 0 and not a bool; at most ``MAX_THREADS`` either way (loky overflowed a C int at 2**31).
N_JOBS: list = [
    _Range(Integral, 1, MAX_THREADS, closed="both"),
    _Range(Integral, -MAX_THREADS, -1, closed="both"),
    None,
]

PARAMETER_CONSTRAINTS: dict[str, list] = {
    **{name: [StrOptions(set(choices))] for name, choices in OPTIONS.items()},
    "input_feeding": ["boolean"],
    "window": _size("window"),
    "temperature": _reals(0.0),
    "embedding_dim": _size("embedding_dim"),
    "hidden_size": _size("hidden_size"),
    "num_layers": _size("num_layers"),
    "dropout": _reals(0.0, 1.0, closed="left"),
    "num_heads": _size("num_heads"),
    "num_kv_heads": [*_size("num_kv_heads"), None],
    "ffn_size": [*_size("ffn_size"), None],
    # beam_size and max_output_length: at most what an artifact may carry (core.manifest), so
    # that what fits also exports and serves, and no setting decodes for hours
    "beam_size": [_Range(Integral, 1, MAX_BEAM_SIZE, closed="both")],
    "length_penalty": _reals(0.0, MAX_LENGTH_PENALTY, closed="both"),
    "max_output_length": [_Range(Integral, 1, MAX_OUTPUT_LENGTH, closed="both"), None],
    "batch_size": _at_least(1),
    "max_epochs": _at_least(1),
    "max_steps": [*_at_least(1), None],
    "max_time": [*_reals(0.0), None],
    "learning_rate": _reals(0.0),
    "weight_decay": _reals(0.0, closed="both"),
    "lr_schedule": [StrOptions({"constant", "plateau", "cosine", "inverse_sqrt"})],
    "warmup_steps": _at_least(0),
    "average_checkpoints": _at_least(1),
    "label_smoothing": _reals(0.0, 1.0, closed="left"),
    "max_grad_norm": [*_reals(0.0), None],
    "early_stopping": ["boolean"],
    "early_stopping_metric": [StrOptions({"loss", "exact_match"})],
    "validation_fraction": _reals(0.0, 1.0, closed="neither"),
    "n_iter_no_change": _at_least(1),
    "tol": _reals(0.0, closed="both"),
    "tokenizer": [StrOptions(set(TOKENIZERS))],
    "device": [_Device()],
    "n_threads": [_Range(Integral, 1, MAX_THREADS, closed="both"), None],
    "precision": [StrOptions(set(AUTOCAST_DTYPES))],
    "warm_start": ["boolean"],
    # NumPy seeds are 32-bit: a larger int is refused here, by name, not by NumPy in fit
    "random_state": [_Range(Integral, 0, 2**32 - 1, closed="both"), np.random.RandomState, None],
    "verbose": ["verbose"],
}
