"""Corpus search: the ranking is the cosine of the model's own `output_hidden_states` (a word
split into pieces = the mean of its pieces), the query's own sentence left out, a real model tells a river
bank from a money bank, and the index is built once per model and corpus, kept on disk."""
import copy
import dataclasses
import re
import threading

import numpy as np
import pytest
import torch

import bertdemo
import bertdemo.views.embeddings
from bertdemo.views import corpus_search
from bertdemo.views.corpus_search import IndexCache, Stopped

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "paris is the capital of france",
          "the capital of germany is berlin", "the cat is in paris"]
RIVER = ["I sat on the river bank and watched the water.", "We fished from the bank of the river.",
         "The river burst its bank after the storm.", "Ducks waddled up the grassy bank of the pond."]
MONEY = ["The bank lent me money for a house.", "She deposited her salary at the bank.",
         "The bank raised its interest rates.", "I need to go to the bank to open a savings account.",
         "My bank charges a fee for every transfer."]


def reference(lm, sentence, word, layer, lines):
    """(similarities of every occurrence, their (line, word) labels), by hand from the model."""
    def occurrences(text):
        enc = lm.tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
        offsets, special = enc.pop("offset_mapping")[0].tolist(), enc.pop("special_tokens_mask")[0].tolist()
        with torch.no_grad():
            states = lm.model.base_model(**enc, output_hidden_states=True).hidden_states[layer][0]
        for match in re.finditer(r"\w+", text):
            pieces = [i for i, (a, b) in enumerate(offsets) if not special[i] and a < match.end() and b > match.start()]
            yield match.group(0), states[pieces].mean(0).numpy()

    query = next(v for w, v in occurrences(sentence) if w.lower() == word)
    labels, vectors = [], []
    for n, line in enumerate(lines):
        for w, v in occurrences(line):
            labels.append((n, w))
            vectors.append(v)
    vectors = np.array(vectors)
    cosine = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    return cosine, labels


@pytest.fixture
def cache(tmp_path):
    return IndexCache(tmp_path)


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_the_ranking_is_the_cosine_of_output_hidden_states(tiny_bert, cache, layer):
    result = bertdemo.search_corpus(tiny_bert, "the cat sat in paris", word="cat", layer=layer, top_k=8,
                                    corpus="\n".join(CORPUS), cache=cache)
    cosine, labels = reference(tiny_bert, "the cat sat in paris", "cat", layer, CORPUS)
    order = np.argsort(-cosine, kind="stable")[:8]
    assert [(h["line"], h["word"]) for h in result["hits"]] == [labels[i] for i in order]
    np.testing.assert_allclose([h["similarity"] for h in result["hits"]], cosine[order], atol=1e-5)
    assert result["occurrences"] == len(labels) and result["lines"] == len(CORPUS)
    assert result["hits"][0]["text"][result["hits"][0]["start"]:result["hits"][0]["end"]] == result["hits"][0]["word"]


def test_a_word_split_into_pieces_is_the_mean_of_its_pieces(tiny_distilbert, cache):
    lines = ["the cheetah ran in the park", "a dog ran fast", "the cheetahs sat"]
    assert len(tiny_distilbert.tokenizer.tokenize("cheetah")) > 1
    result = bertdemo.search_corpus(tiny_distilbert, "the cheetah sat", word="cheetah", layer=2, top_k=5,
                                    corpus="\n".join(lines), cache=cache)
    cosine, labels = reference(tiny_distilbert, "the cheetah sat", "cheetah", 2, lines)
    order = np.argsort(-cosine, kind="stable")[:5]
    assert [(h["line"], h["word"]) for h in result["hits"]] == [labels[i] for i in order]
    np.testing.assert_allclose([h["similarity"] for h in result["hits"]], cosine[order], atol=1e-5)


def test_the_query_sentence_in_the_corpus_is_left_out_and_said_so(tiny_bert, cache):
    """The visitor's own sentence would be its own top hit at cosine 1.000: its line gives no hit
    (spaces and case aside), the rest rank as the reference says, and the page says which line."""
    from bertdemo.ui.tabs import search_tab

    sentence = "The capital of  Germany is Berlin"  # line 3 of CORPUS, but for case and spaces
    result = bertdemo.search_corpus(tiny_bert, sentence, word="capital", layer=2, top_k=50,
                                    corpus="\n".join(CORPUS), cache=cache)
    assert result["left_out"] == [3] and all(hit["line"] != 3 for hit in result["hits"])
    cosine, labels = reference(tiny_bert, sentence, "capital", 2, CORPUS)
    order = [i for i in np.argsort(-cosine, kind="stable") if labels[i][0] != 3]
    assert [(h["line"], h["word"]) for h in result["hits"]] == [labels[i] for i in order]
    assert "Left out line 4: your sentence itself" in search_tab.status_line(result, "tiny")
    assert bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=2, corpus="\n".join(CORPUS),
                                  cache=cache)["left_out"] == []


@pytest.mark.slow
def test_a_real_model_finds_river_banks_for_a_river_bank(engine, tmp_path):
    """MiniLM's last layer: the banks nearest a river bank are the river banks, those nearest a
    money bank the money banks (the lines interleaved, so the order of the corpus says nothing)."""
    minilm = engine.load_minilm("cpu")
    lines = [line for pair in zip(MONEY, RIVER + [""]) for line in pair if line]
    last = bertdemo.views.embeddings.layer_count(minilm)
    cache = IndexCache(tmp_path)

    def banks(sentence):
        result = bertdemo.search_corpus(minilm, sentence, word="bank", layer=last, top_k=40,
                                        corpus="\n".join(lines), cache=cache)
        return [hit["text"] for hit in result["hits"] if hit["word"].lower() == "bank"]

    assert set(banks("The children played on the bank of the river.")[:len(RIVER)]) == set(RIVER)
    assert set(banks("I borrowed money from the bank.")[:len(MONEY)]) == set(MONEY)


def test_the_counts_are_the_top_hits_words(tiny_bert, cache):
    result = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1, top_k=6,
                                    corpus="\n".join(CORPUS), cache=cache)
    counted = {c["word"]: c["count"] for c in result["counts"]}
    assert sum(counted.values()) == 6
    for hit in result["hits"]:
        assert hit["word"].lower() in counted


@pytest.mark.slow
def test_the_default_corpus_is_searched_when_none_is_given(tiny_bert, cache):
    result = bertdemo.search_corpus(tiny_bert, "the cat sat on the mat", word="cat", layer=1, cache=cache)
    blank = bertdemo.search_corpus(tiny_bert, "the cat sat on the mat", word="cat", layer=1, cache=cache,
                                   corpus="  \n\n ")  # empty: the default corpus, not an error
    assert blank["hits"] == result["hits"] and not blank["built"]
    shipped = [line for line in corpus_search.DEFAULT_CORPUS.read_text().splitlines() if line.strip()]
    assert result["corpus"] == "default" and result["lines"] == len(shipped) >= 1500
    assert len(result["hits"]) == 10 and all(h["text"] in shipped for h in result["hits"])


# ---------------------------------------------------------------- the index

def test_the_index_is_built_once_and_read_back_after_a_restart(tiny_bert, tmp_path):
    args = dict(word="cat", top_k=5, corpus="\n".join(CORPUS))
    first = IndexCache(tmp_path)
    built = bertdemo.search_corpus(tiny_bert, "the cat sat", layer=1, cache=first, **args)
    again = bertdemo.search_corpus(tiny_bert, "the cat sat", layer=2, cache=first, **args)
    assert built["built"] and not again["built"] and first.builds == 1  # one forward, every layer
    restarted = IndexCache(tmp_path)  # a new process finds the files
    reread = bertdemo.search_corpus(tiny_bert, "the cat sat", layer=1, cache=restarted, **args)
    assert not reread["built"] and restarted.builds == 0 and reread["hits"] == built["hits"]


def test_a_tuned_model_gets_its_own_index(tiny_bert, tmp_path):
    args = dict(word="cat", layer=2, top_k=5, corpus="\n".join(CORPUS))
    cache = IndexCache(tmp_path)
    base = bertdemo.search_corpus(tiny_bert, "the cat sat", cache=cache, **args)
    model = copy.deepcopy(tiny_bert.model)
    with torch.no_grad():
        model.bert.encoder.layer[0].output.dense.weight.mul_(1.5)
    tuned = dataclasses.replace(tiny_bert, model=model, name="tuned")
    result = bertdemo.search_corpus(tuned, "the cat sat", cache=cache, **args)
    assert result["built"] and cache.builds == 2
    assert [h["similarity"] for h in result["hits"]] != [h["similarity"] for h in base["hits"]]
    with torch.no_grad():  # tuned further in place: the digest follows the weights
        model.bert.encoder.layer[1].output.dense.weight.mul_(1.5)
    assert bertdemo.search_corpus(tuned, "the cat sat", cache=cache, **args)["built"]


def test_two_visitors_asking_at_once_build_the_index_once(tiny_bert, tmp_path):
    cache = IndexCache(tmp_path)
    results = []

    def ask():
        results.append(bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1,
                                              corpus="\n".join(CORPUS * 40), cache=cache))
    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.builds == 1 and sum(r["built"] for r in results) == 1
    assert results[0]["hits"] == results[1]["hits"] == results[2]["hits"]


def test_a_stopped_build_leaves_nothing_and_reports_progress(tiny_bert, tmp_path):
    cache, seen = IndexCache(tmp_path), []
    corpus = "\n".join(CORPUS * 40)  # 200 lines: several batches
    with pytest.raises(Stopped):
        bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1, corpus=corpus, cache=cache,
                               on_progress=lambda done, total: seen.append((done, total)),
                               should_stop=lambda: len(seen) >= 2)
    assert seen == [(32, 200), (64, 200)]
    assert list(tmp_path.iterdir()) == [] and cache.builds == 0
    result = bertdemo.search_corpus(tiny_bert, "the cat sat", word="cat", layer=1, corpus=corpus, cache=cache,
                                    on_progress=lambda done, total: seen.append((done, total)))
    assert result["built"] and seen[-1] == (200, 200)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("change, message", [
    (dict(corpus="... !!!\n?"), "no words"),
    (dict(word="dog"), "'dog' is not in the sentence"),
    (dict(word=""), "Type the word"),
    (dict(word="ca"), "'ca' is not in the sentence"),
    (dict(layer=3), "layer must be a whole number from 0 to 2"),
    (dict(layer=-1), "layer must be a whole number from 0 to 2"),
    (dict(top_k=0), "number of hits must be a whole number from 1 to 50"),
    (dict(corpus="word\n" * 30), "30 lines; at most 20"),
    (dict(corpus="x" * 2001), "2,001 characters; at most 2,000"),
    (dict(text=""), "sentence is empty"),
])
def test_bad_input_says_how_to_fix_it(tiny_bert, cache, change, message):
    args = dict(text="the cat sat", word="cat", layer=1, top_k=5, corpus="\n".join(CORPUS), cache=cache,
                max_lines=20, max_chars=2000)
    args.update(change)
    with pytest.raises(ValueError, match=re.escape(message)):
        bertdemo.search_corpus(tiny_bert, **args)


# ---------------------------------------------------------------- the tab

def visitor_for(lm, engine, **settings):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor

    return Visitor(SessionStore(lm), Settings(**settings), "someone", engine)


def test_the_tab_lists_the_hits_in_context_as_text(tiny_bert, engine):
    from bertdemo.ui.tabs import search_tab

    lines = "the cat <b>sat</b> on the mat & rug\na dog ran"
    status, hits, counts, raw = search_tab.on_search(visitor_for(tiny_bert, engine), "the cat sat", "cat", 2, 5, lines)
    assert "your corpus: 2 lines" in status and raw["corpus"] == "yours"
    assert "<b>sat" not in hits and "&lt;b&gt;sat&lt;/b&gt;" in hits and "&amp; rug" in hits
    assert hits.count("<mark>") == 5 and f"<mark>{raw['hits'][0]['word']}</mark>" in hits
    assert [bar for bar in counts.data[0].y] == [c["count"] for c in raw["counts"]]


def test_the_tabs_stop_ends_a_build_and_says_so(tiny_bert, tmp_path):
    from bertdemo.ui.tabs import search_tab

    engine = bertdemo.Engine()
    engine.search = IndexCache(tmp_path)
    visitor = visitor_for(tiny_bert, engine)

    def progress(share, desc=None):  # the visitor presses Stop during the build
        search_tab.on_stop(visitor)
    status, *rest = search_tab.on_search(visitor, "the cat sat", "cat", 1, 5, "\n".join(CORPUS * 40), progress)
    assert status.startswith("Stopped") and list(tmp_path.iterdir()) == []
    status, *rest = search_tab.on_search(visitor, "the cat sat", "cat", 1, 5, "\n".join(CORPUS * 40),
                                         lambda share, desc=None: None)
    assert "built now" in status  # the stop was for that build only


def test_an_uploaded_file_fills_the_corpus_within_the_limit(tiny_bert, engine, tmp_path):
    from bertdemo.ui.tabs import search_tab

    visitor = visitor_for(tiny_bert, engine, search_max_chars=100)
    small, large, binary = tmp_path / "small.txt", tmp_path / "large.txt", tmp_path / "data.txt"
    small.write_text("the cat sat\na dog ran\n")
    large.write_text("word " * 30)
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert search_tab.on_upload(visitor, str(small)) == "the cat sat\na dog ran\n"
    with pytest.raises(ValueError, match="large.txt has more than 100 characters"):
        search_tab.on_upload(visitor, str(large))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        search_tab.on_upload(visitor, str(binary))


@pytest.mark.slow
def test_the_app_serves_the_search_to_scripts(client):
    status, hits, counts, raw = client.predict("the cat sat on the mat", "cat", 2, 3, "the cat sat\na dog ran",
                                               api_name="/search_corpus")
    assert raw["corpus"] == "yours" and len(raw["hits"]) == 3 and raw["hits"][0]["word"] == "cat"
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="'bird' is not in the sentence"):
        client.predict("the cat sat", "bird", 2, 3, "", api_name="/search_corpus")
    with pytest.raises(AppError, match="greater than maximum value 2"):  # the layer slider refuses it
        client.predict("the cat sat", "cat", 9, 3, "", api_name="/search_corpus")
