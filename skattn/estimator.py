"""``Seq2Seq``: attention sequence-to-sequence models behind scikit-learn's estimator API.

The data flow of one ``fit`` / ``predict``::

    strings --tokenize / Vocabulary--> id lists --skattn.training.Trainer--> Seq2SeqModule (fit)
    strings --> id lists --Seq2SeqModule.encode / step--> skattn.core.search --> strings (predict)

This module is the scikit-learn surface: the parameters and their constraints, thin ``fit`` /
``predict`` adapters and pickling. The model's hyperparameters are a
:class:`~skattn.models.ModelConfig`; the training loop is :mod:`skattn.training`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils import Tags, check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from skattn import training
from skattn.core.checks import parse_device
from skattn.core.search import Hypothesis, beam_decode, greedy_decode
from skattn.core.text import EOS, SPECIAL_TOKENS, TOKENIZERS, Vocabulary, detokenize, tokenize
from skattn.metrics import exact_match
from skattn.models import OPTIONS, ModelConfig, Seq2SeqModule

__all__ = ["Seq2Seq"]

#: Items per batch at prediction time (sorted by length, so padding stays small).
PREDICT_BATCH_SIZE = 256


# ---------------------------------------------------------------- constraints and input


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


def _at_least(low: int) -> list:
    return [_Range(Integral, low, None, closed="left")]


def _reals(low: float, high: float | None = None, closed: str = "neither") -> list:
    return [_Range(Real, low, high, closed=closed)]


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


def _refuse_reserved_tokens(targets: list[list[str]]) -> None:
    """A target token spelled like a special one could never be output (a source one is unknown)."""
    reserved = set(SPECIAL_TOKENS).intersection(itertools.chain.from_iterable(targets))
    if reserved:
        raise ValueError(
            f"y holds the token {min(reserved)!r}, which skattn reserves for a special id "
            f"({', '.join(SPECIAL_TOKENS)}): the model could never output it; rename it"
        )


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

    _parameter_constraints: dict[str, list] = {
        **{name: [StrOptions(set(choices))] for name, choices in OPTIONS.items()},
        "input_feeding": ["boolean"],
        "window": _at_least(1),
        "temperature": _reals(0.0),
        "embedding_dim": _at_least(1),
        "hidden_size": _at_least(1),
        "num_layers": _at_least(1),
        "dropout": _reals(0.0, 1.0, closed="left"),
        "num_heads": _at_least(1),
        "beam_size": _at_least(1),
        "length_penalty": _reals(0.0, closed="left"),
        "max_output_length": [*_at_least(1), None],
        "batch_size": _at_least(1),
        "max_epochs": _at_least(1),
        "max_steps": [*_at_least(1), None],
        "max_time": [*_reals(0.0), None],
        "learning_rate": _reals(0.0),
        "lr_schedule": [StrOptions({"constant", "plateau", "cosine"})],
        "label_smoothing": _reals(0.0, 1.0, closed="left"),
        "max_grad_norm": [*_reals(0.0), None],
        "early_stopping": ["boolean"],
        "early_stopping_metric": [StrOptions({"loss", "exact_match"})],
        "validation_fraction": _reals(0.0, 1.0),
        "n_iter_no_change": _at_least(1),
        "tol": _reals(0.0, closed="left"),
        "tokenizer": [StrOptions(set(TOKENIZERS))],
        "device": [_Device()],
        "random_state": [*_at_least(0), np.random.RandomState, None],
        "verbose": ["verbose"],
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

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.two_d_array = False
        tags.target_tags.required = True
        return tags

    # ------------------------------------------------------------ fit

    @_fit_context(prefer_skip_nested_validation=True)
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
        if y is None:
            raise ValueError("Seq2Seq requires y to be passed, but the target y is None")
        sources, _ = _as_token_lists(X, "X", self.tokenizer)
        targets, output_kind = _as_token_lists(y, "y", self.tokenizer)
        if len(sources) != len(targets):
            raise ValueError(
                f"X and y must have the same length, got {len(sources)} and {len(targets)}"
            )
        _refuse_reserved_tokens(targets)
        rng = check_random_state(self.random_state)
        fraction = self.validation_fraction if self.early_stopping else None
        train_idx, val_idx = training.split(len(sources), fraction, rng)
        self.device_ = device = training.resolve_device(self.device)
        self.source_vocab_ = Vocabulary.build(sources)
        self.target_vocab_ = Vocabulary.build(targets)
        self.output_kind_ = output_kind
        self.max_source_length_ = max(len(s) for s in sources)
        self.max_output_length_ = 2 * max(map(len, targets)) + 10
        src = [self.source_vocab_.encode(s) + [EOS] for s in sources]
        tgt = [self.target_vocab_.encode(t) for t in targets]

        seed = int(rng.randint(np.iinfo(np.int32).max))
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            self.module_ = self._build_module().to(device)
            trainer = self._make_trainer(src, tgt, len(train_idx), validation=len(val_idx) > 0)
            self.history_ = trainer.fit(train_idx, val_idx, rng)
        self.n_iter_ = len(self.history_)
        self.n_steps_ = trainer.steps
        self.best_epoch_ = trainer.best_epoch or self.n_iter_
        return self

    def _build_module(self) -> Seq2SeqModule:
        """The untrained module of the fitted vocabularies and this estimator's parameters."""
        config = ModelConfig.from_params(
            self.get_params(),
            source_vocab_size=len(self.source_vocab_),
            target_vocab_size=len(self.target_vocab_),
        )
        return Seq2SeqModule(config)

    def _make_trainer(
        self, src: list[list[int]], tgt: list[list[int]], n_train: int, validation: bool
    ) -> training.Trainer:
        """A trainer for ``module_`` whose callbacks carry out this estimator's parameters."""
        budget = training.Budget(self.max_steps, self.max_time)
        callbacks: list[training.Callback] = [budget]
        if self.lr_schedule == "cosine":
            steps_per_epoch = math.ceil(n_train / self.batch_size)  # as length_batches cuts them
            callbacks.append(training.CosineSchedule(budget, self.max_epochs, steps_per_epoch))
        monitor_args = (validation, self.early_stopping_metric, self.tol)
        if self.lr_schedule == "plateau":
            callbacks.append(training.PlateauSchedule(training.Monitor.for_metric(*monitor_args)))
        monitor = training.Monitor.for_metric(*monitor_args)
        callbacks.append(training.EarlyStopping(monitor, self.n_iter_no_change, validation))
        callbacks.append(training.ProgressBar(self.max_epochs, disable=not self.verbose))
        return training.Trainer(
            self.module_,
            src,
            tgt,
            decode=lambda ids: [h.tokens for h in self._decode_ids(ids, beam_size=1)],
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            max_epochs=self.max_epochs,
            max_grad_norm=self.max_grad_norm,
            label_smoothing=self.label_smoothing,
            callbacks=callbacks,
        )

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

    # ------------------------------------------------------------ predict

    def _tensors(self, id_lists: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return training.to_tensors(id_lists, self.device_)  # (B, T), (B,)

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
