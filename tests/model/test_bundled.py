"""The bundled masked LM (assets/bundled/): it loads with no network, the app serves it when the
default hub model cannot be had, a missing or damaged file is named, and, since its MLM head is
trained, tests finally check meaning: what it predicts, what the logit lens and the attributions
say, and that a fine-tune on a text lowers that text's held-out loss."""
import json
import shutil
import socket

import pytest
import torch

import app
import bertdemo
from bertdemo.model import bundled
from bertdemo.views import explain
from bertdemo.config import DEFAULT_MODEL, Settings
from bertdemo.serving.engine import Engine

pytestmark = pytest.mark.skipif(not bundled.available(), reason="the bundled model's files are not there")


@pytest.fixture(scope="module")
def lm():
    return Engine().load_bundled("cpu")


def probes() -> list[tuple[str, set[str]]]:
    """The probe sentences shipped beside the model: a [MASK] and the words that would be right."""
    rows = [line.split("\t") for line in (bundled.FOLDER / "probes.tsv").read_text().splitlines() if line]
    return [(sentence, set(words.split(","))) for sentence, words in rows]


def top5(lm, sentence: str) -> list[str]:
    return [p["token"].strip() for p in bertdemo.fill_mask(lm, sentence, 5)[0]]


# ---------------------------------------------------------------- loading

def test_it_loads_without_any_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the bundled model reached for the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    lm = bertdemo.load_bundled("cpu")
    assert lm.name == "bundled" and top5(lm, "Paris is the [MASK] of France.")


def test_its_card_says_what_it_is_and_warns_of_nothing(lm):
    report = bundled.read_report()
    assert lm.card.head_trained and lm.card.warning is None
    assert lm.card.provenance == bundled.describe(report)
    for source in report["corpus"]["sources"]:
        assert source["label"] in lm.card.provenance
    assert f"{report['held_out']['top5']:.0%}" in lm.card.provenance


@pytest.mark.parametrize("damage, named", [("missing", "model.safetensors"), ("garbage", "damaged"),
                                           ("no report", "training.json")])
def test_a_missing_or_damaged_file_is_named(tmp_path, damage, named):
    folder = tmp_path / "bundled"
    shutil.copytree(bundled.FOLDER, folder)
    if damage == "missing":
        (folder / "model.safetensors").unlink()
    elif damage == "garbage":
        (folder / "model.safetensors").write_bytes(b"\x00not a safetensors file" * 100)
    else:
        (folder / "training.json").unlink()
    with pytest.raises(ValueError, match=named):
        bundled.load_bundled("cpu", folder=folder)


def test_model_bundled_with_its_file_missing_starts_the_no_model_page(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled, "FOLDER", tmp_path / "nothing-here")
    store = app.load_store(Settings(model="bundled", device="cpu"), Engine())
    assert store.base is None and "model.safetensors" in store.load_error


def test_the_default_model_out_of_reach_serves_the_bundled_one_and_says_why(monkeypatch, tmp_path):
    engine = Engine()
    real = engine.load_allowed

    def hub_down(name, *args, **kwargs):
        if name == DEFAULT_MODEL:
            raise ValueError("Could not load 'bert-base-uncased': the hub did not answer")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(engine, "load_allowed", hub_down)
    settings = Settings(device="cpu")
    store = app.load_store(settings, engine)
    assert store.base.name == "bundled" and store.load_error is None
    assert "Serving the bundled model" in store.notice and "the hub did not answer" in store.notice
    assert "far below bert-base-uncased" in store.notice.lower()
    assert app.served_settings(settings, store).model == "bundled"  # what the picker offers
    other = Settings(model=str(tmp_path / "my-model"), device="cpu")  # asked for by name: no stand-in
    assert app.load_store(other, engine).base is None


# ---------------------------------------------------------------- meaning

def test_most_probes_have_a_right_word_in_the_top_5(lm):
    hits = [sentence for sentence, right in probes() if right & set(top5(lm, sentence))]
    assert len(hits) >= 8, hits


@pytest.mark.parametrize("sentence, right", [
    ("Paris is the [MASK] of France.", {"capital", "city"}),
    ("She drank a cup of [MASK].", {"tea", "coffee", "water", "milk"}),
])
def test_everyday_sentences_get_a_sensible_word(lm, sentence, right):
    assert right & set(top5(lm, sentence)), top5(lm, sentence)


def test_the_logit_lens_ends_at_fill_mask_and_the_answer_rises_through_the_upper_layers(lm):
    text = "Paris is the [MASK] of France."
    entry = bertdemo.layer_predictions(lm, text, top_k=5)[0]
    final, filled = entry["layers"][-1], bertdemo.fill_mask(lm, text, 5)[0]
    assert [p["token_id"] for p in final] == [p["token_id"] for p in filled]
    assert [p["score"] for p in final] == pytest.approx([p["score"] for p in filled], abs=1e-5)
    ranks = entry["final_rank"]  # the final answer's rank after the embeddings and each layer
    assert ranks[-1] == 1 and ranks[-1] < ranks[-3] < ranks[0]


def test_integrated_gradients_credit_the_words_that_make_capital_right(lm):
    result = explain.saliency(lm, "Paris is the [MASK] of France.", target="capital", steps=32)
    weight = dict(zip(result["tokens"], result["attributions"]))
    assert weight["paris"] + weight["france"] > weight["is"] + weight["the"]
    assert abs(result["delta"]) < 0.1 * abs(sum(result["attributions"]))


@pytest.mark.slow
def test_a_short_fine_tune_lowers_the_held_out_loss_of_its_text(lm):
    text = "\n".join(f"The {animal} sleeps in the barn and eats {food} every morning."
                     for animal, food in [("cow", "hay"), ("horse", "oats"), ("goat", "grass"),
                                          ("sheep", "clover"), ("pig", "corn"), ("donkey", "straw"),
                                          ("cow", "grass"), ("horse", "hay"), ("goat", "clover"),
                                          ("sheep", "oats"), ("pig", "straw"), ("donkey", "corn")])
    _, history = bertdemo.finetune(lm, text, training_length=30, learning_rate=5e-5, batch_size=4, seed=0)
    assert not history.eval_on_train  # scored on lines it never trained on
    assert history.after.loss < history.before.loss - 0.2


# ---------------------------------------------------------------- the training script

@pytest.mark.slow
def test_the_training_script_writes_a_folder_load_bundled_reads(tmp_path):
    """`python -m bertdemo train-bundled` in miniature: two steps on a corpus written here."""
    from bertdemo.build.bundled_training import Recipe, train_bundled

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [f"The {animal} sat on the {thing} near the door." for animal in ("cat", "dog", "bird")
             for thing in ("mat", "chair", "bed", "floor")]
    (corpus / "train.txt").write_text("\n".join(lines) + "\n")
    (corpus / "train.src").write_text("\n".join(["harvard"] * len(lines)) + "\n")
    (corpus / "heldout.txt").write_text("The cow sat on the grass near the gate.\n")
    source = {"label": "lines written for this test", "package": "-", "kind": "test", "licence": "CC0",
              "licence_file": "-", "what": "test lines", "texts": len(lines), "wordpieces": 120}
    (corpus / "sources.json").write_text(json.dumps({"sources": {"harvard": source},
                                                     "total": {"texts": len(lines)}}))
    report = train_bundled(Recipe(steps=2, batch_tokens=64), corpus_dir=corpus, out=tmp_path / "out",
                           device="cpu", fetch=False, echo=lambda line: None)
    assert report["steps"] == 2 and report["tokens_seen"] > 0 and 0 <= report["held_out"]["top5"] <= 1
    lm = bundled.load_bundled("cpu", folder=tmp_path / "out")
    assert lm.card.provenance == bundled.describe(report) and "lines written for this test" in lm.card.provenance
    assert all(p.dtype == torch.float32 for p in lm.model.parameters())  # shipped in fp16, served in fp32
