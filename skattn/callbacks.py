"""The callbacks of :class:`skattn.training.Trainer`: budget, schedules, early stopping, progress.

Each acts on the trainer at named events (``on_train_begin``, ``on_step_end``, ``on_epoch_end``,
``on_train_end``) through its optimizer, module, ``steps`` and ``stop`` flag, as skorch's
callbacks do; :func:`callbacks_for` turns an estimator's parameters into the list of them.
"""

from __future__ import annotations

import collections
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
    "InverseSqrtSchedule",
    "Monitor",
    "PlateauSchedule",
    "ProgressBar",
    "StepSchedule",
    "average_states",
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
    steps_per_epoch = math.ceil(n_train / params["batch_size"])
    most_steps = min(budget.max_steps, params["max_epochs"] * steps_per_epoch)
    if params["warmup_steps"] > most_steps:
        raise ValueError(
            f"warmup_steps={params['warmup_steps']} is longer than this fit can be "
            f"({most_steps} steps: max_steps={params['max_steps']}, max_epochs="
            f"{params['max_epochs']} of {steps_per_epoch}): the learning rate would never "
            "reach learning_rate; lower warmup_steps or train longer"
        )
    schedule = StepSchedule.for_params(params, budget, steps_per_epoch)
    if schedule is not None:
        callbacks.append(schedule)
    monitor_args = (validation, params["early_stopping_metric"], params["tol"])
    if params["lr_schedule"] == "plateau":
        callbacks.append(PlateauSchedule(Monitor.for_metric(*monitor_args), schedule=schedule))
    monitor = Monitor.for_metric(*monitor_args)
    patience, average = params["n_iter_no_change"], params["average_checkpoints"]
    callbacks.append(EarlyStopping(monitor, patience, validation, average))
    callbacks.append(ProgressBar(params["max_epochs"], disable=not params["verbose"]))
    return callbacks


class Callback:
    """Hooks the trainer calls; each does nothing unless overridden."""

    def on_train_begin(self, trainer: Trainer) -> None:
        pass

    def on_baseline(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """The validation ``record`` of the weights a warm start begins with (epoch 0)."""

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


class StepSchedule(Callback):
    """``lr_t = learning_rate * warmup(t) * decay(t)``, set before every optimizer step ``t``.

    ``warmup(t) = min(1, (t + 1) / W)`` over the first ``W = warmup_steps`` steps (1 without
    warmup), and ``decay`` is the subclass's: 1 (constant), the cosine, or the inverse square
    root. A ``PlateauSchedule`` scales the whole curve through :meth:`scale`.
    """

    def __init__(self, warmup_steps: int = 0) -> None:
        self.warmup_steps = warmup_steps

    @staticmethod
    def for_params(
        params: Mapping[str, Any], budget: Budget, steps_per_epoch: int
    ) -> StepSchedule | None:
        """The schedule of ``lr_schedule`` and ``warmup_steps``; ``None`` if the rate is
        constant (no schedule to step)."""
        name, warmup = params["lr_schedule"], params["warmup_steps"]
        if name == "cosine":
            return CosineSchedule(budget, params["max_epochs"], steps_per_epoch, warmup)
        if name == "inverse_sqrt":
            return InverseSqrtSchedule(warmup)
        return StepSchedule(warmup) if warmup else None

    def warmup(self, t: int) -> float:
        return min(1.0, (t + 1) / self.warmup_steps) if self.warmup_steps else 1.0

    def decay(self, t: int) -> float:
        return 1.0

    def factor(self, t: int) -> float:
        return self.warmup(t) * self.decay(t)

    def scale(self, factor: float) -> None:
        """Multiply the curve (and the current rate) by ``factor``."""
        self.scheduler.base_lrs = [lr * factor for lr in self.scheduler.base_lrs]
        for group in self.scheduler.optimizer.param_groups:
            group["lr"] *= factor

    def on_train_begin(self, trainer: Trainer) -> None:
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, self.factor)

    def on_step_end(self, trainer: Trainer) -> None:
        self.scheduler.step()


class CosineSchedule(StepSchedule):
    """``decay(t) = (1 + cos(pi p)) / 2``, 0 at the end of the budget.

    ``p = max(t / T, budget.time_share())``, capped at 1, so the rate reaches 0 at whichever
    end of the budget comes first: ``T = min(max_steps, max_epochs * steps_per_epoch)``.
    """

    def __init__(
        self, budget: Budget, max_epochs: int, steps_per_epoch: int, warmup_steps: int = 0
    ) -> None:
        super().__init__(warmup_steps)
        self.budget = budget
        self.total = min(budget.max_steps, max_epochs * steps_per_epoch)

    def decay(self, t: int) -> float:
        progress = max(min(t, self.total) / self.total, self.budget.time_share())
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class InverseSqrtSchedule(StepSchedule):
    """``decay(t) = sqrt(W / max(t + 1, W))``: the peak ``learning_rate`` at the end of the
    warmup, then ``1 / sqrt(t)`` (Vaswani et al. 2017, eq. 3, with the peak set directly
    rather than through ``d_model ** -0.5``). Without warmup, ``W = 1``."""

    def decay(self, t: int) -> float:
        w = max(self.warmup_steps, 1)
        return math.sqrt(w / max(t + 1, w))


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
    """Stop after ``patience`` epochs without an improvement of ``monitor`` (scikit-learn's MLP
    runs one more: it stops when more than ``n_iter_no_change`` went without) and give the
    module back the weights it keeps.

    With ``keep_best``, those are the best epoch's; without, the last epoch's. With
    ``average = k > 1`` they are the mean of the weights at the end of that epoch and of the
    ``k - 1`` epochs before it (checkpoint averaging: ``theta = 1/k sum_j theta_{e-j}``, fewer
    when fewer epochs ran); the monitor still judges each epoch's own weights.
    """

    def __init__(self, monitor: Monitor, patience: int, keep_best: bool, average: int = 1) -> None:
        self.monitor, self.patience, self.keep_best = monitor, patience, keep_best
        self.average = average
        self.last_improvement, self.best_epoch, self.best_state = 0, 0, None
        self.recent: collections.deque[dict[str, torch.Tensor]] = collections.deque()

    def on_baseline(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """A warm start's weights are the best so far (epoch 0): an epoch must beat them to
        be kept, as scikit-learn's MLP keeps its best score across warm starts."""
        self.monitor.update(record)
        if self.keep_best:
            self.best_epoch, self.best_state = 0, copy.deepcopy(trainer.module.state_dict())

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        improved, is_best = self.monitor.update(record)
        epoch = record["epoch"]
        if improved:
            self.last_improvement = epoch
        if self.average > 1:
            self.recent.append(copy.deepcopy(trainer.module.state_dict()))
            while len(self.recent) > self.average:
                self.recent.popleft()
        if is_best and self.keep_best:
            self.best_epoch, self.best_state = epoch, self.kept_state(trainer)
        trainer.stop |= epoch - self.last_improvement >= self.patience

    def kept_state(self, trainer: Trainer) -> dict[str, torch.Tensor]:
        """A copy of the module's weights now, averaged over the recent epochs if asked."""
        if self.average == 1:
            return copy.deepcopy(trainer.module.state_dict())
        return average_states(list(self.recent))

    def on_train_end(self, trainer: Trainer) -> None:
        if not self.keep_best and self.average > 1 and self.recent:
            self.best_state = self.kept_state(trainer)
        if self.best_state is not None:
            trainer.module.load_state_dict(self.best_state)
        if self.keep_best and self.best_state is not None:
            trainer.best_epoch = self.best_epoch


def average_states(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts' floating-point tensors (others: the last one's)."""
    last = states[-1]
    return {
        name: torch.stack([s[name] for s in states]).mean(0)
        if tensor.is_floating_point()
        else tensor.clone()
        for name, tensor in last.items()
    }


class PlateauSchedule(Callback):
    """Multiply the learning rate by ``factor`` after every epoch that did not improve
    ``monitor`` by its ``tol`` (through ``schedule``'s curve when a warmup runs)."""

    def __init__(
        self,
        monitor: Monitor,
        factor: float = PLATEAU_FACTOR,
        schedule: StepSchedule | None = None,
    ) -> None:
        self.monitor, self.factor, self.schedule = monitor, factor, schedule

    def on_baseline(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """A warm start's weights set the bar, as for early stopping: the first epoch that
        does not beat them lowers the rate."""
        self.monitor.update(record)

    def on_epoch_end(self, trainer: Trainer, record: dict[str, Any]) -> None:
        improved, _ = self.monitor.update(record)
        if improved:
            return
        if self.schedule is not None:
            self.schedule.scale(self.factor)
            return
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
