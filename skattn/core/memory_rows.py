"""Which rows of the encoder's memory a decoder step reads: one per row, or one per item.

A search's carry holds the decoder state of each of its ``N`` rows (an item's beams side by
side, item-major) and the encoder's memory, keys and mask in ``M`` rows. Every backend keeps
two records beside them, both ``int64`` on the host:

- ``origin (N,)``: the item (encoder row) each carry row decodes;
- ``held (M,)``: the item each memory row holds.

``select`` moves the state's rows and ``origin``; the memory stays as it is until a step reads
other rows than it holds. Just before a step the backend asks :func:`line_up` which items the
step's memory rows must hold (:func:`wanted_items`) and how to get them from ``held``
(:func:`memory_selection`):

- one row per item where the step reads an item's memory once for all its rows (every
  decoder's step: its ``item_memory``, ``ITEM_MEMORY_KEY`` in an exported step) and every
  item has the same number ``R`` of rows side by side: always in beam search once its first
  step has ranked, and in greedy search (``R = 1``). The step scores an item's ``R`` queries
  against its keys in one product (``skattn.attention.attention.per_item``; the Transformer's
  cross-attention reads them as ``R`` query positions);
- else one row per row: steps exported before ``ITEM_MEMORY_KEY`` (a Transformer's among
  them until its cross-attention read one row per item too), n-best lists of unequal length.

Nothing is copied when the rows a step reads are those held (an item's beams reordered among
themselves), a view is taken when they are one run of them (items ended at either edge of a
batch, which is sorted by length), and only the rows needed are gathered otherwise (the items
left, not their beams). Imports NumPy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["line_up", "memory_selection", "wanted_items"]


def line_up(
    origin: np.ndarray, held: np.ndarray, item_memory: bool
) -> tuple[np.ndarray, slice | np.ndarray] | None:
    """None when the memory rows held are those the step reads, else ``(wanted, selection)``:
    :func:`wanted_items` and :func:`memory_selection` of them.

    Most steps change nothing (greedy search, an item's beams reordered); they are told apart
    first, in a microsecond: rows that hold their own items, where the first item has one row,
    need nothing, since every item then has one row (``wanted`` is ``origin``) or the counts
    differ (``wanted`` is ``origin`` too)."""
    if (not item_memory or origin.size < 2 or origin[0] != origin[1]) and (
        held is origin or (origin.size == held.size and np.array_equal(origin, held))
    ):
        return None
    wanted = wanted_items(origin, item_memory)
    selection = memory_selection(held, wanted)
    return None if selection is None else (wanted, selection)


def wanted_items(origin: np.ndarray, item_memory: bool) -> np.ndarray:
    """The items the step's memory rows must hold, in order: ``(N / R,)`` each run of rows'
    item where the step reads an item's memory once and every run has ``R`` rows, else
    ``origin`` itself ``(N,)``."""
    if not item_memory or origin.size < 2:
        return origin
    changes = origin[1:] != origin[:-1]  # (N - 1,) a run ends after row i
    if changes.all():  # one row per item (greedy search): wanted is origin
        return origin
    R = int(np.argmax(changes)) + 1 if changes.any() else origin.size  # the first run's rows
    if origin.size % R:
        return origin
    runs = origin.reshape(-1, R)  # (N / R, R)
    if (runs == runs[:, :1]).all() and changes[R - 1 :: R].all():
        return runs[:, 0]
    return origin


def memory_selection(held: np.ndarray, wanted: np.ndarray) -> slice | np.ndarray | None:
    """How to get memory rows holding ``wanted`` from rows holding ``held``: None (they are the
    rows held), a ``slice`` of them (a view), or the ``(M,)`` rows to gather (any row of an item
    serves: an item's rows are equal)."""
    if np.array_equal(held, wanted):
        return None
    window = _window(held, wanted)
    if window is not None:
        return window
    order = np.argsort(held, kind="stable")  # items are any int64 (a long run numbers many)
    return order[np.searchsorted(held, wanted, sorter=order)]


def _window(held: np.ndarray, wanted: np.ndarray) -> slice | None:
    """The rows ``[a, a + M)`` of ``held`` that are ``wanted (M,)``, in order, or None.

    The window is aligned on the end of the first wanted item's run in ``held``, so that an
    item left with fewer beams than it had (rows held one per row) still matches."""
    if wanted.size == 0 or wanted.size >= held.size:  # equal sizes: equal, or not a window
        return None
    first = wanted[0]
    lead = int(np.argmax(wanted != first)) if (wanted != first).any() else wanted.size
    run = np.flatnonzero(held == first)
    if run.size == 0:
        return None
    start = int(run[-1]) + 1 - lead  # the window's first row ends the run where held's does
    if start < 0 or start + wanted.size > held.size:
        return None
    window = slice(start, start + wanted.size)
    return window if np.array_equal(held[window], wanted) else None
