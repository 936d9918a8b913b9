r"""``Seq2SeqEnsemble``: fitted ``Seq2Seq`` models with one vocabulary, decoded as one model.

The data flow (the same as ``Seq2Seq``'s, over :class:`~skattn.models.ensemble.EnsembleModule`)::

    fit:      clone each of ``estimators`` --Seq2Seq.fit on the same X, y--> members
              (or ``from_fitted(models)``) --vocabularies, tokenizer, output kind checked-->
    predict:  strings --core.inference.Translator over TorchBackend(EnsembleModule(members))-->
              strings; at every step ``log p = log_softmax(mean_m log p_m)``
    export:   EnsembleModule --skattn.export--> one artifact (encoder.onnx, decoder_step.onnx,
              decode.onnx, manifest.json) that ``serving.load``, the server and the explorer
              serve like any other

``Seq2Seq.fit`` builds its vocabularies from all of ``X`` and ``y`` in first-seen order, so
members fitted on the same data with the same ``tokenizer`` share them exactly; members fitted
elsewhere (``from_fitted``) are checked, token for token.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs
from sklearn.base import BaseEstimator, _fit_context, clone
from sklearn.frozen import FrozenEstimator
from sklearn.utils import Tags, check_random_state
from sklearn.utils.validation import check_is_fitted

from skattn import allotment
from skattn.backend import TorchBackend
from skattn.core.checks import check_int
from skattn.core.inference import SearchSettings, Translator
from skattn.core.items import as_scored_pairs, as_token_lists
from skattn.core.manifest import MAX_OUTPUT_LENGTH
from skattn.estimator import Seq2Seq
from skattn.metrics import exact_match
from skattn.models.ensemble import EnsembleModule
from skattn.parameters import N_JOBS, PARAMETER_CONSTRAINTS
from skattn.rescoring import estimator_log_likelihood

__all__ = ["Seq2SeqEnsemble"]

#: The prediction-time settings: the same names and constraints as ``Seq2Seq``'s.
_SETTINGS = ("beam_size", "length_penalty", "temperature", "max_output_length", "n_threads")


class Seq2SeqEnsemble(BaseEstimator):
    r"""An ensemble of ``Seq2Seq`` models that averages their per-step log-probabilities.

    Greedy and beam search run once, over all members together: at every step each member
    scores the next token given the same prefix, and the search reads

    .. math:: \log p(v \mid y_{<i}, x) = u(v) - \log \sum_{v'} e^{u(v')}, \qquad
              u(v) = \frac{1}{M} \sum_{m=1}^{M} \log p_m(v \mid y_{<i}, x)

    (the mean of the members' log-probabilities, renormalised; why renormalised:
    :mod:`skattn.models.ensemble`). Attention maps are the mean of the attending members' maps.
    Members may differ in everything but their vocabularies, tokenizer and output kind
    (Bahdanau, Luong and Transformer decoders, any scorer, ``attention="none"``).

    Parameters
    ----------
    estimators : list of Seq2Seq
        ``fit`` clones and fits each on the same data (as ``VotingClassifier`` does). A member
        wrapped in ``sklearn.frozen.FrozenEstimator`` is used as fitted (what
        :meth:`from_fitted` builds).
    beam_size, length_penalty, temperature, max_output_length, n_threads
        Prediction-time settings with ``Seq2Seq``'s meaning and defaults (1, 1.0, 1.0, None,
        None); the members' own are not read, except that ``max_output_length=None`` is the
        largest of the members' limits (each one's ``max_output_length`` or fitted default).
    random_state : int, RandomState or None, default=None
        When set, ``fit`` gives each member that it fits its own seed drawn from it (as
        ``BaggingClassifier`` does), so that clones of one estimator differ; when None the
        members keep their own ``random_state``.
    n_jobs : int or None, default=None
        Members fitted in parallel by joblib (None: one after another).

    Attributes
    ----------
    estimators_ : list of Seq2Seq
        The fitted members (unwrapped from ``FrozenEstimator``).
    source_vocab_, target_vocab_ : skattn.core.text.Vocabulary
        The members' shared vocabularies.
    output_kind_ : {"str", "tokens"}
    max_output_length_ : int
        The largest of the members' output limits: the limit when ``max_output_length`` is None.
    max_source_length_ : int
        The members' longest training source.
    module_ : skattn.models.ensemble.EnsembleModule
        Built on access over the members' modules (not stored, so pickles hold each member once).
    device_ : torch.device
        The members' device.

    Examples
    --------
    >>> from skattn import Seq2Seq, Seq2SeqEnsemble
    >>> X = ["123", "4567", "89", "2468", "135"] * 10
    >>> y = [x[::-1] for x in X]
    >>> members = [Seq2Seq(hidden_size=16, max_epochs=1, random_state=s) for s in (0, 1)]
    >>> ensemble = Seq2SeqEnsemble(members).fit(X, y)
    >>> prediction = ensemble.predict(["321"])[0]
    >>> ensemble.predict_attention(["321"])[0].shape == (len(prediction), 4)
    True
    >>> beam = Seq2SeqEnsemble.from_fitted(ensemble.estimators_, beam_size=3)  # no refitting
    >>> beam.estimators_[0] is ensemble.estimators_[0]
    True
    """

    _parameter_constraints: dict[str, list] = {
        "estimators": [list, tuple],
        **{name: PARAMETER_CONSTRAINTS[name] for name in (*_SETTINGS, "random_state")},
        "n_jobs": N_JOBS,
    }

    def __init__(
        self,
        estimators: list,
        *,
        beam_size: int = 1,
        length_penalty: float = 1.0,
        temperature: float = 1.0,
        max_output_length: int | None = None,
        n_threads: int | None = None,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.estimators = estimators
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.temperature = temperature
        self.max_output_length = max_output_length
        self.n_threads = n_threads
        self.random_state = random_state
        self.n_jobs = n_jobs

    def __sklearn_tags__(self) -> Tags:
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.one_d_array = True  # X is a 1-D sequence of items
        tags.input_tags.two_d_array = False
        tags.target_tags.required = True
        return tags

    # ------------------------------------------------------------ fit

    @_fit_context(prefer_skip_nested_validation=False)  # each member validates its own
    def fit(self, X: Sequence, y: Sequence) -> Seq2SeqEnsemble:
        """Clone and fit every member on ``X``, ``y`` (frozen members as they are).

        Parameters
        ----------
        X, y : sequence of str or of token lists
            As ``Seq2Seq.fit`` takes them.

        Returns
        -------
        self : Seq2SeqEnsemble

        Raises
        ------
        ValueError
            ``estimators`` is empty or holds something other than ``Seq2Seq``, or the fitted
            members disagree on tokenizer, output kind, vocabularies or device.
        """
        members = [clone(e) for e in _checked(self.estimators, "estimators")]
        _check_tokenizers_agree(members)  # before any member trains
        if self.random_state is not None:
            rng = check_random_state(self.random_state)
            for member in members:
                seed = int(rng.randint(np.iinfo(np.int32).max))
                if not isinstance(member, FrozenEstimator):
                    member.set_params(random_state=seed)
        # Frozen members stay in this process: through a worker they came back as copies, a
        # pickle held each twice, and later changes to the user's model never reached them.
        training = [i for i, m in enumerate(members) if not isinstance(m, FrozenEstimator)]
        for member in members:  # a frozen member unfitted: NotFittedError, before any training
            if isinstance(member, FrozenEstimator):
                member.fit(X, y)  # (reads nothing: it checks that the model is fitted)
        n_jobs = min(effective_n_jobs(self.n_jobs), max(1, len(training)))  # a worker a member
        fitted = Parallel(n_jobs=n_jobs)(delayed(_fit_member)(members[i], X, y) for i in training)
        for i, member in zip(training, fitted, strict=True):
            members[i] = member
        return self._adopt(members)

    @classmethod
    def from_fitted(cls, models: Sequence[Seq2Seq], **params) -> Seq2SeqEnsemble:
        """A fitted ensemble of already fitted models, used as they are (no data needed).

        ``estimators`` becomes ``[FrozenEstimator(m) for m in models]``, so ``clone`` and a
        later ``fit`` keep the members as they are, as scikit-learn's frozen estimators do.

        Parameters
        ----------
        models : sequence of fitted Seq2Seq
            Trained anywhere (another process, a ``joblib.load``), on data with the same
            vocabularies.
        **params
            The ensemble's other parameters (``beam_size=5``, ...).

        Raises
        ------
        ValueError
            ``models`` is empty, holds an unfitted model or something else, or the models'
            vocabularies, tokenizers, output kinds or devices differ.
        """
        takes = [name for name in cls._get_param_names() if name != "estimators"]
        unknown = sorted(set(params) - set(takes))
        if unknown:  # (the members are models; the rest: the ensemble's own parameters)
            raise ValueError(f"from_fitted got {unknown}, which it does not take; it takes {takes}")
        models = _checked(models, "models")
        for i, model in enumerate(models):
            if not model.__sklearn_is_fitted__():
                raise ValueError(f"models[{i}] is not fitted: from_fitted takes fitted models")
        ensemble = cls([FrozenEstimator(m) for m in models], **params)
        ensemble._validate_params()
        return ensemble._adopt(models)

    def _adopt(self, fitted: list) -> Seq2SeqEnsemble:
        """Take fitted members after checking that they can be decoded as one model; members
        that cannot leave the ensemble as it was (unfitted, or fitted with its old members)."""
        members = [m.estimator if isinstance(m, FrozenEstimator) else m for m in fitted]
        _check_members(members)
        self.estimators_ = members
        self.__dict__.pop("_module", None)  # built again from these members when needed
        return self._read_members()

    def _read_members(self) -> Seq2SeqEnsemble:
        """Check that the members still decode as one model, and take what they share as they
        are now: a member fitted again with ``warm_start`` keeps its module object (trained in
        place), and ``set_params`` may have changed its limits."""
        members = self.estimators_
        first = members[0]
        _check_members(members)
        self.source_vocab_, self.target_vocab_ = first.source_vocab_, first.target_vocab_
        self.output_kind_ = first.output_kind_
        self.max_output_length_ = max(m._output_limit() for m in members)
        self.max_source_length_ = max(m.max_source_length_ for m in members)
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "estimators_")

    @property
    def tokenizer(self) -> str | None:
        """The members' tokenizer (the scorers in :mod:`skattn.scoring` read it).

        Once fitted, the tokenizer the members were fitted with: ``ValueError`` if a member's
        ``tokenizer`` has been set to another since (as ``Seq2Seq.predict`` refuses it)."""
        if hasattr(self, "estimators_"):
            return _fitted_tokenizers(self.estimators_)
        if not isinstance(self.estimators, list | tuple):  # fit names what is wrong with it
            return None
        return getattr(next(iter(self.estimators), None), "tokenizer", None)

    @property
    def device_(self) -> torch.device:
        check_is_fitted(self)
        return self.estimators_[0].device_

    @property
    def module_(self) -> EnsembleModule:
        """The members behind one seam, built once (and again if a member's module object
        changed: a member fitted again from scratch). Each access first checks the members
        again and takes their vocabularies and limits as they are now."""
        check_is_fitted(self)
        self._read_members()
        modules = [m.module_ for m in self.estimators_]
        cached = self.__dict__.get("_module")
        if cached is None or list(cached.members) != modules:  # modules compare by identity
            cached = self.__dict__["_module"] = EnsembleModule(modules)
        return cached

    def __getstate__(self) -> dict:
        """A pickle holds each member once: the cached ensemble module is left out."""
        state = dict(super().__getstate__())
        state.pop("_module", None)
        return state

    # ------------------------------------------------------------ predict

    def _output_limit(self) -> int:
        """Most output tokens per item: ``max_output_length``, else the members' largest."""
        check_is_fitted(self)
        return self.max_output_length or self.max_output_length_

    def _translator(self) -> Translator:
        """The core's inference layer over the combined members (what the runtime runs)."""
        module = self.module_.eval()  # first: members fitted again are taken, limits and all
        vocabularies = (self.source_vocab_, self.target_vocab_)
        backend = TorchBackend(module, self.device_)
        return Translator(backend, *vocabularies, self.tokenizer, self.output_kind_)

    def _translate(self, X: Sequence, with_attention: bool) -> tuple[list, list | None]:
        check_is_fitted(self)
        self._validate_params()  # set_params may have changed a prediction-time setting
        translator = self._translator()
        sources, _ = as_token_lists(X, "X", self.tokenizer)
        settings = SearchSettings(
            beam_size=self.beam_size,
            length_penalty=self.length_penalty,
            max_length=self._output_limit(),
            temperature=self.temperature,
        )
        with allotment.torch_threads(self.n_threads):
            return translator.translate(sources, settings, with_attention)

    def log_likelihood(self, X: Sequence, y: Sequence) -> np.ndarray:
        """``log p(y | x)`` of each given pair under the ensemble's combined distribution (see
        ``Seq2Seq.log_likelihood``)."""
        return estimator_log_likelihood(self, X, y, self.tokenizer)

    def predict(self, X: Sequence) -> list:
        """Translate each source with the ensemble (see ``Seq2Seq.predict``).

        Parameters
        ----------
        X : sequence of str or of token lists

        Returns
        -------
        list
            One prediction per item: a str when the members were fitted on strings, else a
            token list.
        """
        return self._translate(X, with_attention=False)[0]

    def predict_attention(self, X: Sequence, layer: None = None, head: None = None) -> list:
        """Attention maps of the ensemble's predictions: the attending members' mean.

        Parameters
        ----------
        X : sequence of str or of token lists
        layer, head : None
            Only None: one Transformer layer's or head's map is a single model's (a member's
            ``predict_attention(X, layer=..., head=...)``), not the ensemble's.

        Returns
        -------
        list of ndarray of shape (n_output_tokens, n_source_tokens + 1)
            Rows sum to 1.
        """
        for name, value in (("layer", layer), ("head", head)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r}: an ensemble reports its mean attention map only; ask a "
                    f"member (ensemble.estimators_[i].predict_attention(X, {name}=...))"
                )
        return self._translate(X, with_attention=True)[1]

    def score(self, X: Sequence, y: Sequence) -> float:
        """Exact match of the ensemble's predictions, in [0, 1] (as ``Seq2Seq.score``).

        Parameters
        ----------
        X, y : sequence of str or of token lists
        """
        check_is_fitted(self)
        targets = as_scored_pairs(X, y, self.tokenizer, self.output_kind_)
        return exact_match(targets, self.predict(X), tokenizer=self.tokenizer)

    def export_onnx(
        self,
        path: str | os.PathLike,
        quantize: str | None = None,
        max_source_length: int | None = None,
        *,
        output_order: str = "left_to_right",
    ) -> Path:
        """Write one artifact directory for the whole ensemble; ``serving.load`` reads it.

        Its manifest's ``model`` is ``{"ensemble": [each member's ModelConfig], "combination":
        ...}``, its state names ``m<i>_<name>``, and its ``decoder`` names every member
        (``"ensemble(bahdanau+luong)"``).

        Parameters
        ----------
        path : str or path-like
        quantize : {None, "int8", "float16"}, default=None
            ``"int8"``: the weight products in int8 for onnxruntime on the CPU only
            (:mod:`skattn.quantize`, each product's input range measured once here, so batch
            composition never changes an answer): 1.41-1.53x the float32 graphs' speed on a
            bi-GRU 256 G2P member on an AVX2 CPU, up to 1.68-1.82x with AVX-512 VNNI (greedy,
            beam 5), no dependable gain on small models.
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
        self._validate_params()
        from skattn.export import export_onnx

        return export_onnx(self, path, quantize, max_source_length, output_order=output_order)


def _checked(estimators: object, name: str) -> list:
    """``estimators`` as a non-empty list of ``Seq2Seq`` (frozen or not), else ValueError."""
    if not isinstance(estimators, list | tuple) or not estimators:
        raise ValueError(f"{name} must be a non-empty list of Seq2Seq, got {estimators!r:.80}")
    for i, e in enumerate(estimators):
        inner = e.estimator if isinstance(e, FrozenEstimator) else e
        if not isinstance(inner, Seq2Seq):
            raise ValueError(f"{name}[{i}] must be a Seq2Seq, got {type(inner).__name__}")
    return list(estimators)


def _fit_member(member, X: Sequence, y: Sequence):
    return member.fit(X, y)


def _fitted_tokenizers(members: Sequence[Seq2Seq]) -> str:
    """The tokenizer the members were fitted with (ValueError naming a member whose
    ``tokenizer`` was changed after its fit; ``_check_agrees`` compares them across members)."""
    for i, member in enumerate(members):
        try:
            member._fitted_tokenizer()
        except ValueError as error:
            raise ValueError(f"estimators[{i}]: {error}") from None
    return members[0].tokenizer


def _check_members(members: Sequence[Seq2Seq]) -> None:
    """ValueError unless fitted ``members`` can be decoded as one model."""
    _fitted_tokenizers(members)
    for i, member in enumerate(members):  # the ensemble's default limit is theirs (predict
        # checks it on the member itself only: an ensemble would decode to any length)
        name = f"estimators[{i}].max_output_length"
        check_int(member.max_output_length, name, 1, MAX_OUTPUT_LENGTH, none_ok=True)
    for i, member in enumerate(members[1:], start=1):
        _check_agrees(members[0], member, i)


def _check_tokenizers_agree(members: Sequence) -> None:
    """ValueError naming the first member whose ``tokenizer`` differs from the first's: found
    before training, not after every member trained (a frozen member reads its model's)."""
    first = members[0].tokenizer
    for i, member in enumerate(members[1:], start=1):
        if member.tokenizer != first:
            raise ValueError(
                f"estimators[{i}] has tokenizer={member.tokenizer!r} but estimators[0] has "
                f"{first!r}: the members of an ensemble read and write the same tokens"
            )


def _check_agrees(first: Seq2Seq, member: Seq2Seq, i: int) -> None:
    """Refuse a member that cannot share a search with the first (ValueError naming it)."""
    for what in ("tokenizer", "output_kind_", "device_"):
        a, b = getattr(first, what), getattr(member, what)
        if what == "device_":  # torch.device("cuda") != torch.device("cuda:0"): compare both
            a, b = (a.type, a.index or 0), (b.type, b.index or 0)
        if a != b:
            raise ValueError(
                f"estimators[{i}] has {what}={b!r} but estimators[0] has {a!r}: the members of "
                "an ensemble read and write the same tokens on one device"
            )
    for what in ("source_vocab_", "target_vocab_"):
        a, b = getattr(first, what).to_list(), getattr(member, what).to_list()
        if a != b:
            pairs = zip(a, b, strict=False)  # the first id where they differ
            where = next((j for j, (s, t) in enumerate(pairs) if s != t), min(len(a), len(b)))
            raise ValueError(
                f"estimators[{i}].{what} differs from estimators[0]'s ({len(b)} vs {len(a)} "
                f"tokens, first at id {where}): members must share one vocabulary, so fit "
                "them on the same X and y"
            )
