"""The corpus search's default corpus (assets/corpus/everyday.txt), rebuilt: an offline build step
like the bundled model's, so the search itself never imports it."""
from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

from ..views.corpus_search import ASSETS, DEFAULT_CORPUS
from ..features import senses
from . import corpus_pypi


def write_default_corpus(chatterbot_wheel: Path | str, out: Path | str = DEFAULT_CORPUS) -> int:
    """Write the default corpus: the English lines of the ChatterBot corpus (chatterbot-corpus
    1.3.3 from PyPI, BSD-3-Clause; `pip download --no-deps chatterbot-corpus==1.3.3`), read from
    its wheel as the bundled model's corpus reads it, then the sentences of assets/corpus/senses.txt
    (written for bertdemo, a block per sense of a word). Deduplicated, any case; returns the number of lines."""
    wheel = Path(chatterbot_wheel)
    with tempfile.TemporaryDirectory() as cache:
        (Path(cache) / "pypi").mkdir()
        shutil.copy(wheel, Path(cache) / "pypi" / wheel.name)
        lines = list(corpus_pypi.chatterbot(cache))
    lines += senses.sentences(ASSETS / "senses.txt")
    kept = list(OrderedDict((line.strip().lower(), line.strip()) for line in lines if line.strip()).values())
    Path(out).write_text("\n".join(kept) + "\n", encoding="utf-8")
    return len(kept)
