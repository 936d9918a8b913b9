"""Write the stress of the packaged CMUdict split: ``skattn/data/cmudict-0.7b.{split}.stress.gz``.

The standard split (``skattn/data/cmudict-0.7b.{train,test}.gz``) has its stress removed, as the
published G2P results do. CMUdict itself marks every vowel 0 (no stress), 1 (primary) or
2 (secondary). This script finds each line of the split in a stressed CMUdict (the ``cmudict``
package's copy of the dictionary, read as a data file without importing the package) and writes
one line per line of the split: the stress digits of its vowels in order (``HELLO  HH AH L OW``
is ``01``), several space-separated when the dictionary gives the same phonemes with different
stress on more forms than the split has lines for them (``ABSTRACT  AE B S T R AE K T``: ``01``
on one line and ``12`` on the next, as 0.7b had them), and an empty line when it has no such
form (the dictionary was revised after 0.7b).
``skattn.datasets.load_cmudict(split, stress=True)`` puts the digits back on the vowels.

Usage (once, by a maintainer; the output ships in the package)::

    pip download cmudict==1.1.3 --no-deps -d /tmp/cmudict && unzip -q -d /tmp/cmudict \\
        /tmp/cmudict/cmudict-1.1.3-py3-none-any.whl
    python scripts/make_cmudict_stress.py --dict /tmp/cmudict/cmudict/data/cmudict.dict
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path

from skattn.datasets import ARPABET_VOWELS, CMUDICT_SPLITS, load_cmudict

DATA = Path(__file__).resolve().parent.parent / "skattn" / "data"


def read_stressed(path: Path) -> dict[str, list[list[str]]]:
    """word (upper case) -> its stressed pronunciations, in the dictionary's order."""
    entries = collections.defaultdict(list)
    with open(path, encoding="latin-1") as lines:
        for line in lines:
            fields = line.split("#")[0].split()  # the dictionary's comments follow a '#'
            if fields:
                word = re.sub(r"\(\d+\)$", "", fields[0]).upper()  # WORD(2): a variant
                entries[word].append(fields[1:])
    return entries


def stress_digits(stressed: list[str], phonemes: list[str]) -> str | None:
    """The vowels' digits when ``stressed`` is ``phonemes`` with stress marked, else None."""
    if len(stressed) != len(phonemes):
        return None
    digits = []
    for mark, phoneme in zip(stressed, phonemes, strict=True):
        if phoneme in ARPABET_VOWELS:
            if mark[:-1] != phoneme or mark[-1] not in "012":
                return None
            digits.append(mark[-1])
        elif mark != phoneme:
            return None
    return "".join(digits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dict", type=Path, required=True, help="a stressed cmudict.dict")
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args()
    stressed = read_stressed(args.dict)
    for split in CMUDICT_SPLITS:
        words, prons = load_cmudict(split)
        # The split repeats a line where 0.7b stressed the same phonemes two ways (ABSTRACT,
        # noun and adjective), so the i-th repeat takes the i-th stressed form, and the last
        # repeat whatever forms remain: each form once, on as many lines as there are forms.
        repeats = collections.Counter(zip(words, map(tuple, prons), strict=True))
        seen = collections.Counter()
        lines, missing, several = [], 0, 0
        for word, phonemes in zip(words, prons, strict=True):
            key = (word, tuple(phonemes))
            found = [stress_digits(s, phonemes) for s in stressed.get(word, [])]
            found = list(dict.fromkeys(d for d in found if d is not None))
            index, seen[key] = seen[key], seen[key] + 1
            last = index == repeats[key] - 1
            found = found[index:] if last else found[index : index + 1]
            missing += not found
            several += len(found) > 1
            lines.append(" ".join(found))
        path = args.out / f"cmudict-0.7b.{split}.stress.gz"
        with gzip.GzipFile(path, "wb", mtime=0) as out:  # mtime 0: the same bytes every run
            out.write(("\n".join(lines) + "\n").encode("ascii"))
        print(f"{path}: {len(lines)} lines, {missing} without stress, {several} with several")


if __name__ == "__main__":
    main()
