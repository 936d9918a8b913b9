"""The callbacks of :class:`skattn.training.Trainer`: budget, schedules, early stopping, progress.

Each acts on the trainer at named events (``on_train_begin``, ``on_step_end``, ``on_epoch_end``,
``on_train_end``) through its optimizer, module, ``steps`` and ``stop`` flag, as skorch's
callbacks do; :func:`callbacks_for` turns an estimator's parameters into the list of them.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from skattn.training import Trainer

__all__ = [
    "Budget",
    "Callback",
    "CosineSchedule",
    "EarlyStopping",
    "Monitor",
    "PlateauSchedule",
    "ProgressBar",
    "callbacks_for",
]

#: ``PlateauSchedule`` multiplies the learning rate by this after an epoch without progress.
PLATEAU_FACTOR = 0.5


def callbacks_for(params: Mapping[str, Any], n_train: int, validation: bool) -> list[Callback]:
    """The callbacks that carry out an estimator's parameters (``Seq2Seq.get_params()``).

    ``n_train`` training items make ``ceil(n_train / batch_size)`` steps an epoch, as
    ``length_batches`` cuts them; ``validation``: whether a validation split is held out.
    """
    budget = Budget(params["max_steps"], params["max_time"])
    callbacks: list[Callback] = [budget]
    if params["lr_schedule"] == "cosine":
        steps_per_epoch = math.ceil(n_train / params["batch_size"])
        callbacks.append(CosineSchedule(budget, params["max_epochs"], steps_per_epoch))
    monitor_args = (validation, params["early_stopping_metric"], params["tol"])
    if params["lr_schedule"] == "plateau":
        callbacks.append(PlateauSchedule(Monitor.for_metric(*monitor_args)))
    monitor = Monitor.for_metric(*monitor_args)
    callbacks.append(EarlyStopping(monitor, params["n_iter_no_change"], validation))
    callbacks.append(ProgressBar(params["max_epochs"], disable=not params["verbose"]))
    return callbacks


class Callback:
    """Hooks the trainer calls; each does nothing unless overridden."""

    def on_train_begin(self, trainer: Trainer) -> None:
        pass

    def on_step_end(self, trainer: Trainer) -> None:
        pass

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        pass

    def on_train_end(self, trainer: Trainer) -> None:
        pass


class Budget(Callback):
    """Stop after ``max_steps`` optimizer steps or ``max_time`` seconds from the budget's
    creation (validation included), whichever comes first (``None``: no limit).

    Checked after every step and every epoch; the epoch under way is then validated and
    recorded as usual. ``clock`` gives seconds (tests pass a fake one).
    """

    def __init__(
        self,
        max_steps: int | None,
        max_time: float | None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_steps = math.inf if max_steps is None else max_steps
        self.max_time = math.inf if max_time is None else float(max_time)
        self.clock = clock
        self.start = clock()

    def time_share(self) -> float:
        """The share of ``max_time`` spent, capped at 1 (0 without a time limit)."""
        return min((self.clock() - self.start) / self.max_time, 1.0)

    def spent(self, steps: int) -> bool:
        return steps >= self.max_steps or self.clock() - self.start >= self.max_time

    def on_step_end(self, trainer: Trainer) -> None:
        trainer.stop |= self.spent(trainer.steps)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        trainer.stop |= self.spent(trainer.steps)


class CosineSchedule(Callback):
    """``lr_t = lr * (1 + cos(pi p)) / 2``, stepped after every optimizer step.

    ``p = max(t / T, budget.time_share())``, capped at 1, so the rate reaches 0 at whichever
    end of the budget comes first: ``T = min(max_steps, max_epochs * steps_per_epoch)``.
    """

    def __init__(self, budget: Budget, max_epochs: int, steps_per_epoch: int) -> None:
        self.budget = budget
        self.total = min(budget.max_steps, max_epochs * steps_per_epoch)

    def factor(self, t: int) -> float:
        progress = max(min(t, self.total) / self.total, self.budget.time_share())
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def on_train_begin(self, trainer: Trainer) -> None:
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, self.factor)

    def on_step_end(self, trainer: Trainer) -> None:
        self.scheduler.step()


class Monitor:
    """The quantities training is judged by, minimised in order (lexicographically).

    Exact match enters with its sign flipped, and the loss breaks its ties: early in
    training, when no output is right yet, the loss still tells progress.
    """

    def __init__(self, keys: Sequence[str], signs: Sequence[float], tol: float) -> None:
        self.keys, self.signs, self.tol = tuple(keys), tuple(signs), tol
        self.best = (math.inf,) * len(self.keys)

    @classmethod
    def for_metric(cls, validation: bool, metric: str, tol: float) -> Monitor:
        """What ``Seq2Seq`` monitors: the validation ``metric`` (``"loss"`` or
        ``"exact_match"``) with validation items, else the training loss."""
        if not validation:
            return cls(("train_loss",), (1.0,), tol)
        if metric == "exact_match":
            return cls(("val_exact_match", "val_loss"), (-1.0, 1.0), tol)
        return cls(("val_loss",), (1.0,), tol)

    def update(self, record: dict[str, Any]) -> tuple[bool, bool]:
        """``(improved, best)``: whether ``record`` beats the best so far by more than ``tol``
        in the first quantity that differs by more than ``tol``, and whether it is the new
        best (strictly lower, no tolerance)."""
        value = tuple(sign * record[k] for k, sign in zip(self.keys, self.signs, strict=True))
        improved = False
        for new, best in zip(value, self.best, strict=True):
            if new < best - self.tol:
                improved = True
                break
            if new > best + self.tol:
                break
        is_best = value < self.best
        if is_best:
            self.best = value
        return improved, is_best


class EarlyStopping(Callback):
    """Stop after ``patience`` epochs without an improvement of ``monitor`` (as scikit-learn's
    MLP counts them) and, with ``keep_best``, give the module back the best epoch's weights."""

    def __init__(self, monitor: Monitor, patience: int, keep_best: bool) -> None:
        self.monitor, self.patience, self.keep_best = monitor, patience, keep_best
        self.last_improvement, self.best_epoch, self.best_state = 0, 0, None

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        improved, is_best = self.monitor.update(record)
        epoch = record["epoch"]
        if improved:
            self.last_improvement = epoch
        if is_best and self.keep_best:
            self.best_epoch, self.best_state = epoch, copy.deepcopy(trainer.module.state_dict())
        trainer.stop |= epoch - self.last_improvement >= self.patience

    def on_train_end(self, trainer: Trainer) -> None:
        if self.best_state is not None:
            trainer.module.load_state_dict(self.best_state)
            trainer.best_epoch = self.best_epoch


class PlateauSchedule(Callback):
    """Multiply the learning rate by ``factor`` after every epoch that did not improve
    ``monitor`` by its ``tol``."""

    def __init__(self, monitor: Monitor, factor: float = PLATEAU_FACTOR) -> None:
        self.monitor, self.factor = monitor, factor

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        improved, _ = self.monitor.update(record)
        if not improved:
            for group in trainer.optimizer.param_groups:
                group["lr"] *= self.factor


class ProgressBar(Callback):
    """A tqdm bar over epochs on stderr, showing the last record's losses."""

    def __init__(self, max_epochs: int, disable: bool) -> None:
        self.max_epochs, self.disable = max_epochs, disable

    def on_train_begin(self, trainer: Trainer) -> None:
        self.bar = tqdm(total=self.max_epochs, desc="Seq2Seq", unit="epoch", disable=self.disable)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.bar.set_postfix({k: round(v, 4) for k, v in record.items() if "_" in k}, refresh=False)
        self.bar.update()

    def on_train_end(self, trainer: Trainer) -> None:
        self.bar.close()
