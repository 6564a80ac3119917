"""Text a model cannot read: a script its vocabulary barely covers, or words it reads as unknown
pieces, is said, with what the model reads mostly (from its card, else from its vocabulary)."""
import shutil

import pytest

import bertdemo
from bertdemo.views.reading import reading_notice, vocabulary_scripts
from bertdemo.ui.tabs import fillmask_tab

HEBREW = "פריז היא [MASK] של צרפת."
ARABIC = "باريس هي [MASK] فرنسا."


def test_a_sentence_the_model_reads_gets_no_notice(tiny_bert, real_vocab_bert):
    assert reading_notice(tiny_bert, "Paris is the [MASK] of France.") is None
    assert reading_notice(real_vocab_bert, "The man went to the [MASK] to buy milk.") is None


@pytest.mark.parametrize("text, script", [(HEBREW, "Hebrew"), (ARABIC, "Arabic"), ("Москва — [MASK] России.", "Cyrillic")])
def test_a_script_the_vocabulary_barely_covers_is_said(real_vocab_bert, text, script):
    """bert-base-uncased's vocabulary has a few hundred Arabic or Hebrew letters among 30,522 tokens:
    the text is read letter by letter, not as unknown pieces, so the script is what tells."""
    notice = reading_notice(real_vocab_bert, text)
    assert notice.script == script and notice.script_share < 0.02
    assert notice.reads == "Latin-script text" and notice.reads_share > 0.9
    assert vocabulary_scripts(real_vocab_bert)["Latin"] == notice.reads_share


def test_words_that_come_out_as_unknown_pieces_are_said(tiny_bert):
    notice = reading_notice(tiny_bert, "þæt ðing [MASK] øþer")  # Latin letters the tiny vocabulary lacks
    assert notice.script is None and (notice.unknown, notice.words) == (3, 3)
    assert reading_notice(tiny_bert, "Paris is the capital of þæt [MASK].") is None  # one word in seven


def test_the_language_comes_from_the_model_card_when_it_names_one(tiny_bert_dir, tmp_path, engine):
    folder = tmp_path / "carded"
    shutil.copytree(tiny_bert_dir, folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# A model\n")
    notice = reading_notice(engine.load(str(folder), device="cpu"), HEBREW)
    assert notice.reads == "English" and notice.reads_share is None and notice.script == "Hebrew"
    (folder / "README.md").write_text("---\nlanguage: [en, fr]\n---\n")
    assert reading_notice(bertdemo.load(str(folder), device="cpu"), HEBREW).reads == "English and French"


def test_the_page_says_what_the_model_reads_and_why(real_vocab_bert):
    words = fillmask_tab.reading_words(reading_notice(real_vocab_bert, HEBREW), "bert")
    assert words.startswith("⚠️ **bert reads mostly Latin-script text** (9")
    assert "**Hebrew script**" in words and "mean little" in words
