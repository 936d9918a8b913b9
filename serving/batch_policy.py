"""Which queued items form the next batch: the batcher's policy, apart from its mechanism.

:func:`choose_batch` is a pure function of the queue (oldest first) and two limits, so that the
policy can be read and tested on its own, and replaced without touching the queue, the worker
thread or the futures of :class:`serving.batcher.Batcher`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

__all__ = ["choose_batch"]


class Queued(Protocol):
    """What the policy reads of a queued item."""

    source: str
    temperature: float | None
    maps: tuple | None  # the (layer, head) of the attention maps asked for; None: default
    request: int  # which submit() call it came from (they count up)


Item = TypeVar("Item", bound=Queued)


def choose_batch(
    pending: Sequence[Item], last_lead: int, max_batch_size: int, max_batch_chars: int
) -> tuple[list[Item], list[Item]]:
    """A lead item, then the items of its temperature and maps closest to it in length,
    within ``max_batch_size`` items and ``max_batch_chars`` padded characters; and the rest.

    The lead is the oldest item of the first request after ``last_lead`` (the request that led
    the latest batch), else the oldest item: requests take turns, so a request of many long
    items is served a batch at a time between the requests that came after it. Returns
    ``(chosen, remaining)``; ``chosen`` starts with the lead, ``remaining`` keeps queue order.
    """
    lead = next((i for i in pending if i.request > last_lead), pending[0])
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
