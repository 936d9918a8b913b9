"""Which queued items form the next batch: the batcher's policy, apart from its mechanism.

:func:`choose_batch` is a pure function of the queue (oldest first) and two limits, so that the
policy can be read and tested on its own, and replaced without touching the queue, the worker
thread or the futures of :class:`serving.batcher.Batcher`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["choose_admissions", "choose_batch"]


class Queued(Protocol):
    """What the policy reads of a queued item."""

    source: str
    temperature: float | None
    maps: tuple | None  # the (layer, head) of the attention maps asked for; None: default
    request: int  # which submit() call it came from (they count up)
    turn: int  # its request's place in the rotation: the lowest goes first


Item = TypeVar("Item", bound=Queued)


def choose_batch(
    pending: Sequence[Item], max_batch_size: int, max_batch_chars: int
) -> tuple[list[Item], list[Item]]:
    """A lead item, then the items of its temperature and maps closest to it in length,
    within ``max_batch_size`` items and ``max_batch_chars`` padded characters; and the rest.

    The lead is the oldest item of the lowest ``turn``: requests take turns in a rotation
    (the batcher moves a request that led behind every request queued then), so a request
    of many long items is served a batch at a time between the others, and an item that
    never fits beside others (a long one) leads within as many batches as there were
    requests queued before it. Returns ``(chosen, remaining)``; ``chosen`` starts with the
    lead, ``remaining`` keeps queue order.
    """
    lead = min(pending, key=lambda item: item.turn)  # the first of the lowest: the oldest
    key = (lead.temperature, lead.maps)  # one runtime call: one temperature, one map selection
    same_key = [item for item in pending if (item.temperature, item.maps) == key]
    length = len(lead.source)
    same_key.sort(key=lambda item: abs(len(item.source) - length))  # stable: oldest first
    same_key.remove(lead)
    chosen, longest = [lead], len(lead.source)
    for item in same_key:
        if len(chosen) == max_batch_size:
            break
        padded = (len(chosen) + 1) * max(longest, len(item.source))
        if padded > max_batch_chars:
            continue
        chosen.append(item)
        longest = max(longest, len(item.source))
    taken = set(map(id, chosen))
    return chosen, [item for item in pending if id(item) not in taken]


def choose_admissions(
    pending: Sequence[Item],
    key: tuple | None,
    rows: int,
    longest: int,
    max_batch_size: int,
    max_batch_chars: int,
) -> tuple[list[Item], list[Item]]:
    """The queued items that join a running set of ``rows`` items at its next step, and the rest.

    ``key`` is the running set's ``(temperature, maps)``; None when it is empty, and then the
    oldest queued item sets it. Only items of that key join, and none while an item of another
    key waits: the set then drains, and once it is empty that item, now the oldest, leads.
    Requests take turns, one item each, in the order of their ``turn`` (the batcher moves a
    request whose item joined behind every request queued then), within ``max_batch_size``
    rows and ``max_batch_chars`` padded characters (rows x the longest source, ``longest`` so
    far). An item that does not fit stops the admissions after it, so that the set shrinks
    until it fits rather than filling with shorter ones for ever; the first item of an empty
    set joins whatever its length. No item waits for ever: newer requests queue behind it.
    ``remaining`` keeps queue order.
    """
    if not pending:
        return [], []
    if key is None:
        key = (pending[0].temperature, pending[0].maps)
    elif any((item.temperature, item.maps) != key for item in pending):
        return [], list(pending)
    turns: dict[int, int] = {}
    order = []
    for index, item in enumerate(pending):
        if (item.temperature, item.maps) != key:
            continue
        nth = turns[item.request] = turns.get(item.request, -1) + 1  # its request's nth item
        order.append((nth, item.turn, index))
    order.sort()
    chosen: list[Item] = []
    for *_, index in order:
        if rows + len(chosen) == max_batch_size:
            break
        item = pending[index]
        width = max(longest, len(item.source))
        if rows + len(chosen) and (rows + len(chosen) + 1) * width > max_batch_chars:
            break
        chosen.append(item)
        longest = width
    taken = set(map(id, chosen))
    return chosen, [item for item in pending if id(item) not in taken]
