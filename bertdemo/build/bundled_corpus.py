"""The bundled model's corpus, assembled from its sources (`python -m bertdemo train-bundled` builds
it first): English text from Debian and PyPI packages whose licence allows training on it and
shipping the model trained on it.

Where each piece lives: the sources, each declared once with its licence (corpus_sources.py);
where their files come from, installed or fetched into a cache (corpus_packages.py); their
readers, Debian packages' files (corpus_debian.py, with R's lazy-load data in corpus_rdata.py)
and PyPI wheels (corpus_pypi.py); sentences and the filters a line must pass (corpus_text.py).
This module reads the chosen sources, deduplicates, splits and writes.

Output (in `out`): train.txt and heldout.txt, one text (a sentence or short line) per line, with
train.src / heldout.src naming each line's source, and sources.json (per source: texts, characters,
word pieces, licence, examples). The held-out 5% is chosen by a hash of the normalised text
(sha1 % 20 == 0), so it is the same whatever order or subset the sources are read in; lines are
deduplicated across sources and sorted by that hash (a deterministic shuffle).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from .corpus_packages import fetch_deb, fetch_pypi
from .corpus_sources import SOURCES


def norm_key(s):
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


def build(out: str | Path, cache: str | Path, fetch: bool = True, sources: list[str] | None = None,
          tokenizer_file: str | Path | None = None, echo=print) -> dict:
    """Build the corpus into `out` from `sources` (default: every source on by default), fetching
    missing packages into `cache` when `fetch`; returns the sources.json content. `tokenizer_file`
    (a tokenizer.json) counts each source's word pieces."""
    out, cache = str(out), str(cache)
    names = sources or [k for k, v in SOURCES.items() if v.default]
    os.makedirs(out, exist_ok=True)
    tok = None
    if tokenizer_file is not None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tokenizer_file))
        tok.no_truncation()
        tok.no_padding()
    seen = set()
    rows = {"train": [], "heldout": []}
    stats = {}
    for name in names:
        src = SOURCES[name]
        if fetch:
            if src.kind == "deb":
                fetch_deb(cache, src.package)
            else:
                fetch_pypi(cache, src.package, src.version)
        st = dict(raw=0, dup=0, texts=0, chars=0, wordpieces=0, heldout=0)
        texts = []
        for t in src.read(cache):
            st["raw"] += 1
            k = norm_key(t)
            if not k or k in seen:
                st["dup"] += 1
                continue
            seen.add(k)
            texts.append(t)
        if tok is not None:
            for i in range(0, len(texts), 4096):
                for e in tok.encode_batch(texts[i:i + 4096], add_special_tokens=False):
                    st["wordpieces"] += len(e.ids)
        for t in texts:
            h = hashlib.sha1(norm_key(t).encode()).hexdigest()
            split = "heldout" if int(h[:8], 16) % 20 == 0 else "train"
            rows[split].append((h, t, name))
            st["heldout"] += split == "heldout"
            st["texts"] += 1
            st["chars"] += len(t)
        st.update(label=src.label, package=src.package, kind=src.kind, licence=src.licence,
                  licence_file=src.licence_file, what=src.what,
                  examples=texts[len(texts) // 3: len(texts) // 3 + 3])
        stats[name] = st
        echo(f"{name:12s} {st['texts']:8d} texts {st['chars']:10d} chars {st['wordpieces']:9d} word "
             f"pieces (dups {st['dup']})  [{src.package}] {src.licence}")
    for split, rs in rows.items():
        rs.sort()
        with open(os.path.join(out, split + ".txt"), "w", encoding="utf-8") as f, \
             open(os.path.join(out, split + ".src"), "w", encoding="utf-8") as g:
            for _, t, n in rs:
                f.write(t + "\n")
                g.write(n + "\n")
    total = {k: sum(s[k] for s in stats.values()) for k in ("texts", "chars", "wordpieces", "heldout")}
    echo(f"{'TOTAL':12s} {total['texts']:8d} texts {total['chars']:10d} chars {total['wordpieces']:9d} "
         f"word pieces; train {len(rows['train'])} held out {len(rows['heldout'])}")
    summary = dict(sources=stats, total=total)
    with open(os.path.join(out, "sources.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    return summary
