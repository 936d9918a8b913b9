"""The training loop of ``Seq2Seq``: teacher-forced batches, Adam, and callbacks.

One epoch of :meth:`Trainer.fit`::

    item ids --length_batches--> batches --train_step--> Adam step --on_step_end-->
        (CosineSchedule, Budget)
    --evaluate--> history record --on_epoch_end--> (PlateauSchedule, EarlyStopping, Budget,
        ProgressBar)

The loop knows no schedule, budget or stopping rule: each is a :class:`skattn.callbacks.Callback`
that acts on the trainer (its optimizer, module, ``steps`` and ``stop`` flag), as skorch's
callbacks do.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from skattn import allotment
from skattn.callbacks import Callback, callbacks_for
from skattn.core.checks import parse_device
from skattn.core.text import BOS, EOS, PAD, pad_batch

__all__ = [
    "Trainer",
    "adam",
    "batch_loss",
    "check_warm_start",
    "continue_history",
    "length_batches",
    "resolve_device",
    "seeded",
    "split",
    "to_tensors",
]

#: The estimator parameters that are ``Trainer`` arguments of the same name.
_TRAINER_PARAMS = (
    "batch_size",
    "learning_rate",
    "weight_decay",
    "max_epochs",
    "max_grad_norm",
    "label_smoothing",
    "precision",
)
#: ``precision`` -> the dtype of the products under ``torch.autocast`` (None: no autocast).
AUTOCAST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}
#: Validation items per teacher-forced loss batch, at most.
EVAL_BATCH_SIZE = 256
#: Logits (items x target positions x vocabulary) of one validation batch, at most: fewer items
#: a batch for a large vocabulary (a word-level model's), where 256 items took gigabytes.
EVAL_LOGITS = 2**24
#: Training batches are formed from windows of this many batches' worth of length-sorted items.
BUCKET_BATCHES = 50


# ---------------------------------------------------------------- data


def split(
    sources: Sequence[Sequence[str]],
    validation_fraction: float | None,
    rng: np.random.RandomState,
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled train / validation indices of the items of ``sources`` (no validation for
    ``None``), held out by source: ``validation_fraction`` of the distinct sources, with every
    item of each (a word's other pronunciations; a distilled pair beside its reference), so
    that validation never scores a source the model trained on."""
    order = rng.permutation(len(sources))  # (n,)
    if validation_fraction is None:
        return order, order[:0]
    group_of: dict[tuple[str, ...], int] = {}
    groups = np.array([group_of.setdefault(tuple(s), len(group_of)) for s in sources])  # (n,)
    n_val = max(1, round(validation_fraction * len(group_of)))
    if len(group_of) - n_val < 1:
        raise ValueError(
            f"early_stopping needs at least one training source after the validation split; "
            f"got {len(group_of)} distinct sources with validation_fraction={validation_fraction}"
            "; pass early_stopping=False to train on every item"
        )
    held_out = np.zeros(len(group_of), dtype=bool)
    held_out[rng.permutation(len(group_of))[:n_val]] = True
    validation = held_out[groups[order]]  # (n,) in shuffled order
    return order[~validation], order[validation]


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


def check_warm_start(
    fitted: Any, wanted: Any, target_vocab: Any, targets: Sequence[Sequence[str]]
) -> None:
    """Raise ``ValueError`` unless a fitted model (``ModelConfig`` ``fitted``) can continue as
    the estimator's parameters now describe it (``wanted``) on ``targets``.

    ``warm_start`` keeps the weights and so the architecture and the vocabularies: every
    parameter of the model must be as in the first ``fit``, and ``y`` may hold only tokens the
    model can write. (New source tokens are fine: they read as ``<unk>``.)
    """
    changed = [
        f"{name}={getattr(wanted, name)!r} (fitted with {value!r})"
        for name, value in fitted.to_dict().items()
        if getattr(wanted, name) != value and not name.endswith("vocab_size")
    ]
    if changed:
        raise ValueError(
            "warm_start=True continues the fitted model, whose parameters cannot change: "
            f"{', '.join(changed)}; set them back, or fit with warm_start=False"
        )
    unknown = sorted({t for target in targets for t in target if t not in target_vocab})
    if unknown:
        raise ValueError(
            f"warm_start=True keeps the fitted target vocabulary, and y holds tokens the model "
            f"cannot write: {unknown[:10]}; fit with warm_start=False to learn a new vocabulary"
        )


def continue_history(
    before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A warm-started fit's history after the earlier one's: epochs and steps keep counting."""
    epochs, steps = (before[-1]["epoch"], before[-1]["steps"]) if before else (0, 0)
    renumbered = [r | {"epoch": r["epoch"] + epochs, "steps": r["steps"] + steps} for r in after]
    return [*before, *renumbered]


def resolve_device(device: str) -> torch.device:
    """The torch device of a ``device`` setting; ``ValueError`` if CUDA is asked for and absent.

    ``"auto"`` is the GPU a cluster engine reserved for this worker, else the CPU; outside an
    engine the first CUDA device if there is one (:func:`skattn.allotment.auto_device`).
    """
    kind, index = parse_device(device)
    if kind == "auto":
        return torch.device(allotment.auto_device(allotment.current(), torch.cuda.device_count()))
    missing = not torch.cuda.is_available() or (index or 0) >= torch.cuda.device_count()
    if kind == "cuda" and missing:
        raise ValueError(f"device={device!r} was requested but CUDA device is not available")
    return torch.device(device)


@contextmanager
def seeded(rng: np.random.RandomState, device: torch.device) -> Iterator[None]:
    """Seed torch from ``rng`` for the block (weights, dropout) and restore its state after."""
    seed = int(rng.randint(np.iinfo(np.int32).max))
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


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


#: Devices whose Adam torch fuses into one kernel over every parameter.
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def adam(
    parameters: Iterator[torch.nn.Parameter], learning_rate: float, weight_decay: float = 0.0
) -> torch.optim.Adam | torch.optim.AdamW:
    """Adam over ``parameters`` (float32, on one device): torch's fused kernel on the CPU and
    CUDA, its per-tensor loop elsewhere. With ``weight_decay`` ``w > 0``, AdamW (Loshchilov &
    Hutter 2019): each step first scales every weight matrix by ``1 - lr_t w`` (decoupled from
    the gradient's moments), then takes Adam's step. As in nanoGPT, tensors of two or more
    dimensions decay (products' weights, embeddings), biases and norms' gains do not.

    On the CPU torch would otherwise loop over the parameters, a dozen small kernels each:
    a step of the G2P-size bi-GRU (3.2M parameters in 36 tensors, one thread) took 10.6 ms
    looped, 9.8 ms with ``foreach``, 2.1 ms fused (``benchmarks/bench_optimizer.py``), about
    8 % of a float32 training step and more of a bfloat16 one. The update is the same
    (``tests/test_training.py`` checks it against the loop's to float32 rounding).
    """
    parameters = list(parameters)
    fused = bool(parameters) and parameters[0].device.type in FUSED_ADAM_DEVICES
    if not weight_decay:
        return torch.optim.Adam(parameters, lr=learning_rate, fused=fused)
    decayed = [p for p in parameters if p.dim() >= 2]
    kept = [p for p in parameters if p.dim() < 2]
    groups = [
        {"params": decayed, "weight_decay": weight_decay},
        {"params": kept, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=learning_rate, fused=fused)


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
        weight_decay: float = 0.0,
        max_epochs: int = 100,
        max_grad_norm: float | None = 1.0,
        label_smoothing: float = 0.0,
        precision: str = "float32",
        callbacks: Sequence[Callback] = (),
    ) -> None:
        if precision not in AUTOCAST_DTYPES:
            raise ValueError(f"precision must be one of {list(AUTOCAST_DTYPES)}, got {precision!r}")
        self.module, self.src, self.tgt, self.decode = module, src, tgt, decode
        self.device = next(module.parameters()).device
        self.batch_size, self.max_epochs = batch_size, max_epochs
        self.max_grad_norm, self.label_smoothing = max_grad_norm, label_smoothing
        self.autocast_dtype = AUTOCAST_DTYPES[precision]
        if self.device.type == "cuda" and precision == "bfloat16":
            with torch.cuda.device(self.device):
                if not torch.cuda.is_bf16_supported(including_emulation=False):
                    raise ValueError(
                        f"precision='bfloat16' needs a GPU that computes in bfloat16 (Ampere or "
                        f"later); {torch.cuda.get_device_name(self.device)} does not: use "
                        "precision='float32'"
                    )
        self.callbacks = list(callbacks)
        self.optimizer = adam(module.parameters(), learning_rate, weight_decay)
        self.history: list[dict[str, Any]] = []
        self.steps = 0
        self.stop = False
        self.best_epoch: int | None = None

    @classmethod
    def from_params(
        cls,
        module: torch.nn.Module,
        src: list[list[int]],
        tgt: list[list[int]],
        params: Mapping[str, Any],
        *,
        n_train: int,
        validation: bool,
        decode: Callable[[list[list[int]]], list[list[int]]],
    ) -> Trainer:
        """A trainer whose settings and callbacks carry out an estimator's ``get_params()``.

        NumPy scalars become Python numbers first: ``batch_size=np.int8(100)`` is a valid
        parameter, and ``100 * 50`` in int8 arithmetic would wrap to a negative window."""
        params = {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()}
        return cls(
            module,
            src,
            tgt,
            decode=decode,
            **{name: params[name] for name in _TRAINER_PARAMS},
            callbacks=callbacks_for(params, n_train, validation),
        )

    def notify(self, event: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, event)(self, *args)

    def fit(
        self,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        rng: np.random.RandomState,
        baseline: bool = False,
    ) -> list[dict[str, Any]]:
        """Train epoch by epoch until ``max_epochs`` or a callback's ``stop``; the history.

        With ``baseline`` (a warm start) and validation items, the weights training starts
        from are scored first (``on_baseline``), so that early stopping keeps them
        (``best_epoch`` 0) if no epoch beats them."""
        self.notify("on_train_begin")
        if baseline and len(val_idx):
            self.notify("on_baseline", self.evaluate(val_idx))
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
        if not all(bool(torch.isfinite(w).all()) for w in self.module.parameters()):
            raise ValueError(
                "training diverged: the weights are not finite after training; lower "
                "learning_rate, keep max_grad_norm on, or warm up (warmup_steps)"
            )
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
        with self.autocast():
            loss, n_tokens = self.batch_loss(batch, self.label_smoothing)
        value = float(loss.detach())
        if not math.isfinite(value):  # before the update: NaN gradients would spread to weights
            raise ValueError(
                f"training diverged: the loss of step {self.steps + 1} is {value}; lower "
                f"learning_rate (now {self.optimizer.defaults['lr']:g}), keep max_grad_norm "
                "on, or warm up (warmup_steps)"
            )
        (loss / n_tokens).backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return value, n_tokens

    def autocast(self) -> AbstractContextManager:
        """The forward pass of a training step: products in bfloat16 under ``torch.autocast``
        with ``precision="bfloat16"`` (weights, gradients, the optimizer and the loss's softmax
        stay float32; no loss scaling: bfloat16 has float32's exponent range), else nothing."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

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
        positions = 1 + max((len(self.tgt[i]) for i in val_idx), default=0)  # EOS too
        vocabulary = self.module.config.target_vocab_size
        rows = max(1, min(EVAL_BATCH_SIZE, EVAL_LOGITS // (positions * vocabulary)))
        batches = np.array_split(val_idx, math.ceil(len(val_idx) / rows))
        with torch.inference_mode():
            losses = [self.batch_loss(b) for b in batches]
        predicted = self.decode([self.src[i] for i in val_idx])
        hits = [tokens == self.tgt[i] for tokens, i in zip(predicted, val_idx, strict=True)]
        return {
            "val_loss": _mean([(float(loss), n) for loss, n in losses]),
            "val_exact_match": float(np.mean(hits)),
        }
