"""skattn.core.memory_rows: which encoder memory rows a decoder step reads."""

import numpy as np
import pytest

from skattn.core.memory_rows import line_up, memory_selection, wanted_items


def runs_of(counts, first=0):
    """``origin`` for items ``first, first + 1, ...`` with ``counts`` rows each."""
    return np.repeat(np.arange(first, first + len(counts)), counts)


@pytest.mark.parametrize(
    "counts, item_memory, wanted",
    [
        ([3, 3, 3], True, [0, 1, 2]),  # an item's beams read one row
        ([3, 3, 3], False, [0, 0, 0, 1, 1, 1, 2, 2, 2]),  # a per-row step
        ([3, 2, 3], True, [0, 0, 0, 1, 1, 2, 2, 2]),  # unequal counts: per row
        ([1, 1, 1], True, [0, 1, 2]),  # greedy
        ([], True, []),
    ],
)
def test_the_items_a_step_reads(counts, item_memory, wanted):
    origin = runs_of(counts)
    np.testing.assert_array_equal(wanted_items(origin, item_memory), wanted)


def test_rows_held_are_kept_viewed_or_gathered():
    held = np.array([4, 5, 6, 7])
    assert memory_selection(held, np.array([4, 5, 6, 7])) is None
    assert memory_selection(held, np.array([5, 6])) == slice(1, 3)  # a view
    np.testing.assert_array_equal(memory_selection(held, np.array([4, 6])), [0, 2])
    per_row = np.array([4, 4, 4, 5, 5, 5])  # one row per beam: the window ends with the run
    assert memory_selection(per_row, np.array([4, 4, 5, 5, 5])) == slice(1, 6)
    far = np.array([10**15, 10**15 + 9])  # item numbers of a long run index nothing
    np.testing.assert_array_equal(memory_selection(far, np.array([10**15 + 9] * 2)), [1, 1])


def test_line_up_agrees_with_its_parts_and_gives_the_rows_it_wants():
    """The quick test for 'nothing to do' is exact: over random searches' rows, line_up says
    None exactly when the items held are the items wanted, and its selection of the held
    rows holds them."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        counts = rng.integers(1, 4, size=rng.integers(0, 6))
        if rng.random() < 0.5:  # equal counts, as in beam search
            counts = np.full(len(counts), rng.integers(1, 4))
        origin = runs_of(counts, first=int(rng.integers(0, 3)))
        item_memory = bool(rng.random() < 0.7)
        held = {
            0: origin,  # one row per row, as selected
            1: np.unique(origin),  # one row per item
            2: np.arange(int(origin.max(initial=0)) + 3),  # more items than are left
        }[int(rng.integers(0, 3))]
        wanted = wanted_items(origin, item_memory)
        lined = line_up(origin, held, item_memory)
        if lined is None:
            np.testing.assert_array_equal(held, wanted)
            continue
        got, selection = lined
        np.testing.assert_array_equal(got, wanted)
        assert not np.array_equal(held, wanted)
        np.testing.assert_array_equal(held[selection], wanted)
