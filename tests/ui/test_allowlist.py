"""Which models a share link's visitors can load: only the operator's allowlist (--models), each
for their own session; never remote code; pickle-only checkpoints only with the operator's
consent; the page names models by folder name, never by the server's paths."""
import json
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from transformers import BertForMaskedLM

import app
import bertdemo
import tiny_models
from bertdemo.model import loading
from bertdemo.config import DEFAULT_MODEL, Settings
from bertdemo.model.loading import LoadedModel
from bertdemo.sessions import SessionStore
from bertdemo.ui.serving import lifecycle

SENTENCE = "Paris is the [MASK] of France."


def ids(predictions):
    return [[p["token_id"] for p in mask] for mask in predictions]


def must_not_load(*args, **kwargs):
    pytest.fail(f"a model was loaded: {args}")


# --- the operator's list ----------------------------------------------------------------------

def test_the_list_is_the_model_then_the_models_flag_or_env(monkeypatch):
    for name in ["BERTDEMO_MODEL", "BERTDEMO_MODELS"]:
        monkeypatch.delenv(name, raising=False)
    assert app.parse_args([]).allowed_models == [DEFAULT_MODEL]
    settings = app.parse_args(["--model", "a", "--models", " b, a ,, org/c "])
    assert settings.allowed_models == ["a", "b", "org/c"]
    monkeypatch.setenv("BERTDEMO_MODELS", "x,y")
    assert app.parse_args(["--model", "a"]).allowed_models == ["a", "x", "y"]


@pytest.mark.parametrize("choice", ["bert-base-uncased", "some-org/any-model", "/etc/passwd", "..",
                                    "../tiny-bert0", "", "   ", None, 7, ["x"]])
def test_anything_not_listed_is_refused_before_anything_is_read(engine, tiny_bert_dir, choice, monkeypatch):
    monkeypatch.setattr(loading, "load", must_not_load)
    with pytest.raises(ValueError, match=f"this server offers: {tiny_bert_dir.name}"):
        engine.load_allowed(choice, [str(tiny_bert_dir)], "cpu")


def test_a_model_folder_on_the_server_that_is_not_listed_is_refused(engine, tiny_bert_dir, tiny_distilbert,
                                                                      monkeypatch):
    monkeypatch.setattr(loading, "load", must_not_load)
    for other in [tiny_distilbert.name, Path(tiny_distilbert.name).name]:
        with pytest.raises(ValueError, match="not in the list this server offers"):
            engine.load_allowed(other, [str(tiny_bert_dir)], "cpu")


def test_listed_models_load_by_folder_name_or_entry_as_one_object(engine, tiny_bert_dir, tiny_distilbert):
    allowlist = [str(tiny_bert_dir), tiny_distilbert.name]
    folder = Path(tiny_distilbert.name).name
    lm = engine.load_allowed(folder, allowlist, "cpu")
    assert lm.name == folder and lm.model is tiny_distilbert.model  # loaded once, shared read-only
    assert engine.load_allowed(tiny_distilbert.name, allowlist, "cpu") is lm


def test_folders_of_the_same_name_are_told_apart():
    choices = loading.allowed_choices(["/srv/a/bert", "/srv/b/bert", "bert-base-uncased"])
    assert choices == {"bert": "/srv/a/bert", "bert (2)": "/srv/b/bert",
                       "bert-base-uncased": "bert-base-uncased"}


# --- what a listed model may do ---------------------------------------------------------------

def test_custom_code_of_a_listed_model_never_runs(engine, tmp_path):
    folder = tiny_models.save_tiny_bert(tmp_path / "custom-code")
    marker = tmp_path / "code-ran"
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="evil-bert",
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForMaskedLM": "evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import BertConfig, BertForMaskedLM\n"
        "class EvilConfig(BertConfig):\n    model_type = 'evil-bert'\n"
        "class EvilModel(BertForMaskedLM):\n    config_class = EvilConfig\n")
    with pytest.raises(ValueError, match="custom code"):
        engine.load_allowed(str(folder), [str(folder)], "cpu")
    assert not marker.exists()


def test_a_pickle_only_checkpoint_needs_the_operators_consent(engine, tmp_path, tiny_bert):
    folder = tmp_path / "pickle-only"
    shutil.copytree(tiny_bert.name, folder)
    state = BertForMaskedLM.from_pretrained(folder).state_dict()
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"only pickle weights .*--allow-pickle"):
        engine.load_allowed("pickle-only", [str(folder)], "cpu")
    lm = engine.load_allowed("pickle-only", [str(folder)], "cpu", allow_pickle=True)
    got, want = bertdemo.fill_mask(lm, SENTENCE, 5), bertdemo.fill_mask(tiny_bert, SENTENCE, 5)
    assert ids(got) == ids(want)
    assert [p["score"] for p in got[0]] == pytest.approx([p["score"] for p in want[0]], abs=1e-6)


# --- each session's own base model ------------------------------------------------------------

def fake(name: str) -> LoadedModel:
    return LoadedModel(name, tokenizer=None, model=torch.nn.Linear(1, 1), device=torch.device("cpu"))


def test_a_session_picks_its_base_and_its_tuned_model_in_use_still_wins():
    store = SessionStore(fake("base"))
    other, tuned, third = fake("other"), fake("tuned"), fake("third")
    store.choose_base("a", other)
    assert store.for_session("a") is other and store.base_for("a") is other
    assert store.for_session("b") is store.base and store.for_session(None) is store.base
    store.put_model("a", "tuned", tuned)
    store.use_tuned("a")
    store.choose_base("a", third)
    assert store.for_session("a") is tuned
    assert store.use_base("a") is third and store.for_session("a") is third
    store.choose_base("a", store.base)
    assert store.for_session("a") is store.base
    store.drop("a")
    assert store.base_for("a") is store.base


# --- through the page -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def picker_app(tiny_bert_dir, tiny_distilbert, tmp_path_factory):
    """The app offering the tiny BERT (its --model), the tiny DistilBERT, and a broken folder."""
    broken = tmp_path_factory.mktemp("private-models") / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    settings = Settings(model=str(tiny_bert_dir), models=f"{tiny_distilbert.name},{broken}",
                        device="cpu", port=None, onnx=False)
    demo = app.build_demo(settings)
    url, _ = lifecycle.serve(demo, settings, block=False)
    yield url, broken
    demo.close()


@pytest.mark.slow
def test_each_visitor_picks_a_model_for_their_session_only(picker_app, tiny_bert, tiny_distilbert):
    url, _ = picker_app
    ann, bob = Client(url, verbose=False), Client(url, verbose=False)
    distil = Path(tiny_distilbert.name).name
    assert distil in ann.predict(distil, api_name="/choose_model")
    _, ann_raw, ann_line = ann.predict(SENTENCE, 5, api_name="/fill_mask")
    _, bob_raw, bob_line = bob.predict(SENTENCE, 5, api_name="/fill_mask")
    assert ids(ann_raw) == ids(bertdemo.fill_mask(tiny_distilbert, SENTENCE, 5))
    assert ids(bob_raw) == ids(bertdemo.fill_mask(tiny_bert, SENTENCE, 5)) != ids(ann_raw)
    assert distil in ann_line and Path(tiny_bert.name).name in bob_line
    ann.predict(Path(tiny_bert.name).name, api_name="/choose_model")  # back to the app's model
    assert ids(ann.predict(SENTENCE, 5, api_name="/fill_mask")[1]) == ids(bob_raw)


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["bert-base-uncased", "/etc/passwd", "../broken-model", "  "])
def test_the_page_refuses_models_it_does_not_offer(picker_app, choice, monkeypatch):
    monkeypatch.setattr(loading, "load", must_not_load)  # the server runs in this process
    client = Client(picker_app[0], verbose=False)
    with pytest.raises(AppError, match="not in the list"):
        client.predict(choice, api_name="/choose_model")


@pytest.mark.slow
def test_a_listed_model_that_fails_says_why_without_the_servers_path(picker_app):
    url, broken = picker_app
    client = Client(url, verbose=False)
    with pytest.raises(AppError, match="broken-model") as error:
        client.predict("broken-model", api_name="/choose_model")
    assert str(broken.parent) not in str(error.value)
    _, raw, _ = client.predict(SENTENCE, 3, api_name="/fill_mask")  # still on the app's model
    assert len(raw[0]) == 3


@pytest.mark.slow
def test_the_page_never_names_a_server_path(picker_app, tiny_bert_dir, tiny_distilbert):
    url, broken = picker_app
    page = httpx.get(url + "config").text + httpx.get(url).text
    for folder in [tiny_bert_dir, Path(tiny_distilbert.name), broken]:
        assert folder.name in page and str(folder) not in page


def test_picking_in_the_page_changes_that_tab_only(page, picker_app, tiny_bert_dir, tiny_distilbert,
                                                   screenshot):
    from playwright.sync_api import expect

    url, _ = picker_app
    distil = Path(tiny_distilbert.name).name
    page.goto(url)
    page.get_by_role("combobox", name="Model").click()
    page.get_by_role("option", name=distil).click()
    expect(page.get_by_text(f"Your tabs use {distil}")).to_be_visible()
    page.get_by_role("button", name="Predict", exact=True).click()
    expect(page.get_by_text(f"Model: {distil} on cpu")).to_be_visible()
    screenshot("model_picker")
    other_tab = page.context.new_page()  # another browser tab is another session
    other_tab.goto(url)
    other_tab.get_by_role("button", name="Predict", exact=True).click()
    expect(other_tab.locator(".js-plotly-plot").first).to_be_visible()  # answered, line refreshed
    expect(other_tab.get_by_text(f"Model: {tiny_bert_dir.name} on cpu")).to_be_visible()
