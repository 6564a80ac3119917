"""Every view on every encoder family: a tiny random-weight model per family (its own tokenizer
kind), each view compared with a reference built here from the model's own modules and outputs."""
import functools

import pytest
import torch
from transformers import AutoModelForMaskedLM, pipeline

import bertdemo
import tiny_models
from bertdemo.forward import anatomy
from bertdemo.views import heads
from bertdemo.views.fillmask import encode, fill_encoded, logits_at

SENTENCE = "The cat sat on the [MASK] in the park."
LONGER = "We went to the river bank and the [MASK] sat on a very old and very green bench."


@pytest.fixture(scope="module", params=tiny_models.FAMILIES)
def family(request, tmp_path_factory):
    """(family name, its saved folder, the model as bertdemo loads it)."""
    folder = tiny_models.save_tiny_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder, bertdemo.load(str(folder))


@functools.cache
def eager_reference(folder):
    """The same checkpoint loaded afresh by transformers with its eager attention."""
    return AutoModelForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").eval()


def model_inputs(lm, text):
    return lm.tokenizer(lm.to_model_text(text), return_tensors="pt")


def mask_position(lm, text) -> int:
    return encode(lm, text).mask_positions[0]


def test_every_declared_part_is_found(family):
    name, _, lm = family
    found = anatomy.of(lm.model)
    assert found.family is anatomy.FAMILIES[name] and not found.missing
    assert len(found.attention) == 2 and found.attention[0].heads == 2


def test_fill_mask_equals_the_pipeline_alone_and_in_a_padded_batch(family):
    name, folder, lm = family
    ours = bertdemo.fill_mask(lm, SENTENCE, top_k=5)[0]
    reference = pipeline("fill-mask", model=str(folder), tokenizer=str(folder), top_k=5, device="cpu")
    theirs = reference(lm.to_model_text(SENTENCE))
    assert [p["token_id"] for p in ours] == [p["token"] for p in theirs]
    assert [p["score"] for p in ours] == pytest.approx([p["score"] for p in theirs], abs=1e-5)
    batched = fill_encoded(lm, [encode(lm, SENTENCE), encode(lm, LONGER)], [5, 5])[0][0]
    assert [p["token_id"] for p in batched] == [p["token_id"] for p in ours]
    assert [p["score"] for p in batched] == pytest.approx([p["score"] for p in ours], abs=1e-5)


def test_attention_equals_the_eager_models_own_weights(family):
    _, folder, lm = family
    ours = bertdemo.attention(lm, SENTENCE).weights
    with torch.no_grad():
        theirs = eager_reference(folder)(**model_inputs(lm, SENTENCE), output_attentions=True).attentions
    torch.testing.assert_close(torch.from_numpy(ours), torch.cat(theirs), atol=1e-5, rtol=0)


def test_the_neuron_views_scores_give_the_models_weights(family):
    """Queries and keys as the model scores them (after rotary encodings, with position terms):
    the softmax of the view's scores is the model's own attention at every layer and head."""
    _, folder, lm = family
    token = mask_position(lm, SENTENCE)
    with torch.no_grad():
        theirs = eager_reference(folder)(**model_inputs(lm, SENTENCE), output_attentions=True).attentions
    for layer in range(2):
        for head in range(2):
            view = bertdemo.neuron_view(lm, SENTENCE, layer=layer, head=head, token=token)
            expected = theirs[layer][0, head, token].double()
            torch.testing.assert_close(torch.tensor(view["weights"], dtype=torch.float64), expected, atol=1e-5, rtol=0)
            assert len(view["query"]) == view["head_dim"] and len(view["keys"]) == len(view["tokens"])


def _zeroing_reference(lm, folder, layer: int, head: int):
    """A fresh copy whose attention output projection reads nothing from `head` at `layer`'s
    call only (ALBERT calls one shared layer at every depth)."""
    model = eager_reference(folder)
    part = anatomy.of(model).attention[layer]
    wanted = anatomy.calls(model)[id(part.output)].index(layer)
    seen = []

    def zero(module, args):
        seen.append(1)
        if len(seen) - 1 != wanted:
            return None
        heads_side_by_side = args[0].clone()
        heads_side_by_side[..., head * part.head_dim:(head + 1) * part.head_dim] = 0.0
        return (heads_side_by_side,)

    return model, part.output.register_forward_pre_hook(zero), seen


def test_heads_off_equals_the_output_projection_reading_nothing_from_that_head(family):
    name, folder, lm = family
    position = mask_position(lm, SENTENCE)
    for layer, head in [(0, 1), (1, 0)]:
        model, handle, seen = _zeroing_reference(lm, folder, layer, head)
        try:
            with torch.no_grad():
                theirs = model(**model_inputs(lm, SENTENCE)).logits[0, position].softmax(-1)
        finally:
            handle.remove()
        assert seen, "the reference hook never ran"
        off = bertdemo.heads_off(lm, [(layer, head)])
        ours = bertdemo.fill_mask(off, SENTENCE, top_k=5)[0]
        assert [p["token_id"] for p in ours] == theirs.topk(5).indices.tolist()
        assert [p["score"] for p in ours] == pytest.approx(theirs.topk(5).values.tolist(), abs=1e-5)
        assert ours != bertdemo.fill_mask(lm, SENTENCE, top_k=5)[0]  # the head mattered


def test_head_importance_equals_one_head_off_at_a_time(family):
    _, _, lm = family
    found = bertdemo.head_importance(lm, SENTENCE)
    enc = encode(lm, SENTENCE)
    cols = torch.tensor(enc.mask_positions[:1])
    target = found["target"]["token_id"]
    with torch.inference_mode():
        base = logits_at(lm, enc.inputs, torch.zeros_like(cols), cols).log_softmax(-1)[0, target]
        assert found["log_prob"] == pytest.approx(float(base), abs=1e-5)
        for layer in range(found["layers"]):
            for head in range(found["heads"]):
                off = bertdemo.heads_off(lm, [(layer, head)])
                alone = logits_at(off, enc.inputs, torch.zeros_like(cols), cols).log_softmax(-1)[0, target]
                assert found["delta"][layer][head] == pytest.approx(float(alone - base), abs=1e-4)


def test_the_logit_lens_last_layer_is_fill_mask(family):
    _, _, lm = family
    lens = bertdemo.layer_predictions(lm, SENTENCE, top_k=5)[0]
    filled = bertdemo.fill_mask(lm, SENTENCE, top_k=5)[0]
    assert len(lens["layer_names"]) == 3  # the embeddings and two layers
    assert [p["token_id"] for p in lens["layers"][-1]] == [p["token_id"] for p in filled]
    assert [p["score"] for p in lens["layers"][-1]] == pytest.approx([p["score"] for p in filled], abs=1e-5)


def test_attributions_and_embeddings_run(family):
    _, _, lm = family
    coarse, fine = (bertdemo.saliency(lm, SENTENCE, steps=steps) for steps in (4, 128))
    assert len(fine["attributions"]) == len(fine["tokens"])
    # the attributions share out f(x) - f(baseline): more steps, closer (DeBERTa converges slowest)
    assert abs(fine["delta"]) <= max(abs(coarse["delta"]), 1e-3) and abs(fine["delta"]) < 0.25
    mapped = bertdemo.embedding_map(lm, ["The cat sat on the mat.", "A cat ran in the park."], word="cat", layer=2)
    assert len(mapped["points"]) == 2


@pytest.mark.slow
def test_a_few_fine_tune_steps_lower_the_loss(family):
    _, _, lm = family
    text = "\n".join(["The cat sat on the mat.", "The dog sat on the mat.", "A cat ran in the park."] * 8)
    tuned, history = bertdemo.finetune(lm, text, training_length=12, learning_rate=3e-3, batch_size=4, block_length=32)
    assert tuned.model is not lm.model
    assert history.evals[-1].loss < history.evals[0].loss
    assert bertdemo.fill_mask(tuned, SENTENCE)  # the tuned model serves every view too


def test_tokens_are_shown_as_words_whatever_the_tokenizer(family):
    """BPE's Ġ and SentencePiece's ▁ word-start marks, and a decoded BPE token's leading space,
    never reach a label a person reads."""
    from bertdemo import plots

    _, _, lm = family
    att = bertdemo.attention(lm, SENTENCE)
    labels = plots.attention_heatmap(att.tokens, att.weights[0, 0], "layer 1, head 1").data[0].x
    bars = plots.prediction_bars(bertdemo.fill_mask(lm, SENTENCE)).data[0].y
    for label in [*labels, *bars]:
        assert label[:1] not in ("Ġ", "▁", " ") or label.strip("Ġ▁ \u200b") == "", label


def test_the_card_names_the_family_and_its_views(family):
    from bertdemo.model.loading import family_hint

    name, folder, lm = family
    assert lm.card.family == anatomy.FAMILIES[name].name == family_hint(str(folder))
    assert lm.card.views == f"{lm.card.family}: every view"


@pytest.mark.slow
def test_the_app_serves_every_family_and_its_picker_loads_each(tmp_path_factory):
    """The page builds with each family as its model, and the picker loads every one."""
    import app
    from bertdemo.config import Settings

    folders = [str(tiny_models.save_tiny_family(name, tmp_path_factory.mktemp(f"app-{name}")))
               for name in tiny_models.FAMILIES]
    engine = bertdemo.Engine()
    settings = Settings(model=folders[0], models=",".join(folders[1:]), device="cpu")
    demo = app.build_demo(settings, engine=engine)
    assert demo is not None
    for folder in folders:
        served = engine.load_allowed(folder, settings.allowed_models, "cpu")
        assert bertdemo.fill_mask(served, SENTENCE)
        store = app.load_store(Settings(model=folder, device="cpu"), engine)
        assert store.base is not None and store.load_error is None


# ---------------------------------------------------------------- the rest of the masked-LM mapping

def _other_families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    return sorted(set(MODEL_FOR_MASKED_LM_MAPPING_NAMES) - set(tiny_models.FAMILIES))


_UNSET = object()  # a common setting this model type refuses
_OTHER_SETTINGS = {  # what a tiny config of these needs beyond the common one
    "funnel": dict(block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=64, num_hidden_layers=_UNSET),
    "perceiver": dict(num_latents=8, d_latents=32, d_model=32, num_blocks=1, num_self_attends_per_block=1,
                      num_self_attention_heads=2, num_cross_attention_heads=2),
    "squeezebert": dict(embedding_size=32),
    "reformer": dict(axial_pos_embds_dim=[16, 16], axial_pos_shape=[8, 8], attention_head_size=16,
                     feed_forward_size=64, attn_layers=["local", "local"], is_decoder=False),
    "neomme": dict(num_key_value_heads=2),
}
# The model types this test does not build, each with its reason. Any other type that fails to
# build is a failure: after a transformers upgrade a family cannot drop out of the sweep unseen.
NOT_BUILT = {
    "modernvbert": "a vision-language model: its text model sits in sub-configurations (text_config, "
                   "vision_config) that a tiny config here does not make",
    "ultravbert": "a vision-language model, as modernvbert",
}
VIEWS = {
    "fill mask": lambda lm: bertdemo.fill_mask(lm, SENTENCE),
    "joint": lambda lm: bertdemo.fill_jointly(lm, "The [MASK] sat on the [MASK]."),
    "candidates": lambda lm: bertdemo.score_candidates(lm, SENTENCE, ["mat", "dog"]),
    "sentence score": lambda lm: bertdemo.sentence_score(lm, "The cat sat."),
    "attention": lambda lm: bertdemo.attention(lm, SENTENCE),
    "neuron view": lambda lm: bertdemo.neuron_view(lm, SENTENCE, layer=0, head=0, token=1),
    "heads off": lambda lm: bertdemo.fill_mask(bertdemo.heads_off(lm, [(0, 1)]), SENTENCE),
    "importance": lambda lm: bertdemo.head_importance(lm, SENTENCE),
    "logit lens": lambda lm: bertdemo.layer_predictions(lm, SENTENCE),
    "attributions": lambda lm: bertdemo.saliency(lm, SENTENCE, steps=2),
    "embeddings": lambda lm: bertdemo.embedding_map(lm, ["The cat sat.", "A cat ran."], word="cat", layer=1),
    "fine-tune": lambda lm: bertdemo.finetune(lm, "The cat sat on the mat.\n" * 8, training_length=2, batch_size=2,
                                              block_length=16),
}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", _other_families())
def test_any_other_masked_lm_works_or_is_refused_in_words(model_type, tmp_path):
    """Every other model type in transformers' masked-LM mapping: loading and each view either
    work or raise a ValueError (a message in the page), never another exception."""
    from transformers import AutoConfig

    tok = tiny_models.bert_tokenizer()
    settings = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=64, vocab_size=len(tok), pad_token_id=0)
    settings = {k: v for k, v in (settings | _OTHER_SETTINGS.get(model_type, {})).items() if v is not _UNSET}
    config = AutoConfig.for_model(model_type, **settings)
    nested = [k for k in getattr(config, "sub_configs", {}) if getattr(config, k, None) is not None]
    if model_type in NOT_BUILT:
        assert nested, f"{model_type} no longer has sub-configurations: take it off NOT_BUILT and build it"
        pytest.skip(f"{model_type} not built here: {NOT_BUILT[model_type]}")
    assert not nested, f"{model_type} has sub-configurations {nested}: build its text model, or list it in NOT_BUILT"
    torch.manual_seed(0)
    tiny_models._save(AutoModelForMaskedLM.from_config(config), tok, tmp_path)
    try:
        lm = bertdemo.load(str(tmp_path))
    except ValueError as err:
        assert str(tmp_path) in str(err)  # a refusal naming the model
        return
    outcomes = {}
    for view, run in VIEWS.items():
        try:
            run(lm)
            outcomes[view] = "works"
        except ValueError as err:
            assert str(err).strip(), view
            outcomes[view] = "refused"
    assert set(outcomes) == set(VIEWS)  # each view either answered or said why not


def test_the_other_views_answer_on_every_family(family, tiny_bert):
    """Joint filling, candidates, the sentence score, bertviz's views, rollout, two models side by
    side, the layer probes and the classifier, on each family."""
    from bertdemo.views import attention_views

    _, _, lm = family
    joint = bertdemo.fill_jointly(lm, "The [MASK] sat on the [MASK].", beam_size=2)
    assert all(sorted(f["mask"] for f in c["fills"]) == [0, 1] for c in joint)
    scored = bertdemo.score_candidates(lm, SENTENCE, ["mat", "bench"])
    assert len(scored) == 2 and all(s["log_prob"] <= 0 for s in scored)
    pll = bertdemo.sentence_score(lm, "The cat sat.")
    assert pll["pseudo_perplexity"] >= 1
    att = bertdemo.attention(lm, SENTENCE)
    for view in ("head", "model"):
        page = attention_views.bertviz_html(att, view)
        assert "<script" in page and "Ġ" not in page and "▁" not in page
    assert attention_views.rollout(att.weights).sum(-1) == pytest.approx(1.0)
    compared = bertdemo.compare_predictions(lm, tiny_bert, SENTENCE)
    assert len(compared["masks"]) == 1
    examples = [(f"{w} is here today.", "animal" if w in ("cat", "dog") else "place")
                for w in ("cat", "dog", "park", "river") for _ in range(3)]
    probes = bertdemo.probe_layers(lm, examples)
    assert len(probes["layers"]) == 3
    classifier, history = bertdemo.train_classifier(lm, examples, epochs=1, batch_size=4)
    assert history.completed and set(bertdemo.classify(classifier, ["the cat"])[0]) == {"animal", "place"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["modernbert", "albert", "deberta-v2"])
def test_a_families_run_exports_as_a_script_that_trains(name, tmp_path):
    """The exported Trainer script runs on the family (BPE, Unigram; attention of its own)."""
    import subprocess
    import sys

    from bertdemo.training import export

    folder = tiny_models.save_tiny_family(name, tmp_path / "model")
    lm = bertdemo.load(str(folder))
    text = "\n".join(["The cat sat on the mat.", "A dog ran in the park."] * 8)
    _, history = bertdemo.finetune(lm, text, training_length=2, batch_size=4, block_length=32)
    script = export.write_files(history, str(folder), text, tmp_path / "run")
    done = subprocess.run([sys.executable, "train_mlm.py", "--max-steps", "2"], cwd=script, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert bertdemo.fill_mask(bertdemo.load(str(script / "tuned-model")), SENTENCE)
