"""Bad input, everywhere: every endpoint of the running app, every input, the inputs a stranger's
script can send. Each case must end in a clear message (or a correct answer), the server stays
up, and the endpoint's next good request succeeds.

This module holds the table (every endpoint, a good value per input, the bad values per kind of
input) and the calls; the tests beside it run it in three groups (GROUPS: the views, the runs,
the features and circuits), each against a server of its own, so the groups can run side by side.
The endpoints are read from the running app's API info: an endpoint (or an input) this table
does not describe fails `test_the_suite_covers_every_endpoint_and_input`, so none is forgotten.

Every call goes through Gradio's raw HTTP API (`POST /gradio_api/call/...`, then its event stream),
as a script would send it, in the client's session (so /classify finds the session's classifier):
the same queue, validators, handlers and session state as gradio_client's calls, and it can send
NaN and ±inf (gradio_client cannot: httpx encodes JSON with allow_nan=False). gradio_client, by
contrast, spends ~60 ms a call on its threads and its 50 ms polling of the answer (~17 ms raw),
and the sweep makes two calls a case. The files a good answer names are fetched, as gradio_client
downloads them.
"""
import contextlib
import json
import math
import uuid
from pathlib import Path

import httpx
import pytest
from gradio_client import Client
from gradio_client.utils import encode_file_path, is_file_obj_with_meta, traverse

import app
import bertdemo
import tiny_models
from bertdemo.config import Settings
from bertdemo.features import cls_features
from bertdemo.features.making import train_features
from bertdemo.features.store import FeatureStore
from bertdemo.features.training import FeatureSettings
from bertdemo.ui.serving import lifecycle
from bertdemo.ui.tabs import circuits_tab

SENTENCE = "Paris is the [MASK] of France."
TEXT = "Paris is the capital of France."
FT_TEXT = "Paris is the capital of France.\nThe Eiffel Tower is a famous landmark."
RATES = [("number", 0), ("number", 0.15), ("number", 0.8), ("number", 0.1), ("flag", False)]
FINETUNE_FORM = [("text", FT_TEXT), ("number", 1), ("choice", "steps"), ("number", 5e-5),
                 ("number", 2), ("number", 16), ("number", 0.15), ("choice", "dynamic"), ("number", 0)]
MODEL = "tiny-bert"  # the folder name of the suite's model, as the picker shows it
# A short corpus for the good training requests (features, transcoders): over the 1,000 tokens a
# run needs, small enough that its statistics and held-out figures take a second, not the default
# corpus' twenty (an empty text, the default corpus, is among the bad values all the same).
RUN_TEXT = "\n".join(f"The {who} {did} near the {place} today." for who in ("cat", "dog", "bird", "child")
                     for did in ("sat", "slept", "ran") for place in ("mat", "bank", "river", "road", "hill",
                                                                      "boat", "table", "chair", "floor", "wall"))
CLASSIFY_TABLE = {"headers": ["text", "label"], "data": [
    ["the dog is big", "animal"], ["a cat is small", "animal"], ["the old dog", "animal"],
    ["paris is in france", "place"], ["berlin is in germany", "place"], ["rome is a city", "place"]]}
CLASSIFY_FORM = [("table", CLASSIFY_TABLE), ("number", 1), ("number", 1e-3), ("number", 4), ("flag", False),
                 ("number", 0)]
# api_name -> its inputs as (kind, a good value), in order. Good values are small: fast to run.
ENDPOINTS = {
    "/choose_model": [("choice", MODEL)],
    "/fill_mask": [("text", SENTENCE), ("number", 3)],
    "/fill_jointly": [("text", SENTENCE), ("number", 2)],
    "/score_candidates": [("text", SENTENCE), ("text", "capital, city"), ("number", 1)],
    "/sentence_score": [("text", TEXT)],
    "/compare_models": [("text", SENTENCE), ("choice", MODEL), ("number", 3)],
    "/attention": [("text", SENTENCE), ("text", ""), ("choice", "head"), ("choices", []),
                   ("choices", []), ("choice", "head"), ("number", 1), ("number", 1), ("flag", False),
                   ("flag", False), ("number", 0), ("number", 1)],
    "/neuron_view": [("text", SENTENCE), ("text", ""), ("number", 1), ("number", 1), ("number", 4)],  # layer, head from 1
    "/head_importance": [("text", SENTENCE), ("number", 1), ("text", ""), ("text", "")],
    "/heads_off": [("text", SENTENCE), ("text", "*:*")],  # every head of every layer off: still answers
    "/mask_sample": [("text", TEXT), *RATES],
    "/static_vs_dynamic": [("text", TEXT), *RATES, ("number", 3), ("number", 1)],
    "/masking_law": [("text", TEXT), *RATES, ("number", 1000)],
    "/article_snippet": [("text", TEXT), *RATES, ("number", 20)],
    "/article_finetune": [("text", TEXT), ("number", 0), ("number", 5), ("number", 3e-4)],
    "/finetune": [*FINETUNE_FORM, ("flag", False), ("text", SENTENCE), ("flag", True)],
    "/compare_masking": FINETUNE_FORM,
    "/suggest_probes": [("text", FT_TEXT)],
    "/stop_finetune": [],
    "/use_tuned": [],
    "/use_base": [],
    "/download_tuned": [],
    "/export_training_script": [],  # after /finetune: it exports the session's finished run
    "/layer_predictions": [("text", SENTENCE), ("number", 1), ("number", 3)],
    "/saliency": [("text", SENTENCE), ("text", ""), ("number", 1), ("choice", "gradient_x_input"),
                  ("number", 2), ("number", 1)],  # layer 1: the first (0 is the embeddings: no attention)
    "/embedding_map": [("text", "I sat on the river bank.\nThe bank lent me money."), ("number", 1),
                       ("text", "bank")],
    "/search_corpus": [("text", "I sat on the river bank."), ("text", "bank"), ("number", 1), ("number", 5),
                       ("text", "The bank of the river was muddy.\nThe bank lent me money.")],
    "/probe_layers": [CLASSIFY_FORM[0], CLASSIFY_FORM[5]],
    "/classify_example": [("choice", "Reviews: positive, negative (24 lines)")],
    "/train_classifier": CLASSIFY_FORM,  # before /classify and /download_classifier: they need its classifier
    "/stop_classifier": [],
    "/classify": [("text", "the dog is big")],
    "/classifier_features": [("text", "the dog is big"), ("number", 3)],  # after /train_classifier; [CLS] dictionary: suite_app
    "/download_classifier": [],
    "/forgetting_sweep": [CLASSIFY_FORM[0], CLASSIFY_FORM[1], CLASSIFY_FORM[3], CLASSIFY_FORM[5]],
    "/adapt_then_classify": CLASSIFY_FORM,
    # the Features tab: the suite's store has a dictionary of layer 1 (`suite_app`)
    "/sentence_features": [("text", TEXT), ("number", 1), ("number", 3)],
    "/feature_card": [("number", 1), ("number", 0)],
    "/steer_feature": [("text", SENTENCE), ("number", 1), ("number", 0), ("number", 0), ("number", 1),
                       ("number", 3)],
    "/prediction_features": [("text", SENTENCE), ("number", 1), ("number", 3)],
    "/contrast_features": [("text", "I sat on the river bank."), ("text", "The bank lent me money."),
                           ("text", "bank"), ("number", 1), ("number", 3)],
    "/feature_quality": [],
    "/features_after_tuning": [("text", ""), ("number", 1), ("number", 3), ("choice", "share")],  # after /finetune
    "/find_features": [("text", "the"), ("choice", "word"), ("number", 1), ("number", 3)],
    "/feature_map": [("number", 1)],
    "/similar_features": [("number", 1), ("number", 0)],
    "/train_features": [("number", 2), ("text", RUN_TEXT), ("flag", True)],
    "/stop_features": [],
    # the Circuits tab: the suite's model has random transcoders (`suite_app`); 0_1_4 is layer 1's error at [MASK]
    "/circuit_graph": [("text", SENTENCE), ("number", 1), ("text", ""), ("number", 0.8), ("number", 0.98),
                       ("choice", "slope")],
    "/circuit_intervene": [("text", SENTENCE), ("number", 1), ("text", ""), ("text", "0_1_4"), ("number", 0),
                           ("text", ""), ("choice", "slope")],
    "/circuit_json": [("text", SENTENCE), ("number", 1), ("text", ""), ("number", 0.8), ("number", 0.98),
                      ("text", "group: 0_1_4"), ("choice", "scale")],
    "/train_transcoders": [("text", RUN_TEXT), ("flag", True)],
    "/stop_transcoders": [],
}
# Gradio component -> kind of input in the table above.
KINDS = {"Textbox": "text", "Number": "number", "Slider": "number", "Radio": "choice",
         "Dropdown": "choice", "Checkboxgroup": "choices", "Checkbox": "flag", "Dataframe": "table"}
BAD = {
    "text": {
        "empty": "",
        "whitespace": " \t\n \u00a0\u2003\u200b ",
        "100,000 characters": (SENTENCE + " ") * (100_000 // (len(SENTENCE) + 1)) + "x" * 40,
        "1,000 masks": "[MASK] " * 1000,
        "NUL and control characters": "Paris\x00 is\x01 the [MASK]\x1b[31m of\x7f France.\r\n\x0c\x08",
        "emoji": "🙂 Paris 🗼 is the [MASK] of France 🇫🇷 👩‍👩‍👧.",
        "right-to-left": "\u202eباريس هي [MASK] فرنسا.\u202c שלום",
        "combining characters": "Pa\u0301ri\u0308s i\u0336s the [MASK] o\u0489f "
                                "Z\u0351\u0352\u0353\u0354a\u035c.",
        "HTML/JS payload": "<script>alert(1)</script><img src=x onerror=\"alert(2)\"> [MASK] "
                           "</textarea>\"'><svg onload=alert(3)>{{7*7}}${7*7}",
    },
    "number": {"0": 0, "negative": -1, "NaN": math.nan, "inf": math.inf, "-inf": -math.inf,
               "10^12": 10**12, "not a number": "ten"},
    "choice": {"not offered": "bogus'; DROP TABLE--", "none": None},
    "choices": {"not offered": ["99"], "not a list": "0"},
    "flag": {"not a bool": "yes", "none": None},
    "table": {  # labelled examples (text, label) for the classifier
        "one label": {"headers": ["text", "label"], "data": [["the dog", "animal"], ["a cat", "animal"]]},
        "a label with one example": {"headers": ["text", "label"],
                                     "data": CLASSIFY_TABLE["data"] + [["london", "city"]]},
        "empty and whitespace texts": {"headers": ["text", "label"],
                                       "data": CLASSIFY_TABLE["data"] + [["", "animal"], [" \t ", "place"]]},
        "header row only": {"headers": ["text", "label"], "data": []},
        "label of 65 characters": {"headers": ["text", "label"],
                                   "data": CLASSIFY_TABLE["data"] + [["the cat", "x" * 65]] * 2},
        "2,001 rows": {"headers": ["text", "label"], "data": [["a", "x"], ["b", "y"]] * 1000 + [["c", "x"]]},
        "100,000 characters": {"headers": ["text", "label"],
                               "data": [[TEXT * 1600, "x"], ["a", "x"], ["b", "y"], ["c", "y"]]},
        "three columns": {"headers": ["text", "label", "x"], "data": [["a", "x", "1"], ["b", "y", "2"]] * 2},
        "HTML/JS labels": {"headers": ["text", "label"],
                           "data": [["a", "<script>alert(1)</script>"], ["b", "<img src=x onerror=alert(2)>"]] * 2},
        "not a table": "text,label",
        "none": None,
    },
}
NOT_FOR_VISITORS = ["Traceback", 'File "', "Something went wrong", "verbose error reporting",
                    "site-packages", "Exception", "Error(", "object at 0x"]


# Which test module runs which endpoints: each group against a server of its own. An endpoint
# that needs another's result first (/classify after /train_classifier) sits in its group, after it.
GROUPS = {
    "views": ["/choose_model", "/fill_mask", "/fill_jointly", "/score_candidates", "/sentence_score",
              "/compare_models", "/attention", "/neuron_view", "/head_importance", "/heads_off", "/mask_sample",
              "/static_vs_dynamic", "/masking_law", "/article_snippet", "/layer_predictions", "/saliency",
              "/embedding_map", "/search_corpus"],
    "runs": ["/article_finetune", "/finetune", "/compare_masking", "/suggest_probes", "/stop_finetune", "/use_tuned",
             "/use_base", "/download_tuned", "/export_training_script", "/features_after_tuning", "/probe_layers",
             "/classify_example", "/train_classifier", "/stop_classifier", "/classify", "/classifier_features",
             "/download_classifier",
             "/forgetting_sweep", "/adapt_then_classify"],
    "features": ["/sentence_features", "/feature_card", "/steer_feature", "/prediction_features",
                 "/contrast_features", "/feature_quality", "/find_features", "/feature_map", "/similar_features",
                 "/train_features", "/stop_features", "/circuit_graph",
                 "/circuit_intervene", "/circuit_json", "/train_transcoders", "/stop_transcoders"],
}


@contextlib.contextmanager
def suite_app(root: Path):
    """The whole app with a 2-model allowlist, limits small enough to keep the suite fast:
    (its URL, the folders a message must not show)."""
    model = tiny_models.save_tiny_bert(root / MODEL)
    other = tiny_models.save_tiny_distilbert(root / "tiny-distilbert")
    settings = Settings(model=str(model), models=str(other), device="cpu", port=None, onnx=False,
                        finetune_max_steps=20, finetune_max_chars=5_000, features_max_tokens=3_000)
    features = FeatureStore(root / "features", shipped=None)
    lm = bertdemo.load(str(model), device="cpu")
    train_features(lm, 1, RUN_TEXT, FeatureSettings(max_tokens=3_000), store=features)
    run_lines = RUN_TEXT.splitlines()  # the Classify tab's [CLS] features: a small [CLS] dictionary of the model
    cls_features.put_cls(features, cls_features.make_cls_features(
        lm, run_lines[::2], run_lines[1::2], settings=FeatureSettings(latents=32, k=4, max_tokens=2_000, batch_tokens=32)))
    coders = tiny_models.tiny_transcoders(lm)
    with pytest.MonkeyPatch.context() as patch:  # the Circuits tab's transcoders: random ones, built here
        patch.setattr(circuits_tab, "transcoders", lambda holder, lm: coders)
        demo = app.build_demo(settings, features=features)
        url, _ = lifecycle.serve(demo, settings, block=False)
        try:
            yield url, [str(root), str(Path(app.__file__).parent)]
        finally:
            demo.close()


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    """The server of a test module's group (its GROUP): one per module, so the groups run side by
    side. (Here, not in a conftest.py: a second module named conftest would shadow tests/conftest.py
    for `from conftest import ...` in the same process.)"""
    with suite_app(tmp_path_factory.mktemp(f"bad-input-{request.module.GROUP}")) as found:
        yield found


@pytest.fixture(scope="module")
def client(served):
    return Client(served[0], verbose=False)


def cases(group: str):
    for api_name in GROUPS[group]:
        inputs = ENDPOINTS[api_name]
        if not inputs:
            yield pytest.param(api_name, None, None, id=f"{api_name}-no input")
        for index, (kind, _) in enumerate(inputs):
            for name, value in BAD[kind].items():
                yield pytest.param(api_name, index, value, id=f"{api_name}-{index}-{name}")


def group_test(group: str):
    """The test each group's module runs (as `test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds`):
    every case of `group` against that module's server (`served`, `client`)."""
    @pytest.mark.slow
    @pytest.mark.parametrize("api_name, index, value", cases(group))
    def test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds(served, client, api_name, index, value):
        check_case(client, served, api_name, index, value)
    return test_bad_input_gets_a_clear_message_and_the_next_good_request_succeeds


def check_case(client: Client, app: tuple, api_name: str, index: int | None, value) -> None:
    """One case: the bad request's message is for people, and the next good request succeeds."""
    url, server_dirs = app
    good = [v for _, v in ENDPOINTS[api_name]]
    args = good if index is None else [*good[:index], value, *good[index + 1:]]
    message = call(client, url, api_name, args)
    if message is not None:  # refused: the message must be for people, not for the developer
        assert message.strip(), "an empty error message"
        assert len(message) < 600, message[:600]
        assert not [s for s in NOT_FOR_VISITORS + server_dirs if s in message], message
    assert call(client, url, api_name, good) is None, "the good request after it failed"


def call(client: Client, url: str, api_name: str, args: list) -> str | None:
    """None if the endpoint answered (and the files its answer names can be fetched), else the
    message the visitor got."""
    return call_raw(url, api_name, args, client.session_hash, fetch_files=True)


def refusal(response: httpx.Response) -> str:
    """The message of a request refused before it was queued: 400 (an input Gradio could not
    read, e.g. out of a Number's range) or 422 (our validator); gradio_client doesn't unwrap it."""
    assert response.status_code in (400, 422), response.text[:300]
    detail = response.json()["detail"]
    if isinstance(detail, str):
        return detail
    return " ".join(d["message"] for d in detail if not d.get("is_valid", True))


_http: httpx.Client | None = None


def _session() -> httpx.Client:
    """One keep-alive HTTP client for the process's calls (a connection per call costs more)."""
    global _http
    if _http is None:
        _http = httpx.Client(timeout=120)
    return _http


def call_raw(url: str, api_name: str, args: list, session_hash: str | None = None,
             fetch_files: bool = False) -> str | None:
    """The call through Gradio's HTTP API with the JSON body written by hand (NaN allowed): None if
    it completed, else the visitor's message. With `fetch_files`, each file its answer names is
    fetched (a failed fetch raises)."""
    http = _session()
    body = json.dumps({"data": args, "session_hash": session_hash or uuid.uuid4().hex})
    posted = http.post(f"{url}gradio_api/call{api_name}", content=body, timeout=30,
                       headers={"Content-Type": "application/json"})
    if posted.status_code in (400, 422):
        return refusal(posted)
    posted.raise_for_status()
    answer = http.get(f"{url}gradio_api/call{api_name}/{posted.json()['event_id']}", timeout=120)
    answer.raise_for_status()
    events = [line.split(": ", 1) for line in answer.text.splitlines() if ": " in line]
    kinds = [value for key, value in events if key == "event"]
    if kinds and kinds[-1] == "complete":
        if fetch_files:
            data = json.loads(events[-1][1]) if events[-1][0] == "data" else None
            traverse(data, lambda file: _fetch(http, url, file), is_file_obj_with_meta)
        return None
    data = json.loads(events[-1][1]) if events and events[-1][0] == "data" else None
    if isinstance(data, str):  # an unexpected error's message, not an answer
        return data
    return (data or {}).get("error") or ""


def _fetch(http: httpx.Client, url: str, file: dict) -> dict:
    """A file an answer names, fetched as gradio_client downloads it (by its path on the server)."""
    fetched = http.get(f"{url}gradio_api/file={encode_file_path(file['path'])}", follow_redirects=True)
    fetched.raise_for_status()
    return file
