"""``Seq2Seq``: attention sequence-to-sequence models behind scikit-learn's estimator API.

The data flow of one ``fit`` / ``predict``::

    strings --tokenize / Vocabulary--> id lists --skattn.training.Trainer--> Seq2SeqModule (fit)
    strings --core.inference.Translator over backend.TorchBackend--> strings      (predict)

This module is the scikit-learn surface: the parameters and their constraints, thin ``fit`` /
``predict`` adapters and pickling. The model's hyperparameters are a
:class:`~skattn.models.ModelConfig`; the training loop is :mod:`skattn.training`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, _fit_context
from sklearn.utils import Tags, check_random_state
from sklearn.utils.validation import check_is_fitted

from skattn import allotment, training
from skattn.backend import Index, TorchBackend, translate
from skattn.core.inference import SearchSettings, Translator, source_ids
from skattn.core.items import (
    as_scored_pairs,
    as_token_lists,
    as_token_pairs,
    refuse_reserved_tokens,
)
from skattn.core.manifest import MAX_OUTPUT_LENGTH
from skattn.core.text import SPECIAL_TOKENS, Vocabulary
from skattn.metrics import exact_match
from skattn.models import ModelConfig, Seq2SeqModule
from skattn.parameters import PARAMETER_CONSTRAINTS
from skattn.pickling import PortableModule
from skattn.rescoring import estimator_log_likelihood

__all__ = ["Seq2Seq"]


class Seq2Seq(PortableModule, BaseEstimator):
    """An attention encoder-decoder for string-to-string tasks, trained with teacher forcing.

    An encoder (bi-RNN or Transformer) reads the source (``tokens + [EOS]``), a decoder (Bahdanau
    or Luong with any scorer, or Transformer) writes the target token by token, greedily
    (``beam_size=1``) or by length-normalised beam search. Sizes per family: ``ModelConfig``.
    The Transformer families take a parameter they do not read at its default only (else
    ``ValueError`` says why); the RNN decoders ignore the settings of other RNN variants
    (``input_feeding`` under Bahdanau, ``window`` under global attention, ``scorer`` under
    ``attention="none"``), so that one grid ranges over all of them.

    Parameters
    ----------
    scorer : {"dot", "general", "additive", "scaled_dot"}, default="additive"
    encoder : {"rnn", "transformer"}, default="rnn"
    decoder : {"bahdanau", "luong", "transformer"}, default="bahdanau"
        ``"bahdanau"`` attends with ``s_{i-1}`` then steps; ``"luong"`` steps, then attends;
        ``"transformer"`` (over the Transformer encoder) has a key-value cache.
    attention : {"global", "local-m", "local-p", "none"}, default="global"
        ``"none"``: the plain encoder-decoder that reads only the final encoder state.
        ``"local-p"`` cuts its window hard at ``|j - p_t| <= window`` around a real-valued
        ``p_t``: on sources of several hundred positions a last-bit difference in ``p_t``
        (another batch, onnxruntime against torch) can move a position across the edge, so
        its answers there are not bit-stable across batches and backends.
    input_feeding, window, cell, embedding_dim, hidden_size, num_layers, dropout, num_heads
        Defaults ``True``, 10, ``"gru"``, 64, 128, 1, 0.0, 1: what each means for each family
        is in :class:`~skattn.models.ModelConfig` (``input_feeding``: Luong only).
    num_kv_heads, ffn_size, positions
        Transformer only, defaults None (= ``num_heads``), None (= ``4 * hidden_size``) and
        ``"sinusoidal"``: grouped-query heads, feed-forward units, position encodings.
    temperature : float, default=1.0
        Attention softmax temperature at prediction time (training uses 1).
    beam_size, length_penalty : int, default=1; float, default=1.0
        Beams (1 is greedy, at most 64), ranked by ``sum(log p) / length ** length_penalty``
        (``length_penalty`` in [0, 10]). A hypothesis cut at ``max_output_length`` never
        competes with one that ended: with as many beams as the model has output tokens, ending
        is always among the best ``beam_size`` extensions, so beams end early and may win over
        better unfinished ones.
    max_output_length : int or None, default=None
        Most output tokens per item, at most 4,096 (what an artifact may carry); ``None`` uses
        ``2 * (longest training target) + 10``, capped at 4,096.
    batch_size : int, default=64
        Items per training step. Each epoch shuffles the items, sorts windows of 50 batches'
        worth by length, cuts them into batches (of at most this many) and shuffles the
        batches: a batch pads little.
    max_epochs : int, default=100
        Passes over the training items at most (the first of the three budgets to end stops).
    max_steps : int or None, default=None
        Stop after this many optimizer steps (the first of the three budgets to end stops).
    max_time : float or None, default=None
        Stop after this many seconds (wall clock, checked after every step; the epoch under
        way is still validated). Unlike the other budgets, it depends on the machine's speed.
    learning_rate : float, default=3e-3
        Adam's initial learning rate.
    weight_decay : float, default=0.0
        Decoupled weight decay (AdamW, Loshchilov & Hutter 2019): before each step every weight
        matrix and embedding is scaled by ``1 - lr_t * weight_decay``; biases and norms' gains
        are not decayed (nanoGPT's rule: tensors of two or more dimensions). 0 is plain Adam.
    lr_schedule : {"constant", "plateau", "cosine", "inverse_sqrt"}, default="cosine"
        ``"plateau"`` halves the rate after each epoch in which the monitored quantity did not
        improve by ``tol``; ``"cosine"``: ``lr_t = learning_rate * (1 + cos(pi p)) / 2`` after
        every step, with progress ``p = max(t / min(max_steps, max_epochs * steps per epoch),
        share of max_time spent)``: 0 at the end of the budget. ``"inverse_sqrt"``:
        ``learning_rate * sqrt(W / max(t, W))`` at step ``t`` (from 1) after ``W`` warmup steps.
    warmup_steps : int, default=0
        The rate rises linearly to its schedule over the first ``W`` steps (any schedule: the
        factors multiply, so with ``"cosine"`` over ``T`` steps the peak, at the ``W``-th
        step, is ``learning_rate * (1 + cos(pi (W - 1) / T)) / 2``, not ``learning_rate``).
        A ``W`` longer than the fit can be (``max_steps``, ``max_epochs`` epochs) is a
        ``ValueError`` when ``fit`` starts.
    average_checkpoints : int, default=1
        Keep the mean of the weights at the end of the kept epoch and the ``k - 1`` before it
        (fewer when the kept epoch is among the first ``k - 1`` of this ``fit``).
    label_smoothing : float, default=0.0
        The target puts ``1 - label_smoothing`` on the reference and spreads the rest over the
        vocabulary (Szegedy et al. 2016); ``val_loss`` stays the plain cross-entropy.
    max_grad_norm : float or None, default=1.0
        Gradients are clipped to this global norm; ``None`` turns clipping off.
    early_stopping : bool, default=True
        Hold out ``validation_fraction`` of the distinct sources (every item of a held-out
        source: validation never scores a source trained on), stop after ``n_iter_no_change``
        epochs without an improvement by ``tol``, keep the best weights (without it: on the
        training loss). A ``warm_start`` fit holds out the sources the model held out before
        (when ``X`` is the same) and keeps the weights it started from if no epoch beats them.
    early_stopping_metric : {"loss", "exact_match"}, default="loss"
        What early stopping and ``"plateau"`` monitor on the validation split: the teacher-
        forced loss, or the greedy exact match (what G2P is judged by) with ties broken by the
        loss. Without ``early_stopping``, the training loss.
    validation_fraction : float, default=0.1
        With ``early_stopping``, the share of the distinct sources held out for validation.
    n_iter_no_change : int, default=5
        Epochs without an improvement by ``tol`` after which training stops (scikit-learn's
        MLP waits one epoch more).
    tol : float, default=1e-3
        Smallest change of the monitored quantity (loss in nats per token) that counts.
    tokenizer : {"char", "space"}, default="char"
        How string items are split into tokens (token-list items are used as they are).
    device : {"auto", "cpu", "cuda", "cuda:N"}, default="auto"
        ``"auto"`` uses CUDA when it is available; on a Ray or Dask worker, the GPU the engine
        reserved for it, else the CPU (:func:`skattn.allotment.auto_device`).
    n_threads : int or None, default=None
        torch threads for ``fit`` and ``predict`` (restored after), at most 1,024; None: the
        process's allotment (Ray's, ``OMP_NUM_THREADS``, affinity, cgroup:
        :mod:`skattn.allotment`).
    precision : {"float32", "bfloat16"}, default="float32"
        The products of training's forward pass (and so of its backward): ``"bfloat16"`` runs
        them in bfloat16 under ``torch.autocast`` (mixed precision: the weights, gradients,
        optimizer, attention softmax and loss stay float32). A CPU with AMX (Intel Sapphire
        Rapids and later) multiplies bfloat16 4-10x faster than float32, a CUDA GPU from Ampere
        on likewise; elsewhere it is emulated, and slower. LSTM layers run in float32 on a CPU
        whose oneDNN has no bfloat16 LSTM (one without AVX-512). ``predict``, scoring and the
        exported model are float32 either way.
    warm_start : bool, default=False
        ``fit`` on a fitted model goes on from its weights, vocabularies and model parameters
        (dropout too; new source tokens read as ``<unk>``) with a fresh optimizer and schedule;
        the same data and ``random_state`` give the same validation split; ``history_`` grows.
    random_state : int, RandomState or None, default=None
        Seeds weights, dropout, shuffling and the split: on CPU, runs are then identical.
    verbose : bool or int, default=False
        Show a progress bar over epochs.

    Attributes
    ----------
    source_vocab_, target_vocab_ : skattn.core.text.Vocabulary
    module_ : skattn.models.Seq2SeqModule
        The trained network, in eval mode, on ``device_``.
    device_ : torch.device
    n_threads_ : int
        The torch threads ``fit`` ran with.
    history_ : list of dict
        One dict per epoch: ``epoch``, ``steps``, ``lr`` (at the epoch's start), ``train_loss``,
        ``seconds`` and, with early stopping, ``val_loss`` and ``val_exact_match``.
    n_iter_, n_steps_ : int
        Epochs run and optimizer steps taken.
    best_epoch_ : int
        The epoch whose weights were kept (counted over every ``warm_start`` fit).
    validation_seed_ : int
        The random state of the validation split, drawn by the first ``fit`` and reused by a
        ``warm_start`` fit, so that it holds out the same sources even with
        ``random_state=None``.
    output_kind_ : {"str", "tokens"}
        What ``predict`` returns, following what ``y`` held in ``fit``.
    max_output_length_ : int
        ``2 * longest target + 10``, the limit when ``max_output_length`` is None. Like
        ``beam_size`` and ``temperature``, ``max_output_length`` may be set after ``fit``.
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

    _parameter_constraints: dict[str, list] = PARAMETER_CONSTRAINTS

    def __init__(
        self,
        *,
        scorer: str = "additive",
        encoder: str = "rnn",
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
        num_kv_heads: int | None = None,
        ffn_size: int | None = None,
        positions: str = "sinusoidal",
        beam_size: int = 1,
        length_penalty: float = 1.0,
        max_output_length: int | None = None,
        batch_size: int = 64,
        max_epochs: int = 100,
        max_steps: int | None = None,
        max_time: float | None = None,
        learning_rate: float = 3e-3,
        weight_decay: float = 0.0,
        lr_schedule: str = "cosine",
        warmup_steps: int = 0,
        average_checkpoints: int = 1,
        label_smoothing: float = 0.0,
        max_grad_norm: float | None = 1.0,
        early_stopping: bool = True,
        early_stopping_metric: str = "loss",
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 5,
        tol: float = 1e-3,
        tokenizer: str = "char",
        device: str = "auto",
        n_threads: int | None = None,
        precision: str = "float32",
        warm_start: bool = False,
        random_state: int | np.random.RandomState | None = None,
        verbose: bool | int = False,
    ) -> None:
        self.scorer = scorer
        self.encoder = encoder
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
        self.num_kv_heads = num_kv_heads
        self.ffn_size = ffn_size
        self.positions = positions
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.max_output_length = max_output_length
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.max_time = max_time
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.warmup_steps = warmup_steps
        self.average_checkpoints = average_checkpoints
        self.label_smoothing = label_smoothing
        self.max_grad_norm = max_grad_norm
        self.early_stopping = early_stopping
        self.early_stopping_metric = early_stopping_metric
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.tokenizer = tokenizer
        self.device = device
        self.n_threads = n_threads
        self.precision = precision
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.one_d_array = True  # X is a 1-D sequence of items
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
        sources, targets, output_kind = as_token_pairs(X, y, self.tokenizer)
        refuse_reserved_tokens(targets, output_kind)
        rng = check_random_state(self.random_state)
        warm = self.warm_start and hasattr(self, "module_")
        fraction = self.validation_fraction if self.early_stopping else None
        # the split's own random state, kept: a warm start holds out the same sources
        seed = getattr(self, "validation_seed_", None) if warm else None
        seed = int(rng.randint(np.iinfo(np.int32).max)) if seed is None else seed
        # Every check runs before a fitted attribute changes: a fit that raises leaves a fitted
        # model as it was (its module, vocabularies and limits still belong together). The
        # model's settings first: a setting it refuses is the error to see, not the data's size.
        if warm:  # the fitted model must be able to continue on this data
            self._fitted_tokenizer()  # its vocabulary holds the tokens of the fitted tokenizer
            vocabularies = (self.source_vocab_, self.target_vocab_)
            limits = (self.max_source_length_, self.max_output_length_)
            training.check_warm_start(
                self.module_.config, self._config(*vocabularies), self.target_vocab_, targets
            )
        else:
            vocabularies = (Vocabulary.build(sources), Vocabulary.build(targets))
            for vocabulary, name in zip(vocabularies, ("X", "y"), strict=True):
                if len(vocabulary) == len(SPECIAL_TOKENS):  # no artifact holds such a model
                    raise ValueError(
                        f"{name} holds no tokens but the reserved ones {list(SPECIAL_TOKENS)} "
                        "(every sequence is empty, say): there is nothing to learn"
                    )
            limits = (0, 0)
            config = self._config(*vocabularies)  # a setting the model refuses raises here
        train_idx, val_idx = training.split(sources, fraction, np.random.RandomState(seed))
        device = training.resolve_device(self.device)
        src = source_ids(vocabularies[0], sources)  # (encode + [EOS]), as predict reads
        tgt = [vocabularies[1].encode(t) for t in targets]  # (BOS / EOS added per batch)

        before = _FittedState(self, warm)  # put back if training fails (diverges, say)
        with (
            before.restored_on_error(),
            training.seeded(rng, device),
            allotment.torch_threads(self.n_threads) as threads,
        ):
            module = self.module_ if warm else _build_module(config)
            # the checks passed: from here on the fitted attributes are this fit's
            self.source_vocab_, self.target_vocab_ = vocabularies
            self.device_, self.output_kind_, self.n_threads_ = device, output_kind, threads
            self.tokenizer_, self.validation_seed_ = self.tokenizer, seed
            # the limits never shrink under warm_start; the default output limit is at most
            # what an artifact may carry
            self.max_source_length_ = max(limits[0], *map(len, sources))
            default_limit = min(2 * max(map(len, targets)) + 10, MAX_OUTPUT_LENGTH)
            self.max_output_length_ = max(limits[1], default_limit)
            self.module_ = module.to(device)
            trainer = training.Trainer.from_params(
                self.module_,
                src,
                tgt,
                self.get_params(),
                n_train=len(train_idx),
                validation=len(val_idx) > 0,
                decode=self._greedy_tokens,
            )
            history = trainer.fit(train_idx, val_idx, rng, baseline=warm)
        earlier = self.history_ if warm else []
        self.history_ = training.continue_history(earlier, history)
        self.n_iter_ = len(self.history_)
        self.n_steps_ = self.history_[-1]["steps"]
        if trainer.best_epoch != 0:  # 0: no epoch beat a warm start's weights, kept as they were
            self.best_epoch_ = len(earlier) + (trainer.best_epoch or len(history))
        return self

    def _config(self, source_vocab=None, target_vocab=None) -> ModelConfig:
        """The model of these vocabularies (default: the fitted ones) and this estimator's
        parameters; raises ValueError for settings the model refuses."""
        source_vocab = self.source_vocab_ if source_vocab is None else source_vocab
        target_vocab = self.target_vocab_ if target_vocab is None else target_vocab
        sizes = {"source_vocab_size": len(source_vocab), "target_vocab_size": len(target_vocab)}
        return ModelConfig.from_params(self.get_params(), **sizes)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "module_")

    def _fitted_tokenizer(self) -> str:
        """The tokenizer the model was fitted with; ``ValueError`` if ``tokenizer`` has been
        set to another since (the vocabulary holds that tokenizer's tokens: another would read
        every source as unknown tokens)."""
        fitted = getattr(self, "tokenizer_", self.tokenizer)  # models saved before tokenizer_
        if self.tokenizer != fitted:
            raise ValueError(
                f"tokenizer={self.tokenizer!r}, but the model was fitted with "
                f"tokenizer={fitted!r}, whose tokens its vocabulary holds; set it back, or fit "
                "again with warm_start=False"
            )
        return fitted

    # ------------------------------------------------------------ predict

    def _translator(self) -> Translator:
        """The core's inference layer over this estimator's module (what the runtime runs)."""
        self.module_.eval()
        vocabularies = (self.source_vocab_, self.target_vocab_)
        backend = TorchBackend(self.module_, self.device_)
        return Translator(backend, *vocabularies, self._fitted_tokenizer(), self.output_kind_)

    def _search_settings(self, beam_size: int | None = None) -> SearchSettings:
        """Prediction-time settings, read at every call (``set_params`` after ``fit`` applies)."""
        beams = self.beam_size if beam_size is None else beam_size
        return SearchSettings(beams, self.length_penalty, self._output_limit(), self.temperature)

    def _greedy_tokens(self, id_lists: list[list[int]]) -> list[list[int]]:
        """Greedy output ids of source id lists: the trainer's validation exact match."""
        hypotheses = self._translator().decode(id_lists, self._search_settings(beam_size=1))
        return [h.tokens for h in hypotheses]

    def _output_limit(self) -> int:
        """Most output tokens per item: ``max_output_length``, else the fitted default."""
        check_is_fitted(self)
        return self.max_output_length or self.max_output_length_  # None: the fitted default

    def _translate(self, X: Sequence, **options) -> tuple[list, list | None]:
        check_is_fitted(self)
        self._validate_params()
        sources, _ = as_token_lists(X, "X", self._fitted_tokenizer())
        with allotment.torch_threads(self.n_threads):
            return translate(self._translator(), sources, self._search_settings(), **options)

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
        return self._translate(X, with_attention=False)[0]

    def predict_attention(self, X: Sequence, layer: Index = None, head: Index = None) -> list:
        """Attention maps of the predicted outputs.

        Parameters
        ----------
        X : sequence of str or of token lists
        layer, head : int, "all" or None, default=None
            Transformer decoder: a layer's (None: the last) and head's (None: their mean)
            cross-attention; each "all" adds a leading axis (:mod:`skattn.core.attention_maps`).

        Returns
        -------
        list of ndarray of shape (n_output_tokens, n_source_tokens + 1)
            One row per predicted output token, one column per source token plus the
            end-of-source marker; every row sums to 1.
        """
        return self._translate(X, with_attention=True, layer=layer, head=head)[1]

    def log_likelihood(self, X: Sequence, y: Sequence) -> np.ndarray:
        """``log p(y | x)`` of each given pair under the model: its summed token
        log-probabilities, EOS included, teacher forced, at the estimator's ``temperature``.
        For the model's greedy answer that ended with EOS, this is the score its search gave
        it (beam search ranks by the same sum divided by its length penalty; an answer cut at
        the output limit has no EOS, which this still counts). For reranking candidates
        (:class:`skattn.rescoring.NBestReranker`). Pairs are scored in padded batches of
        similar length in float32: a pair's value may differ in its last bits (about 1e-7
        relative) with the batch it came in, and from the exported runtime's.

        Parameters
        ----------
        X, y : sequence of str or of token lists
            Sources and the outputs to score (a token outside the target vocabulary: -inf);
            outputs as the model predicts them (token lists for a model fitted on them), each
            at most 4,096 tokens (the most any model writes; ValueError).

        Returns
        -------
        ndarray of shape (n_items,)

        Raises
        ------
        ValueError
            Unfitted, X and y of other lengths, or strings for a model fitted on token lists.
        """
        return estimator_log_likelihood(self, X, y, self._fitted_tokenizer())

    def score(self, X: Sequence, y: Sequence) -> float:
        """Exact match: the fraction of items predicted exactly, token for token, in [0, 1].

        Parameters
        ----------
        X, y : sequence of str or of token lists
        """
        check_is_fitted(self)
        tokenizer = self._fitted_tokenizer()
        targets = as_scored_pairs(X, y, tokenizer, self.output_kind_)
        return exact_match(targets, self.predict(X), tokenizer=tokenizer)

    def export_onnx(
        self,
        path: str | os.PathLike,
        quantize: str | None = None,
        max_source_length: int | None = None,
        *,
        output_order: str = "left_to_right",
    ) -> Path:
        """Write the ONNX artifact directory that ``serving.load`` reads; return its path.

        Parameters
        ----------
        path : str or path-like
        quantize : {None, "int8", "float16"}, default=None
            ``"int8"``: the weight products in int8 for onnxruntime on the CPU only
            (:mod:`skattn.quantize`, each product's input range measured once here, so batch
            composition never changes an answer): about 1.26x the float32 graphs' speed on wide
            models (the bi-GRU 256 G2P member), none on small ones (hidden 64).
            ``"float16"``: the weights stored in float16 and computed in float32
            (:mod:`skattn.float16_weights`): half the bytes on disk, the same speed, any
            device; answers close to float32's, not always equal.
        max_source_length : int, optional
            The longest source, in tokens, that the runtime and the server accept: they refuse
            longer ones (ValueError; HTTP 400) where ``predict`` translates them. Default:
            ``max(1024, the longest training source)``; at most 65,536.
        output_order : {"left_to_right", "right_to_left"}, default="left_to_right"
            ``"right_to_left"``: the model was trained on reversed outputs, and the runtime
            reverses what it writes (``RightToLeft.export_onnx`` passes it).
        """
        check_is_fitted(self)
        self._validate_params()  # set_params may have changed a prediction-time setting
        from skattn.export import export_onnx

        if hasattr(self, "module_"):
            self._fitted_tokenizer()  # the artifact's tokenizer must be the vocabulary's

        return export_onnx(self, path, quantize, max_source_length, output_order=output_order)


class _FittedState:
    """An estimator's fitted attributes (``name_``) before a ``fit``, and its module's weights
    when the fit goes on from them (``warm_start``), put back by :meth:`restored_on_error` if
    the fit raises: a fit that fails (a diverged loss, say) leaves the model as it was,
    unfitted or fitted as before."""

    def __init__(self, estimator: BaseEstimator, warm: bool) -> None:
        self.estimator = estimator
        self.attributes = {name: getattr(estimator, name) for name in _fitted_names(estimator)}
        module = getattr(estimator, "module_", None)
        self.weights = self.device = None
        if warm:  # trained in place, maybe moved to another device: what it had
            self.weights = {name: v.detach().clone() for name, v in module.state_dict().items()}
            self.device = next(module.parameters()).device

    @contextlib.contextmanager
    def restored_on_error(self) -> Iterator[None]:
        # BaseException: a KeyboardInterrupt mid-fit must not leave half of each fit either
        try:
            yield
        except BaseException:
            for name in _fitted_names(self.estimator):
                if name not in self.attributes:
                    delattr(self.estimator, name)
            for name, value in self.attributes.items():
                setattr(self.estimator, name, value)
            if self.weights is not None:
                module = self.estimator.module_.to(self.device)
                module.load_state_dict(self.weights)
                module.eval()
            raise


def _fitted_names(estimator: BaseEstimator) -> list[str]:
    return [name for name in vars(estimator) if name.endswith("_") and not name.startswith("_")]


#: What torch says when a tensor cannot be allocated (CPU allocator, size arithmetic, CUDA).
_ALLOCATION_FAILED = re.compile(r"can't allocate|out of memory|size calculation overflowed", re.I)


def _build_module(config: ModelConfig) -> Seq2SeqModule:
    """The module of ``config``; ``ValueError`` naming its sizes if its weights cannot be
    allocated (sizes within the parameters' limits can still exceed the machine's memory)."""
    try:
        return Seq2SeqModule(config)
    except (MemoryError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and not _ALLOCATION_FAILED.search(str(error)):
            raise
        sizes = ", ".join(
            f"{name}={getattr(config, name)}"
            for name in ("hidden_size", "embedding_dim", "num_layers", "ffn_size")
            if getattr(config, name) is not None
        )
        raise ValueError(
            f"the model's weights do not fit in memory ({sizes}): choose smaller sizes"
        ) from error
