"""``Seq2Seq``: attention sequence-to-sequence models behind scikit-learn's estimator API.

The data flow of one ``fit`` / ``predict``::

    strings --tokenize / Vocabulary--> id lists --pad_batch--> (B, T) int64 tensors
        --Seq2SeqModule.forward--> logits --cross-entropy--> Adam step        (fit)
        --Seq2SeqModule.encode / step--> skattn.core.search --> ids --> strings   (predict)
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils import Tags, check_random_state
from sklearn.utils.validation import check_is_fitted
from torch.nn import functional as F
from tqdm import tqdm

from skattn.core.search import Hypothesis, beam_decode, greedy_decode
from skattn.core.text import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    TOKENIZERS,
    Vocabulary,
    detokenize,
    pad_batch,
    tokenize,
)
from skattn.metrics import exact_match
from skattn.models import ModelConfig, Seq2SeqModule

__all__ = ["Seq2Seq"]

#: Items per batch at prediction time (sorted by length, so padding stays small).
PREDICT_BATCH_SIZE = 256
#: Training batches are formed from windows of this many batches' worth of length-sorted items.
BUCKET_BATCHES = 50
#: ``lr_schedule="plateau"`` multiplies the learning rate by this after an epoch without progress.
PLATEAU_FACTOR = 0.5


# ---------------------------------------------------------------- parameter constraints
# Each constraint is a small function ``check(name, value)`` that raises ``ValueError``.

Constraint = Callable[[str, Any], None]


def _options(*choices: Any) -> Constraint:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or value not in choices:
            raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")

    return check


def _integer(low: int, *, none_ok: bool = False) -> Constraint:
    def check(name: str, value: Any) -> None:
        if value is None and none_ok:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            kind = f"an int >= {low}" + (" or None" if none_ok else "")
            raise ValueError(f"{name} must be {kind}, got {value!r}")

    return check


def _real(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool,
    high_open: bool = True,
    none_ok: bool = False,
) -> Constraint:
    def check(name: str, value: Any) -> None:
        if value is None and none_ok:
            return
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
        ok = ok and (value > low if low_open else value >= low)
        ok = ok and (value < high if high_open else value <= high)
        if not ok:
            interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
            extra = " or None" if none_ok else ""
            raise ValueError(f"{name} must be a float in {interval}{extra}, got {value!r}")

    return check


def _boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _device(name: str, value: Any) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise ValueError(f"{name} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}")


def _random_state(name: str, value: Any) -> None:
    if value is None or isinstance(value, np.random.RandomState):
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be None, an int >= 0 or a RandomState, got {value!r}")


def _verbose(name: str, value: Any) -> None:
    if not isinstance(value, bool | np.bool_ | numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a bool or an int >= 0, got {value!r}")


# ---------------------------------------------------------------- input handling


def _as_token_lists(items: Any, name: str, tokenizer: str) -> tuple[list[list[str]], str]:
    """Tokenize a sequence of str / token-list items; also say which kind the items were."""
    if isinstance(items, str | bytes) or not hasattr(items, "__len__"):
        raise ValueError(f"{name} must be a sequence of str or of token lists, got {items!r}")
    items = list(items)
    if not items:
        raise ValueError(f"{name} must hold at least one item, got an empty sequence")
    token_lists, kinds = [], set()
    for index, item in enumerate(items):
        if isinstance(item, str):
            token_lists.append(tokenize(item, tokenizer))
            kinds.add("str")
        elif isinstance(item, list | tuple | np.ndarray) and all(isinstance(t, str) for t in item):
            token_lists.append([str(t) for t in item])
            kinds.add("tokens")
        else:
            raise ValueError(f"{name}[{index}] must be a str or a list of str tokens, got {item!r}")
    if len(kinds) > 1:
        raise ValueError(f"{name} must hold only str items or only token lists, not both")
    return token_lists, kinds.pop()


def _improves(new: tuple[float, ...], best: tuple[float, ...], tol: float) -> bool:
    """Whether ``new`` is lower than ``best`` by more than ``tol`` in the first quantity that
    differs by more than ``tol`` (lexicographic order with a tolerance)."""
    for n, b in zip(new, best, strict=True):
        if n < b - tol:
            return True
        if n > b + tol:
            return False
    return False


def _clock() -> float:
    """Seconds on the clock that ``max_time`` is measured with (replaced in tests)."""
    return time.perf_counter()


class _Budget:
    """When training must stop: after ``max_steps`` optimizer steps or ``max_time`` seconds
    from its creation, whichever comes first (``None``: no limit)."""

    def __init__(self, max_steps: int | None, max_time: float | None) -> None:
        self.max_steps = math.inf if max_steps is None else max_steps
        self.max_time = math.inf if max_time is None else float(max_time)
        self.start = _clock()

    def time_share(self) -> float:
        """The share of ``max_time`` spent, capped at 1 (0 without a time limit)."""
        return min((_clock() - self.start) / self.max_time, 1.0)

    def spent(self, steps: int) -> bool:
        return steps >= self.max_steps or _clock() - self.start >= self.max_time


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        index = int(device.split(":")[1]) if ":" in device else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} was requested but CUDA device is not available")
    return torch.device(device)


# ---------------------------------------------------------------- the estimator


class Seq2Seq(BaseEstimator):
    """An attention encoder-decoder for string-to-string tasks, trained with teacher forcing.

    A bidirectional RNN encoder reads the source (``tokens + [EOS]``), an attention decoder
    (Bahdanau or Luong, with any scorer) writes the target token by token; prediction uses greedy
    decoding (``beam_size=1``) or beam search with length-normalised scores.

    Parameters
    ----------
    scorer : {"dot", "general", "additive", "scaled_dot"}, default="additive"
        Attention score function.
    decoder : {"bahdanau", "luong"}, default="bahdanau"
        ``"bahdanau"`` attends with the previous state then steps; ``"luong"`` steps, then
        attends and forms the attentional state ``tanh([c; s] @ W_c)``.
    attention : {"global", "local-m", "local-p", "none"}, default="global"
        ``"none"`` is the plain encoder-decoder that reads only the final encoder state.
    input_feeding : bool, default=True
        Luong only: feed the previous attentional state into the next RNN step.
    window : int, default=10
        Half-width ``D`` of local attention windows.
    temperature : float, default=1.0
        Attention softmax temperature at prediction time (training uses 1).
    cell : {"gru", "lstm"}, default="gru"
    embedding_dim : int, default=64
    hidden_size : int, default=128
        Units per encoder direction and in the decoder.
    num_layers : int, default=1
    dropout : float, default=0.0
    num_heads : int, default=1
        Attention heads (must divide ``hidden_size``).
    beam_size : int, default=1
        1 is greedy decoding.
    length_penalty : float, default=1.0
        Beam hypotheses are ranked by ``sum(log p) / length ** length_penalty``.
    max_output_length : int or None, default=None
        Most output tokens per item; ``None`` uses ``2 * (longest training target) + 10``.
    batch_size : int, default=64
    max_epochs : int, default=100
    max_steps : int or None, default=None
        Stop after this many optimizer steps (whichever of ``max_epochs`` / ``max_steps`` /
        ``max_time`` comes first).
    max_time : float or None, default=None
        Stop after this many seconds of training (wall clock from the first step, validation
        included), checked after every optimizer step; the epoch under way is then validated
        and recorded as usual. A budget that holds however the machine's speed varies; unlike
        the others it makes the result depend on that speed.
    learning_rate : float, default=3e-3
        Adam's (initial) learning rate.
    lr_schedule : {"constant", "plateau", "cosine"}, default="constant"
        ``"plateau"`` halves the learning rate after every epoch in which the monitored
        quantity (see ``early_stopping_metric``) did not improve by ``tol``; ``"cosine"`` decays
        it after every step as ``lr_t = learning_rate * (1 + cos(pi p)) / 2`` down to 0 at the
        end of the budget, where the progress ``p`` is the larger of ``t / T`` (``t`` steps of
        ``T = min(max_steps, max_epochs * steps per epoch)``) and the share of ``max_time``
        spent: the choice for a fixed budget.
    label_smoothing : float, default=0.0
        The training target puts ``1 - label_smoothing`` on the reference token and spreads
        ``label_smoothing`` uniformly over the vocabulary (Szegedy et al. 2016), as
        ``torch.nn.functional.cross_entropy`` does; ``train_loss`` is that smoothed objective,
        ``val_loss`` is always the plain cross-entropy.
    max_grad_norm : float or None, default=1.0
        Gradients are clipped to this global norm; ``None`` turns clipping off.
    early_stopping : bool, default=True
        Hold out ``validation_fraction`` of the data, stop when the validation loss has not
        improved by ``tol`` for ``n_iter_no_change`` epochs, and keep the best weights. Without
        it, training stops when the training loss stalls the same way.
    early_stopping_metric : {"loss", "exact_match"}, default="loss"
        What early stopping (and ``lr_schedule="plateau"``) monitors on the validation split:
        the teacher-forced loss (lower is better) or the greedy exact match (higher is better;
        what sequence tasks such as G2P are judged by, as their loss can rise while more
        outputs become exactly right), ties broken by the loss: early in training, when no
        output is right yet, the loss still tells progress. Without ``early_stopping`` the
        training loss is used.
    validation_fraction : float, default=0.1
    n_iter_no_change : int, default=5
    tol : float, default=1e-3
        Smallest change of the monitored quantity that counts as an improvement (or, for the
        exact match, as a change rather than a tie): the loss is the mean cross-entropy per
        token, in nats.
    tokenizer : {"char", "space"}, default="char"
        How string items are split into tokens (token-list items are used as they are).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        ``"auto"`` uses CUDA when it is available.
    random_state : int, RandomState or None, default=None
        Seeds weight initialisation, dropout, shuffling and the validation split; with a fixed
        seed, results on CPU are identical across runs.
    verbose : bool or int, default=False
        Show a progress bar over epochs.

    Attributes
    ----------
    source_vocab_, target_vocab_ : skattn.core.text.Vocabulary
    module_ : skattn.models.Seq2SeqModule
        The trained network, in eval mode, on ``device_``.
    device_ : torch.device
    history_ : list of dict
        One dict per epoch: ``epoch``, ``steps``, ``lr`` (the learning rate the epoch started
        with), ``train_loss``, ``seconds`` and, with early stopping, ``val_loss`` and
        ``val_exact_match``.
    n_iter_ : int
        Epochs run.
    n_steps_ : int
        Optimizer steps taken.
    best_epoch_ : int
        The epoch whose weights were kept.
    output_kind_ : {"str", "tokens"}
        What ``predict`` returns, following what ``y`` held in ``fit``.
    max_output_length_ : int
        The output limit learned from the data, ``2 * longest target + 10``; used when
        ``max_output_length`` is None (``set_params(max_output_length=...)`` after ``fit`` takes
        effect at the next ``predict``, as ``beam_size`` and ``temperature`` do).
    max_source_length_ : int
        Longest training source in tokens (longer inputs still work).

    Examples
    --------
    >>> from skattn import Seq2Seq
    >>> X = ["123", "4567", "89", "2468", "135"] * 10
    >>> model = Seq2Seq(hidden_size=16, max_epochs=1, random_state=0)
    >>> model.fit(X, [x[::-1] for x in X]).n_iter_
    1
    >>> prediction = model.predict(["321"])[0]  # a str, since y held strings
    >>> model.predict_attention(["321"])[0].shape == (len(prediction), 4)
    True
    """

    _parameter_constraints: dict[str, Constraint] = {
        "scorer": _options("dot", "general", "additive", "scaled_dot"),
        "decoder": _options("bahdanau", "luong"),
        "attention": _options("global", "local-m", "local-p", "none"),
        "input_feeding": _boolean,
        "window": _integer(1),
        "temperature": _real(0.0, low_open=True),
        "cell": _options("gru", "lstm"),
        "embedding_dim": _integer(1),
        "hidden_size": _integer(1),
        "num_layers": _integer(1),
        "dropout": _real(0.0, 1.0, low_open=False),
        "num_heads": _integer(1),
        "beam_size": _integer(1),
        "length_penalty": _real(0.0, low_open=False),
        "max_output_length": _integer(1, none_ok=True),
        "batch_size": _integer(1),
        "max_epochs": _integer(1),
        "max_steps": _integer(1, none_ok=True),
        "max_time": _real(0.0, low_open=True, none_ok=True),
        "learning_rate": _real(0.0, low_open=True),
        "lr_schedule": _options("constant", "plateau", "cosine"),
        "label_smoothing": _real(0.0, 1.0, low_open=False),
        "max_grad_norm": _real(0.0, low_open=True, none_ok=True),
        "early_stopping": _boolean,
        "early_stopping_metric": _options("loss", "exact_match"),
        "validation_fraction": _real(0.0, 1.0, low_open=True),
        "n_iter_no_change": _integer(1),
        "tol": _real(0.0, low_open=False),
        "tokenizer": _options(*TOKENIZERS),
        "device": _device,
        "random_state": _random_state,
        "verbose": _verbose,
    }

    def __init__(
        self,
        *,
        scorer: str = "additive",
        decoder: str = "bahdanau",
        attention: str = "global",
        input_feeding: bool = True,
        window: int = 10,
        temperature: float = 1.0,
        cell: str = "gru",
        embedding_dim: int = 64,
        hidden_size: int = 128,
        num_layers: int = 1,
        dropout: float = 0.0,
        num_heads: int = 1,
        beam_size: int = 1,
        length_penalty: float = 1.0,
        max_output_length: int | None = None,
        batch_size: int = 64,
        max_epochs: int = 100,
        max_steps: int | None = None,
        max_time: float | None = None,
        learning_rate: float = 3e-3,
        lr_schedule: str = "constant",
        label_smoothing: float = 0.0,
        max_grad_norm: float | None = 1.0,
        early_stopping: bool = True,
        early_stopping_metric: str = "loss",
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        tol: float = 1e-3,
        tokenizer: str = "char",
        device: str = "auto",
        random_state: int | np.random.RandomState | None = None,
        verbose: bool | int = False,
    ) -> None:
        self.scorer = scorer
        self.decoder = decoder
        self.attention = attention
        self.input_feeding = input_feeding
        self.window = window
        self.temperature = temperature
        self.cell = cell
        self.embedding_dim = embedding_dim
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.num_heads = num_heads
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.max_output_length = max_output_length
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.max_time = max_time
        self.learning_rate = learning_rate
        self.lr_schedule = lr_schedule
        self.label_smoothing = label_smoothing
        self.max_grad_norm = max_grad_norm
        self.early_stopping = early_stopping
        self.early_stopping_metric = early_stopping_metric
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.tokenizer = tokenizer
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------ scikit-learn protocol

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.two_d_array = False
        tags.target_tags.required = True
        return tags

    def _validate_params(self) -> None:
        """Check every hyperparameter against ``_parameter_constraints``."""
        for name, check in self._parameter_constraints.items():
            check(name, getattr(self, name))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"num_heads must divide hidden_size, got num_heads={self.num_heads} and "
                f"hidden_size={self.hidden_size}"
            )

    # ------------------------------------------------------------ fit

    def fit(self, X: Sequence, y: Sequence) -> Seq2Seq:
        """Learn to map each ``X[i]`` to ``y[i]``.

        Parameters
        ----------
        X : sequence of str or of token lists
            Sources; strings are split by ``tokenizer``.
        y : sequence of str or of token lists, same length as ``X``
            Targets; ``predict`` returns the same kind.

        Returns
        -------
        self : Seq2Seq
        """
        self._validate_params()
        sources, _ = _as_token_lists(X, "X", self.tokenizer)
        targets, output_kind = _as_token_lists(y, "y", self.tokenizer)
        if len(sources) != len(targets):
            raise ValueError(
                f"X and y must have the same length, got {len(sources)} and {len(targets)}"
            )
        rng = check_random_state(self.random_state)
        train_idx, val_idx = self._split(len(sources), rng)
        device = _resolve_device(self.device)

        reserved = set(SPECIAL_TOKENS).intersection(itertools.chain.from_iterable(targets))
        if reserved:  # (a source token like that is simply unknown)
            raise ValueError(
                f"y holds the token {min(reserved)!r}, which skattn reserves for a special id "
                f"({', '.join(SPECIAL_TOKENS)}): the model could never output it; rename it"
            )
        self.source_vocab_ = Vocabulary.build(sources)
        self.target_vocab_ = Vocabulary.build(targets)
        self.output_kind_ = output_kind
        self.max_source_length_ = max(len(s) for s in sources)
        self.max_output_length_ = 2 * max(map(len, targets)) + 10
        self.device_ = device
        src = [self.source_vocab_.encode(s) + [EOS] for s in sources]
        tgt = [self.target_vocab_.encode(t) for t in targets]

        seed = int(rng.randint(np.iinfo(np.int32).max))
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            self.module_ = self._build_module().to(device)
            self._train(src, tgt, train_idx, val_idx, rng)
        self.module_.eval()
        return self

    def _split(self, n: int, rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
        """Shuffled train / validation indices (no validation without early stopping)."""
        order = rng.permutation(n)
        if not self.early_stopping:
            return order, order[:0]
        n_val = max(1, round(self.validation_fraction * n))
        if n - n_val < 1:
            raise ValueError(
                f"early_stopping needs at least one training item after the validation split; "
                f"got {n} items with validation_fraction={self.validation_fraction}"
            )
        return order[n_val:], order[:n_val]

    def _build_module(self) -> Seq2SeqModule:
        """The untrained module of the fitted vocabularies and this estimator's parameters."""
        config = ModelConfig.from_params(
            self.get_params(),
            source_vocab_size=len(self.source_vocab_),
            target_vocab_size=len(self.target_vocab_),
        )
        return Seq2SeqModule(config)

    def _train(
        self,
        src: list[list[int]],
        tgt: list[list[int]],
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        rng: np.random.RandomState,
    ) -> None:
        """The epoch loop: train, validate, record, stop early, keep the best weights."""
        optimizer = torch.optim.Adam(self.module_.parameters(), lr=self.learning_rate)
        budget = _Budget(self.max_steps, self.max_time)
        scheduler = self._cosine_schedule(optimizer, len(train_idx), budget)
        self.history_: list[dict[str, Any]] = []
        self.n_steps_ = 0
        # The monitored quantities are minimised in order: exact match enters with its sign
        # flipped, and the loss breaks its ties.
        keys, signs = ("train_loss",), (1.0,)
        if len(val_idx) and self.early_stopping_metric == "exact_match":
            keys, signs = ("val_exact_match", "val_loss"), (-1.0, 1.0)
        elif len(val_idx):
            keys = ("val_loss",)
        best = (math.inf,) * len(keys)
        best_epoch, best_state, last_improvement = 0, None, 0
        epochs = tqdm(
            range(1, self.max_epochs + 1), desc="Seq2Seq", unit="epoch", disable=not self.verbose
        )
        for epoch in epochs:
            start = time.perf_counter()
            lr = optimizer.param_groups[0]["lr"]
            train_loss = self._train_epoch(optimizer, scheduler, src, tgt, train_idx, rng, budget)
            record = {"epoch": epoch, "steps": self.n_steps_, "lr": lr, "train_loss": train_loss}
            if len(val_idx):
                record |= self._evaluate(src, tgt, val_idx)
            record["seconds"] = time.perf_counter() - start
            self.history_.append(record)
            epochs.set_postfix({k: round(v, 4) for k, v in record.items() if "_" in k})

            # As in scikit-learn's MLP: patience counts epochs without an improvement by more
            # than tol; the weights kept are those of the best monitored value.
            monitored = tuple(sign * record[key] for key, sign in zip(keys, signs, strict=True))
            if _improves(monitored, best, self.tol):
                last_improvement = epoch
            elif self.lr_schedule == "plateau":
                for group in optimizer.param_groups:
                    group["lr"] *= PLATEAU_FACTOR
            if monitored < best:
                best, best_epoch = monitored, epoch
                if len(val_idx):
                    best_state = copy.deepcopy(self.module_.state_dict())
            if epoch - last_improvement >= self.n_iter_no_change or budget.spent(self.n_steps_):
                break
        epochs.close()
        if best_state is not None:
            self.module_.load_state_dict(best_state)
        self.n_iter_ = len(self.history_)
        self.best_epoch_ = best_epoch if best_state is not None else self.n_iter_

    def _cosine_schedule(
        self, optimizer: torch.optim.Optimizer, n_train: int, budget: _Budget
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """``lr_t = lr * (1 + cos(pi p)) / 2`` over the budget training may take, or None.

        ``p = max(t / T, share of max_time spent)``, capped at 1: the steps training may take
        are ``T = min(max_steps, max_epochs * steps per epoch)``.
        """
        if self.lr_schedule != "cosine":
            return None
        steps_per_epoch = math.ceil(n_train / self.batch_size)  # as _length_batches cuts them
        total = min(budget.max_steps, self.max_epochs * steps_per_epoch)

        def factor(t: int) -> float:
            progress = max(min(t, total) / total, budget.time_share())
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)

    def _train_epoch(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        src: list[list[int]],
        tgt: list[list[int]],
        train_idx: np.ndarray,
        rng: np.random.RandomState,
        budget: _Budget,
    ) -> float:
        """One shuffled pass over the training items (cut short when the budget is spent)."""
        target_lengths = np.array([len(t) for t in tgt])
        losses = []  # (summed loss, tokens) per batch
        for batch in _length_batches(train_idx, target_lengths, self.batch_size, rng):
            losses.append(self._train_step(optimizer, src, tgt, batch))
            self.n_steps_ += 1
            if scheduler is not None:
                scheduler.step()
            if budget.spent(self.n_steps_):
                break
        return _mean(losses)

    def _evaluate(
        self, src: list[list[int]], tgt: list[list[int]], val_idx: np.ndarray
    ) -> dict[str, float]:
        """Teacher-forced loss and greedy exact match on the validation items."""
        self.module_.eval()
        batches = np.array_split(val_idx, math.ceil(len(val_idx) / PREDICT_BATCH_SIZE))
        with torch.inference_mode():
            losses = [self._batch_loss(src, tgt, b) for b in batches]
        predicted = self._decode_ids([src[i] for i in val_idx], beam_size=1)
        hits = [h.tokens == tgt[i] for h, i in zip(predicted, val_idx, strict=True)]
        return {
            "val_loss": _mean([(float(loss), n) for loss, n in losses]),
            "val_exact_match": float(np.mean(hits)),
        }

    def _tensors(self, id_lists: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, lengths = pad_batch(id_lists)
        return (
            torch.from_numpy(ids).to(self.device_),  # (B, T)
            torch.from_numpy(lengths).to(self.device_),  # (B,)
        )

    def _batch_loss(
        self,
        src: list[list[int]],
        tgt: list[list[int]],
        batch: np.ndarray,
        label_smoothing: float = 0.0,
    ) -> tuple[torch.Tensor, int]:
        """Summed token cross-entropy of a teacher-forced batch, and its number of tokens.

        ``loss = -sum_i log p(y_i | y_<i, x)`` over the decoder outputs ``tokens + [EOS]``,
        with decoder inputs ``[BOS] + tokens``; padding is ignored. With ``label_smoothing``
        ``e``, each term becomes ``-(1 - e) log p(y_i) - e/V sum_v log p(v)``.
        """
        source, source_lengths = self._tensors([src[i] for i in batch])
        target, _ = self._tensors([[BOS, *tgt[i], EOS] for i in batch])  # (B, T_y + 1)
        tgt_in, tgt_out = target[:, :-1], target[:, 1:]  # (B, T_y)
        logits, _ = self.module_(source, source_lengths, tgt_in)  # (B, T_y, V)
        loss = F.cross_entropy(
            logits.transpose(1, 2),
            tgt_out,
            ignore_index=PAD,
            reduction="sum",
            label_smoothing=label_smoothing,
        )
        return loss, int((tgt_out != PAD).sum())

    def _train_step(
        self,
        optimizer: torch.optim.Optimizer,
        src: list[list[int]],
        tgt: list[list[int]],
        batch: np.ndarray,
    ) -> tuple[float, int]:
        self.module_.train()
        optimizer.zero_grad(set_to_none=True)
        loss, n_tokens = self._batch_loss(src, tgt, batch, self.label_smoothing)
        (loss / n_tokens).backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module_.parameters(), self.max_grad_norm)
        optimizer.step()
        return float(loss.detach()), n_tokens

    # ------------------------------------------------------------ predict

    def _decode_ids(self, id_lists: list[list[int]], beam_size: int) -> list[Hypothesis]:
        """Decode source id lists (each ending with EOS), batched by length, in input order."""
        self.module_.eval()
        order = np.argsort([len(ids) for ids in id_lists], kind="stable")
        results: list[Hypothesis | None] = [None] * len(id_lists)
        for start in range(0, len(order), PREDICT_BATCH_SIZE):
            rows = order[start : start + PREDICT_BATCH_SIZE]
            hyps = self._decode_batch([id_lists[i] for i in rows], beam_size)
            for row, hyp in zip(rows, hyps, strict=True):
                results[row] = hyp
        return results

    @torch.inference_mode()
    def _decode_batch(self, id_lists: list[list[int]], beam_size: int) -> list[Hypothesis]:
        """Encode one batch and decode it through :mod:`skattn.core.search` with a torch backend.

        The carry is ``(*state, memory, keys, mask)``, every tensor batch-first, so ``select``
        is one ``index_select`` on axis 0 of each.
        """
        module, device = self.module_, self.device_
        source, source_lengths = self._tensors(id_lists)  # (B, T), (B,)
        memory, keys, mask, state = module.encode(source, source_lengths)
        n_state = len(state)
        temperature = torch.tensor(float(self.temperature), device=device)

        def step(y_prev: np.ndarray, carry: tuple, position: int):
            log_probs, new_state, weights = module.step(
                torch.from_numpy(y_prev).to(device),
                carry[:n_state],
                *carry[n_state:],
                temperature,
                torch.tensor(position, device=device),
            )
            new_carry = (*new_state, *carry[n_state:])
            return log_probs.float().cpu().numpy(), new_carry, weights.float().cpu().numpy()

        def select(carry: tuple, rows: np.ndarray) -> tuple:
            index = torch.from_numpy(rows).to(device)
            return tuple(t.index_select(0, index) for t in carry)

        carry = (*state, memory, keys, mask)
        max_length = self._output_limit()
        if beam_size == 1:
            return greedy_decode(step, select, carry, len(id_lists), max_length)
        return beam_decode(
            step,
            select,
            carry,
            len(id_lists),
            beam_size,
            max_length,
            self.length_penalty,
        )

    def _output_limit(self) -> int:
        """Most output tokens per item: ``max_output_length``, else the fitted default."""
        check_is_fitted(self)
        if self.max_output_length is None:
            return self.max_output_length_
        return self.max_output_length

    def _predict_hypotheses(self, X: Sequence) -> tuple[list[list[str]], list[Hypothesis]]:
        check_is_fitted(self)
        self._validate_params()
        sources, _ = _as_token_lists(X, "X", self.tokenizer)
        hyps = self._decode_ids(
            [self.source_vocab_.encode(s) + [EOS] for s in sources], self.beam_size
        )
        return sources, hyps

    def predict(self, X: Sequence) -> list:
        """Translate each source.

        Parameters
        ----------
        X : sequence of str or of token lists
            Unknown tokens map to ``<unk>``; sources may be longer than any seen in training.

        Returns
        -------
        list
            One prediction per item: a str when ``y`` held strings in ``fit``, else a token list.
        """
        _, hyps = self._predict_hypotheses(X)
        predictions = [self.target_vocab_.decode(h.tokens) for h in hyps]
        if self.output_kind_ == "str":
            return [detokenize(tokens, self.tokenizer) for tokens in predictions]
        return predictions

    def predict_attention(self, X: Sequence) -> list[np.ndarray]:
        """Attention maps of the predicted outputs.

        Parameters
        ----------
        X : sequence of str or of token lists

        Returns
        -------
        list of ndarray of shape (n_output_tokens, n_source_tokens + 1)
            One row per predicted output token, one column per source token plus the
            end-of-source marker; every row sums to 1.
        """
        sources, hyps = self._predict_hypotheses(X)
        maps = []
        for source, hyp in zip(sources, hyps, strict=True):
            # One row per output token (decoding never emits a special id), the columns of the
            # source and its end-of-source marker.
            maps.append(hyp.weights[: len(hyp.tokens), : len(source) + 1].astype(np.float64))
        return maps

    def score(self, X: Sequence, y: Sequence) -> float:
        """Exact-match accuracy: the fraction of items predicted exactly, token for token.

        Parameters
        ----------
        X : sequence of str or of token lists
        y : sequence of str or of token lists

        Returns
        -------
        float in [0, 1]
        """
        predictions = self.predict(X)
        targets, _ = _as_token_lists(y, "y", self.tokenizer)
        if len(targets) != len(predictions):
            raise ValueError(
                f"X and y must have the same length, got {len(predictions)} and {len(targets)}"
            )
        return exact_match(targets, predictions, tokenizer=self.tokenizer)

    def export_onnx(self, path: str) -> Any:
        """Write the ONNX artifact directory that ``serving.load`` reads.

        Parameters
        ----------
        path : str or path-like
            The directory to write.

        Returns
        -------
        The value of :func:`skattn.export.export_onnx`.
        """
        check_is_fitted(self)
        self._validate_params()  # set_params may have changed a prediction-time setting
        from skattn.export import export_onnx

        return export_onnx(self, path)

    # ------------------------------------------------------------ pickling

    def __getstate__(self) -> dict:
        """Store the module as its config and a CPU state dict, so any machine can load it."""
        state = dict(super().__getstate__())  # a copy: object.__getstate__ returns __dict__
        module = state.pop("module_", None)
        if module is not None:
            state["_module_config"] = module.config.to_dict()
            state["_module_state"] = {k: v.detach().cpu() for k, v in module.state_dict().items()}
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the module; a model trained on a GPU loads on CPU when CUDA is missing."""
        config = state.pop("_module_config", None)
        weights = state.pop("_module_state", None)
        super().__setstate__(state)
        if config is not None:
            device = self.device_
            if device.type == "cuda" and not torch.cuda.is_available():
                device = torch.device("cpu")
            module = Seq2SeqModule(ModelConfig.from_dict(config))
            module.load_state_dict(weights)
            self.module_ = module.to(device).eval()
            self.device_ = device

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "module_")


def _length_batches(
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


def _mean(losses: Sequence[tuple[float, int]]) -> float:
    """Token-weighted mean of ``(summed loss, tokens)`` pairs."""
    return sum(loss for loss, _ in losses) / max(sum(n for _, n in losses), 1)
