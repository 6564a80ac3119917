"""The senses file (assets/corpus/senses.txt): sentences written for bertdemo, each using a word in
one of its senses, a named block per sense. The contrast view's example lists are a word's blocks,
read as written (never a word's lines cut at the half); the corpus search's default corpus takes
its sentences (`build/everyday_corpus.py`).

    # a comment
    [bank: the side of a river]
    I sat on the river bank and watched the water.
    ...

    [bank: a place that keeps money]
    The bank lent me money for a house.

    senses_of("bank")      # [Sense("bank", "the side of a river", [...]), Sense("bank", "a place ...", [...])]
    sense_lists("bank")    # (the first sense's sentences, the second's)
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .. import validate

SENSES = Path(__file__).resolve().parents[2] / "assets" / "corpus" / "senses.txt"
HEADER = re.compile(r"\[\s*(?P<word>[^:\]]+?)\s*:\s*(?P<sense>[^\]]+?)\s*\]")


@dataclass(frozen=True)
class Sense:
    """One block of the senses file: the word, the sense in words, its sentences in file order."""

    word: str
    name: str
    lines: tuple[str, ...]


def read_senses(path: Path | str = SENSES) -> list[Sense]:
    """Every block of the senses file at `path`, in file order. A header is `[word: the sense]` on a
    line of its own; the sentences under it, one per line, are its block until the next header;
    blank lines and lines starting with # are skipped. ValueError (with the line number) for a
    sentence before any header, a malformed header, or a block without a sentence."""
    senses: list[Sense] = []
    word = name = None
    lines: list[str] = []
    where = 0

    def close() -> None:
        if word is not None:
            if not lines:
                raise ValueError(f"{path}, line {where}: the sense [{word}: {name}] has no sentence under it.")
            senses.append(Sense(word, name, tuple(lines)))
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            header = HEADER.fullmatch(line)
            if header is None:
                raise ValueError(f"{path}, line {number}: a sense's header is [word: the sense], got {line!r}.")
            close()
            word, name, lines, where = header["word"], header["sense"], [], number
        elif word is None:
            raise ValueError(f"{path}, line {number}: a sentence before any [word: the sense] header.")
        else:
            lines.append(line)
    close()
    return senses


def sentences(path: Path | str = SENSES) -> list[str]:
    """Every sentence of the senses file, in file order (the headers and comments left out)."""
    return [line for sense in read_senses(path) for line in sense.lines]


def senses_of(word: str, path: Path | str = SENSES) -> list[Sense]:
    """The blocks of `word` (any case), in file order; [] when the file has none."""
    wanted = word.strip().lower()
    return [sense for sense in read_senses(path) if sense.word.lower() == wanted]


def sense_lists(word: str = "bank", path: Path | str = SENSES) -> tuple[list[str], list[str]]:
    """Two uses of `word` for the contrast view: the sentences of its first sense's block and of its
    second's, as the senses file has them (the river bank, then the money bank). InputError naming
    the words that have two senses when `word` has fewer."""
    found = senses_of(word, path)
    if len(found) < 2:
        counts = Counter(sense.word for sense in read_senses(path))
        paired = sorted(w for w, count in counts.items() if count > 1)
        raise validate.InputError("word", f"The senses file has {len(found)} sense(s) of {word!r}; these words "
                                          f"have two or more: {', '.join(paired)}.")
    return list(found[0].lines), list(found[1].lines)
