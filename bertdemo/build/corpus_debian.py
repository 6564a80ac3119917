"""The corpus' readers of Debian packages' files, one per source (`corpus_sources.SOURCES`), each
yielding text lines: plain text (the Ding dictionary, WordNet, the Jargon File, fortune cookies),
the dictd archives (GCIDE, the Devil's Dictionary), a SWORD module (the World English Bible), R
lazy-load data (Austen's novels, the Harvard sentences: `corpus_rdata`) and HTML (the Debian
Reference). What a package holds is parsed here by hand where no library reads it without the
program it belongs to."""
from __future__ import annotations

import glob
import gzip
import html
import os
import re
import struct
import zlib

from .corpus_packages import deb_root, find_file, need
from .corpus_rdata import r_lazyload
from .corpus_text import keep, norm_space, prose_units, words


def ding(cache):
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


def wn_examples(cache):
    for g in _wn_lines(cache):
        for ex in re.findall(r'"([^"]+)"', g):
            ex = norm_space(ex)
            if keep(ex, 3, 60):
                yield ex


def wn_glosses(cache):
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


def gcide(cache):
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


def devil(cache):
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


def jargon(cache):
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


def web(cache):
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


# ---- R lazy-load data (janeaustenr, stringr: corpus_rdata) --------------
def austen(cache):
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


def harvard(cache):
    rel = "/usr/lib/R/site-library/stringr/data/Rdata.rdb"
    base = need(cache, "r-cran-stringr", rel)[:-4]
    for s in r_lazyload(base)["sentences"]:
        yield norm_space(s)


# ---- HTML and fortune files (off by default) ----------------------------
def debref(cache):
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


def fortunes(cache):
    for p in sorted(glob.glob(os.path.join(deb_root(cache, "fortunes"), "usr/share/games/fortunes/*"))):
        if p.endswith((".dat", ".u8")) or "ascii-art" in p:
            continue
        for ck in open(p, encoding="latin-1").read().split("\n%\n"):
            ck = re.sub(r"\n\s*--.*$", "", ck.strip(), flags=re.S)
            for s in prose_units([ck], 4, 60):
                yield s
