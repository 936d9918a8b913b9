"""The training loop of ``Seq2Seq``: teacher-forced batches, Adam, and callbacks.

One epoch of :meth:`Trainer.fit`::

    item ids --length_batches--> batches --train_step--> Adam step --on_step_end-->
        (CosineSchedule, Budget)
    --evaluate--> history record --on_epoch_end--> (PlateauSchedule, EarlyStopping, Budget,
        ProgressBar)

The loop knows no schedule, budget or stopping rule: each is a :class:`Callback` that acts on
the trainer (its optimizer, module, ``steps`` and ``stop`` flag), as skorch's callbacks do.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from skattn.core.checks import parse_device
from skattn.core.text import BOS, EOS, PAD, pad_batch

__all__ = [
    "Budget",
    "Callback",
    "CosineSchedule",
    "EarlyStopping",
    "Monitor",
    "PlateauSchedule",
    "ProgressBar",
    "Trainer",
    "batch_loss",
    "length_batches",
    "resolve_device",
    "split",
    "to_tensors",
]

#: Validation items per teacher-forced loss batch.
EVAL_BATCH_SIZE = 256
#: Training batches are formed from windows of this many batches' worth of length-sorted items.
BUCKET_BATCHES = 50
#: ``PlateauSchedule`` multiplies the learning rate by this after an epoch without progress.
PLATEAU_FACTOR = 0.5


# ---------------------------------------------------------------- data


def split(
    n: int, validation_fraction: float | None, rng: np.random.RandomState
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled train / validation indices of ``n`` items (no validation for ``None``)."""
    order = rng.permutation(n)
    if validation_fraction is None:
        return order, order[:0]
    n_val = max(1, round(validation_fraction * n))
    if n - n_val < 1:
        raise ValueError(
            f"early_stopping needs at least one training item after the validation split; "
            f"got {n} items with validation_fraction={validation_fraction}"
        )
    return order[n_val:], order[:n_val]


def length_batches(
    indices: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.RandomState
) -> list[np.ndarray]:
    """Shuffled batches of items of similar length, so that little compute goes to padding.

    The items are shuffled, each window of ``BUCKET_BATCHES`` batches' worth is sorted by
    length and cut into batches, and the batches are shuffled.
    """
    order = indices[rng.permutation(len(indices))]
    window = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(np.array_split(chunk, math.ceil(len(chunk) / batch_size)))
    return [batches[i] for i in rng.permutation(len(batches))]


def resolve_device(device: str) -> torch.device:
    """The torch device of a ``device`` setting; ``ValueError`` if CUDA is asked for and absent."""
    kind, index = parse_device(device)
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    missing = not torch.cuda.is_available() or (index or 0) >= torch.cuda.device_count()
    if kind == "cuda" and missing:
        raise ValueError(f"device={device!r} was requested but CUDA device is not available")
    return torch.device(device)


def to_tensors(
    id_lists: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ids ``(B, T)`` and lengths ``(B,)`` on ``device``."""
    ids, lengths = pad_batch(id_lists)
    return torch.from_numpy(ids).to(device), torch.from_numpy(lengths).to(device)


def batch_loss(
    module: torch.nn.Module,
    source: torch.Tensor,
    source_lengths: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, int]:
    """Summed token cross-entropy of a teacher-forced batch, and its number of tokens.

    ``target (B, T_y + 1)`` holds ``[BOS] + tokens + [EOS]``, padded. The loss is
    ``-sum_i log p(y_i | y_<i, x)`` over the decoder outputs ``tokens + [EOS]``, with decoder
    inputs ``[BOS] + tokens``; padding is ignored. With ``label_smoothing`` ``e``, each term
    becomes ``-(1 - e) log p(y_i) - e/V sum_v log p(v)``.
    """
    tgt_in, tgt_out = target[:, :-1], target[:, 1:]  # (B, T_y)
    logits, _ = module(source, source_lengths, tgt_in)  # (B, T_y, V)
    loss = F.cross_entropy(
        logits.transpose(1, 2),
        tgt_out,
        ignore_index=PAD,
        reduction="sum",
        label_smoothing=label_smoothing,
    )
    return loss, int((tgt_out != PAD).sum())


def _mean(losses: Sequence[tuple[float, int]]) -> float:
    """Token-weighted mean of ``(summed loss, tokens)`` pairs."""
    return sum(loss for loss, _ in losses) / max(sum(n for _, n in losses), 1)


# ---------------------------------------------------------------- the loop


class Trainer:
    """Adam on a ``Seq2SeqModule`` over id lists, one epoch at a time, with callbacks.

    Parameters
    ----------
    module : Seq2SeqModule
        Trained in place, on the device its parameters are on.
    src, tgt : list of list of int
        Source ids (each ending with EOS) and target ids (without BOS / EOS), per item.
    decode : callable
        ``decode(source_id_lists) -> output id lists``: greedy decoding, for the validation
        exact match.
    callbacks : sequence of Callback
        Notified in order at each event.

    Attributes
    ----------
    history : list of dict
        One record per epoch: ``epoch``, ``steps``, ``lr`` (the rate the epoch started with),
        ``train_loss``, ``seconds`` and, with validation items, ``val_loss`` and
        ``val_exact_match``.
    steps : int
        Optimizer steps taken.
    stop : bool
        Set by a callback: the epoch under way ends after the current step, then training.
    best_epoch : int or None
        The epoch whose weights the module was given back at the end (set by
        ``EarlyStopping``); ``None``: the last epoch's.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        src: list[list[int]],
        tgt: list[list[int]],
        *,
        decode: Callable[[list[list[int]]], list[list[int]]],
        batch_size: int = 64,
        learning_rate: float = 3e-3,
        max_epochs: int = 100,
        max_grad_norm: float | None = 1.0,
        label_smoothing: float = 0.0,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        self.module, self.src, self.tgt, self.decode = module, src, tgt, decode
        self.device = next(module.parameters()).device
        self.batch_size, self.max_epochs = batch_size, max_epochs
        self.max_grad_norm, self.label_smoothing = max_grad_norm, label_smoothing
        self.callbacks = list(callbacks)
        self.optimizer = torch.optim.Adam(module.parameters(), lr=learning_rate)
        self.history: list[dict[str, Any]] = []
        self.steps = 0
        self.stop = False
        self.best_epoch: int | None = None

    def notify(self, event: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self, *args)

    def fit(
        self, train_idx: np.ndarray, val_idx: np.ndarray, rng: np.random.RandomState
    ) -> list[dict[str, Any]]:
        """Train epoch by epoch until ``max_epochs`` or a callback's ``stop``; the history."""
        self.notify("on_train_begin")
        for epoch in range(1, self.max_epochs + 1):
            start = time.perf_counter()
            lr = self.optimizer.param_groups[0]["lr"]
            train_loss = self.train_epoch(train_idx, rng)
            record = {"epoch": epoch, "steps": self.steps, "lr": lr, "train_loss": train_loss}
            if len(val_idx):
                record |= self.evaluate(val_idx)
            record["seconds"] = time.perf_counter() - start
            self.history.append(record)
            self.notify("on_epoch_end", record)
            if self.stop:
                break
        self.notify("on_train_end")
        self.module.eval()
        return self.history

    def train_epoch(self, train_idx: np.ndarray, rng: np.random.RandomState) -> float:
        """One shuffled pass over the training items (cut short by ``stop``): the mean loss."""
        target_lengths = np.array([len(t) for t in self.tgt])
        losses = []  # (summed loss, tokens) per batch
        for batch in length_batches(train_idx, target_lengths, self.batch_size, rng):
            losses.append(self.train_step(batch))
            self.steps += 1
            self.notify("on_step_end")
            if self.stop:
                break
        return _mean(losses)

    def train_step(self, batch: np.ndarray) -> tuple[float, int]:
        """One Adam step on the mean token loss of ``batch``: its summed loss and tokens."""
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, n_tokens = self.batch_loss(batch, self.label_smoothing)
        (loss / n_tokens).backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return float(loss.detach()), n_tokens

    def batch_loss(
        self, batch: np.ndarray, label_smoothing: float = 0.0
    ) -> tuple[torch.Tensor, int]:
        """:func:`batch_loss` of the items ``batch``."""
        source, source_lengths = to_tensors([self.src[i] for i in batch], self.device)
        target, _ = to_tensors([[BOS, *self.tgt[i], EOS] for i in batch], self.device)
        return batch_loss(self.module, source, source_lengths, target, label_smoothing)

    def evaluate(self, val_idx: np.ndarray) -> dict[str, float]:
        """Teacher-forced loss (no label smoothing) and greedy exact match of ``val_idx``."""
        self.module.eval()
        batches = np.array_split(val_idx, math.ceil(len(val_idx) / EVAL_BATCH_SIZE))
        with torch.inference_mode():
            losses = [self.batch_loss(b) for b in batches]
        predicted = self.decode([self.src[i] for i in val_idx])
        hits = [tokens == self.tgt[i] for tokens, i in zip(predicted, val_idx, strict=True)]
        return {
            "val_loss": _mean([(float(loss), n) for loss, n in losses]),
            "val_exact_match": float(np.mean(hits)),
        }


# ---------------------------------------------------------------- callbacks


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
