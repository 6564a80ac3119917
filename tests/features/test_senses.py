"""The senses file (`bertdemo/features/senses.py`): a word's senses are its named blocks, read back
as written, never a word's lines cut at the half; the corpus search's corpus takes its sentences."""
from __future__ import annotations

import pytest

from bertdemo.features import senses

WRITTEN = """# two words, one with three senses
[bank: the side of a river]
I sat on the river bank.
Ducks waddled up the grassy bank.

[bank: a place that keeps money]
The bank lent me money.

[light: brightness]
Turn on the light.
[light: not heavy]
The box is light.
  The bag was light too.

[match: a stick that makes fire]
He struck a match to light the candle.

[spring: the season]
The flowers bloom every spring.
[ spring :a coil of metal ]
The spring was broken.
[spring: water from the ground]
They drank from a spring.
"""


@pytest.fixture
def written(tmp_path):
    path = tmp_path / "senses.txt"
    path.write_text(WRITTEN, encoding="utf-8")
    return path


def test_the_senses_files_blocks_read_back_as_written(written):
    assert senses.read_senses(written) == [
        senses.Sense("bank", "the side of a river", ("I sat on the river bank.", "Ducks waddled up the grassy bank.")),
        senses.Sense("bank", "a place that keeps money", ("The bank lent me money.",)),
        senses.Sense("light", "brightness", ("Turn on the light.",)),
        senses.Sense("light", "not heavy", ("The box is light.", "The bag was light too.")),
        senses.Sense("match", "a stick that makes fire", ("He struck a match to light the candle.",)),
        senses.Sense("spring", "the season", ("The flowers bloom every spring.",)),
        senses.Sense("spring", "a coil of metal", ("The spring was broken.",)),
        senses.Sense("spring", "water from the ground", ("They drank from a spring.",)),
    ]
    assert senses.sentences(written)[0] == "I sat on the river bank." and len(senses.sentences(written)) == 10


def test_a_words_two_lists_are_its_first_two_blocks_not_its_lines_cut_in_half(written):
    """Cut at the half, bank's three lines would give the river a money line's company; and "light
    the candle", a match's sentence using the word light, is not one of light's senses."""
    assert senses.sense_lists("bank", written) == (["I sat on the river bank.", "Ducks waddled up the grassy bank."],
                                                   ["The bank lent me money."])
    assert senses.sense_lists("LIGHT", written) == (["Turn on the light."],
                                                    ["The box is light.", "The bag was light too."])
    assert [s.name for s in senses.senses_of("spring", written)] == ["the season", "a coil of metal",
                                                                       "water from the ground"]
    with pytest.raises(ValueError, match=r"1 sense\(s\) of 'match'; these words have two or more: bank, light, spring"):
        senses.sense_lists("match", written)


@pytest.mark.parametrize("text, message", [
    ("A sentence first.\n[bank: money]\nThe bank.\n", r"line 1: a sentence before any \[word: the sense\] header"),
    ("[bank money]\nThe bank.\n", r"line 1: a sense's header is \[word: the sense\]"),
    ("[bank: money]\n\n[bank: river]\nThe bank.\n", r"line 1: the sense \[bank: money\] has no sentence"),
])
def test_a_malformed_senses_file_is_refused_with_its_line(tmp_path, text, message):
    path = tmp_path / "senses.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        senses.read_senses(path)


def test_the_shipped_senses_file_keeps_every_sentence_in_a_named_block():
    lines = [line.strip() for line in senses.SENSES.read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line and not line.startswith(("#", "["))]
    assert senses.sentences() == sentences  # nothing lost, nothing read twice
    river, money = senses.sense_lists("bank")
    assert len(river) == len(money) == 8
    assert all("river" in line or "stream" in line or "pond" in line or "lake" in line or "canal" in line
               for line in river)
    assert "He struck a match to light the candle." not in sum(senses.sense_lists("light"), [])
    assert "The bat fluttered around the lamp in the garden." in senses.sense_lists("bat")[0]  # the animal's
    for sense in senses.read_senses():
        assert sense.name and sense.lines, sense
