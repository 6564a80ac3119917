"""The corpus' text handling, shared by every reader (corpus_debian.py, corpus_pypi.py): spaces
normalised, paragraphs cut into sentences (abbreviations kept whole), over-long ones cut at ; or :,
and the filters a line must pass (length in words, mostly letters, no links or addresses)."""
from __future__ import annotations

import re
import unicodedata

ABBREV = ("Mr", "Mrs", "Ms", "Dr", "St", "Sr", "Jr", "Prof", "Rev", "Col",
          "Gen", "Capt", "Lt", "Mt", "vs", "etc", "e.g", "i.e", "cf", "viz",
          "No", "Vol", "vol", "pp", "p", "fig", "Fig", "approx", "Co", "Inc",
          "Ltd", "Esq", "Sept", "Jan", "Feb", "Aug", "Oct", "Nov", "Dec")
_ABBR_RE = re.compile(r"\b(" + "|".join(re.escape(a) for a in ABBREV) + r")\.\s")
_SPLIT_RE = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[]*[A-Z0-9])")


def norm_space(s):
    s = unicodedata.normalize("NFC", s)
    s = s.replace("\u00a0", " ").replace("\t", " ")
    return re.sub(r"\s+", " ", s).strip()


def split_sentences(par):
    par = _ABBR_RE.sub(lambda m: m.group(1) + "<DOT> ", par)
    out = []
    for s in _SPLIT_RE.split(par):
        s = s.replace("<DOT>", ".").strip()
        if s:
            out.append(s)
    return out


def words(s):
    return len(s.split())


def keep(s, lo=3, hi=80):
    n = words(s)
    if n < lo or n > hi:
        return False
    letters = sum(c.isalpha() for c in s)
    if letters < 0.6 * len(s.replace(" ", "")):   # mostly symbols/numbers
        return False
    if re.search(r"https?://|www\.|\S+@\S+\.\w+", s):
        return False
    return True


def long_split(s, hi=80):
    """Split an over-long sentence at ; or : (else drop it)."""
    if words(s) <= hi:
        return [s]
    parts = [p.strip() for p in re.split(r"(?<=[;:])\s+", s) if p.strip()]
    return [p for p in parts if words(p) <= hi]


def prose_units(paragraphs, lo=3, hi=80):
    for par in paragraphs:
        par = norm_space(par)
        for s in split_sentences(par):
            for t in long_split(s, hi):
                if keep(t, lo, hi):
                    yield t
