"""Text a model cannot read: a sentence in a script its vocabulary barely covers (Arabic or Hebrew
on an English BERT), or whose words mostly come out as unknown pieces ([UNK]). The predictions
then mean little (an English model fills Arabic with `,` at 41%), and the page should say so.

    notice = reading_notice(lm, "باريس هي [MASK] فرنسا.")
    notice.reads        # "English": from the model card's `language`, else the vocabulary's main script
    notice.script       # "Arabic": the sentence's script, 0.3% of the vocabulary

What a model reads comes from its model card (a README.md beside the weights, or in the local hub
cache: never the network) when it names at most three languages, else from its vocabulary: the
share of its tokens in each script (Unicode's name of their first letter: LATIN, ARABIC, CJK, ...).
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..model.loading import USER_MASK_RE, LoadedModel

RARE_SCRIPT = 0.02  # a script under 2% of the vocabulary's tokens is one the model barely reads
MOSTLY_UNKNOWN = 0.5  # more than half the words with an unknown piece: the model cannot read them
LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "nl": "Dutch",
             "pt": "Portuguese", "ru": "Russian", "zh": "Chinese", "ja": "Japanese", "ko": "Korean",
             "ar": "Arabic", "he": "Hebrew", "fa": "Persian", "hi": "Hindi", "tr": "Turkish", "pl": "Polish",
             "sv": "Swedish", "fi": "Finnish", "da": "Danish", "no": "Norwegian", "el": "Greek"}
_CARD_LANGUAGE = re.compile(r"^language:[ \t]*(.*)$", re.MULTILINE)
_CARD_ITEM = re.compile(r"^\s*-\s*([\w-]+)\s*$")


@dataclass(frozen=True)
class ReadingNotice:
    """Why a model cannot read a sentence: `reads` (what it reads mostly: a language from its
    card, or "<Script>-script text" from its vocabulary, `reads_share` of its tokens), and either
    the sentence's `script` (its share of the vocabulary: `script_share`) or its `unknown` words
    out of `words` (those with an unknown piece)."""

    reads: str
    reads_share: float | None  # None when `reads` comes from the model card
    script: str | None = None
    script_share: float = 0.0
    unknown: int = 0
    words: int = 0


def reading_notice(lm: LoadedModel, text: str) -> ReadingNotice | None:
    """A `ReadingNotice` when `lm` cannot read `text` (see the module doc), else None. Kept per
    sentence with the model's recent results (`lm.caches`): Fill mask asks at every prediction,
    and a crowd asks the same sentence (~0.2 ms of Python each, held against the web server)."""
    key = ("reading-notice", text)
    kept = lm.caches.recall(lm.model, key)
    if kept is None:
        kept = (_reading_notice(lm, text),)  # a tuple: a None notice is kept too
        lm.caches.remember(lm.model, key, kept)
    return kept[0]


def _reading_notice(lm: LoadedModel, text: str) -> ReadingNotice | None:
    shares = vocabulary_scripts(lm)
    reads, reads_share = card_language(lm), None
    if reads is None and shares:
        main, reads_share = shares.most_common(1)[0]
        reads = f"{main}-script text"
    if reads is None:
        return None
    plain = USER_MASK_RE.sub(" ", text or "")
    script = main_script(plain)
    if script is not None and shares and shares[script] < RARE_SCRIPT:
        return ReadingNotice(reads, reads_share, script=script, script_share=shares[script])
    unknown, words = unknown_words(lm, plain)
    if words and unknown / words > MOSTLY_UNKNOWN:
        return ReadingNotice(reads, reads_share, unknown=unknown, words=words)
    return None


def script_of(char: str) -> str | None:
    """"Latin", "Arabic", "Hebrew", "CJK", ...: the first word of the letter's Unicode name."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    script = name.split()[0] if name else None
    return script if script in ("CJK",) or script is None else script.capitalize()


def main_script(text: str) -> str | None:
    """The script most of `text`'s letters are in (None without letters)."""
    counts = Counter(s for s in map(script_of, text) if s)
    return counts.most_common(1)[0][0] if counts else None


def vocabulary_scripts(lm: LoadedModel) -> Counter:
    """{script: share of the vocabulary's tokens with a letter}, by each token's first letter;
    computed once per model (a 30k vocabulary takes about 50 ms)."""
    kept = lm.caches.recall(lm.model, "vocabulary-scripts")
    if kept is None:
        counts = Counter()
        for token in lm.tokenizer.get_vocab():
            script = next((s for s in map(script_of, token) if s), None)
            if script is not None:
                counts[script] += 1
        total = sum(counts.values()) or 1
        kept = Counter({script: n / total for script, n in counts.items()})
        lm.caches.remember(lm.model, "vocabulary-scripts", kept)
    return kept


def unknown_words(lm: LoadedModel, text: str) -> tuple[int, int]:
    """(words with an unknown piece, words) among `text`'s whitespace-separated words."""
    unk = lm.tokenizer.unk_token_id
    words = text.split()
    if unk is None or not words:
        return 0, len(words)
    pieces = lm.tokenizer(words, add_special_tokens=False)["input_ids"]
    return sum(unk in ids for ids in pieces), len(words)


def card_language(lm: LoadedModel) -> str | None:
    """The language(s) the model card's `language:` names ("English", "English and French"), when
    it names one to three; None without a card, or for a many-language model."""
    card = _card_text(getattr(lm.model.config, "_name_or_path", "") or "")
    if card is None or not card.startswith("---"):
        return None
    header = card.split("---", 2)[1] if card.count("---") >= 2 else ""
    found = _CARD_LANGUAGE.search(header)
    if found is None:
        return None
    codes = [found.group(1).strip()] if found.group(1).strip() else []
    if not codes:  # a YAML list on the following lines
        for line in header[found.end():].splitlines()[1:]:
            item = _CARD_ITEM.match(line)
            if item is None:
                break
            codes.append(item.group(1))
    codes = [c.strip("[]'\" ") for code in codes for c in code.split(",") if c.strip("[]'\" ")]
    if not 1 <= len(codes) <= 3 or "multilingual" in codes:
        return None
    names = [LANGUAGES.get(code.lower(), code) for code in codes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _card_text(name: str) -> str | None:
    """The model card beside a local folder's weights, or in the hub cache (never downloaded)."""
    folder = Path(name)
    try:
        if folder.is_dir():
            card = folder / "README.md"
            return card.read_text(encoding="utf-8") if card.is_file() else None
        from huggingface_hub import try_to_load_from_cache
        cached = try_to_load_from_cache(name, "README.md")
        return Path(cached).read_text(encoding="utf-8") if isinstance(cached, str) else None
    except (OSError, ValueError):
        return None
