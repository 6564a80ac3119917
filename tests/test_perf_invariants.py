"""Cheap guards for the speed levers the benchmarks rely on (bench/ measures the speed itself)."""
import copy
import dataclasses

import pytest
import torch
import transformers

import bertdemo
import tiny_models
from bertdemo.views import fillmask
from bertdemo.forward import lean_forward
from bertdemo.model.logits import mlm_head, mlm_logits


def test_requests_never_load_models_or_tokenizers(client, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded on the request path")

    for cls in (transformers.AutoModelForMaskedLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)
    text = "Paris is the [MASK] of France."
    for _ in range(2):
        assert client.predict(text, 3, api_name="/fill_mask")[1]
        client.predict(text, 2, api_name="/fill_jointly")


def test_attention_reuses_one_eager_twin_per_model(tiny_bert):
    from bertdemo.views.attention_views import eager_twin

    assert eager_twin(tiny_bert) is eager_twin(tiny_bert)


def test_prediction_path_stays_on_sdpa(tiny_bert):
    bertdemo.attention(tiny_bert, "Paris is the [MASK] of France.")
    assert tiny_bert.model.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------- the LM head at a few rows

@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta", "tiny_distilbert"])
def test_head_at_rows_equals_the_models_own_forward(arch, request):
    lm = request.getfixturevalue(arch)
    texts = [f"Paris is the {lm.mask_token} of France.", f"The {lm.mask_token} tower is a {lm.mask_token}."]
    inputs = lm.tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        full = lm.model(**inputs).logits  # (B, T, V): the (B, T, H) path, F.linear as transformers runs it
        for n in (1, 2, 3, 16):
            rows = torch.arange(n) % len(texts)
            cols = torch.arange(n) % inputs["input_ids"].shape[1]
            logits, _ = mlm_logits(lm.model, inputs, rows, cols, packed=lm.caches.packed)
            assert logits.is_contiguous() and logits.shape == (n, lm.model.config.vocab_size)
            torch.testing.assert_close(logits, full[rows, cols], atol=1e-5, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_rows_linear_values_and_gradients_equal_linear(bias):
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 700, bias=bias)
    fast = copy.deepcopy(plain)
    for n in (1, 3, 40):
        x = torch.randn(n, 48, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, ref = lean_forward.rows_linear(fast, x), plain(x_ref)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        grad = torch.randn_like(ref)
        out.backward(grad)
        ref.backward(grad)
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast.weight.grad, plain.weight.grad, atol=1e-5, rtol=1e-5)
        if bias:
            torch.testing.assert_close(fast.bias.grad, plain.bias.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not lean_forward._ONEDNN, reason="torch built without oneDNN")
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_grad", [True, False])
def test_trained_linear_values_and_gradients_equal_linear(bias, x_grad):
    torch.manual_seed(0)
    weight = torch.randn(300, 64, requires_grad=True)
    b = torch.randn(300, requires_grad=True) if bias else None
    ref_weight = weight.detach().clone().requires_grad_()
    ref_b = b.detach().clone().requires_grad_() if bias else None
    x = torch.randn(37, 64, requires_grad=x_grad)
    x_ref = x.detach().clone().requires_grad_(x_grad)
    out, ref = lean_forward.trained_linear(x, weight, b), torch.nn.functional.linear(x_ref, ref_weight, ref_b)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(weight.grad, ref_weight.grad, atol=1e-5, rtol=1e-5)
    if x_grad:
        torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    if bias:
        torch.testing.assert_close(b.grad, ref_b.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not lean_forward._ONEDNN, reason="torch built without oneDNN")
def test_a_fine_tune_step_runs_every_linear_layer_through_onednn(tiny_bert, monkeypatch):
    """Training on a CPU: each layer's projections, feed-forward and the decoder go through
    `trained_linear`; serving and attributions (weights frozen) never do."""
    from bertdemo.training.fine_tuning import masked_logits

    calls = []
    real = lean_forward.trained_linear
    monkeypatch.setattr(lean_forward, "trained_linear", lambda x, w, b: calls.append(tuple(w.shape)) or real(x, w, b))
    model = copy.deepcopy(tiny_bert.model).train().requires_grad_(True)
    inputs, rows, cols = _padded_batch_with_masks(tiny_bert)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[rows, cols] = inputs["input_ids"][rows, cols]
    torch.nn.functional.cross_entropy(*masked_logits(model, {**inputs, "labels": labels})).backward()
    config = model.config
    # per layer: q, k, v stacked (the last layer: k, v stacked, q alone), output, intermediate, output; the decoder
    assert len(calls) == 4 * config.num_hidden_layers + 1 + 1
    assert (config.vocab_size, config.hidden_size) in calls
    calls.clear()
    with torch.no_grad():
        fillmask.fill_mask(tiny_bert, "Paris is the [MASK] of France.")
    bertdemo.saliency(tiny_bert, "Paris is the [MASK] of France.")  # grad on, the served weights frozen
    assert calls == []


def test_fast_decoder_keeps_weights_tied_and_state_dict(tiny_bert):
    mlm_head(tiny_bert.model, tiny_bert.caches.packed)
    decoder = tiny_bert.model.get_output_embeddings()
    assert type(decoder) is torch.nn.Linear  # the model is left as transformers made it
    assert decoder.weight is tiny_bert.model.get_input_embeddings().weight  # still tied
    fresh = type(tiny_bert.model)(tiny_bert.model.config)  # what save_pretrained writes is unchanged
    assert list(tiny_bert.model.state_dict()) == list(fresh.state_dict())


# ---------------------------------------------------------------- Predict = fill_mask + fill_jointly

def _count_forwards(lm):
    calls = []
    return calls, lm.model.base_model.embeddings.register_forward_hook(lambda m, i, o: calls.append(1))


@pytest.mark.parametrize("text, steps", [("the [MASK] of paris is a tower in france .", 1),
                                         ("a [MASK] tower is in the [MASK] of berlin .", 2)])
def test_joint_fill_reuses_the_fill_mask_forward(tiny_bert, text, steps):
    # Sentences no other test predicts, so nothing is remembered for them yet.
    calls, hook = _count_forwards(tiny_bert)
    try:
        alone = bertdemo.fill_jointly(tiny_bert, text, 3)
        assert len(calls) == steps
        bertdemo.fill_mask(tiny_bert, text, 5)  # what the page runs first on Predict
        calls.clear()
        after = bertdemo.fill_jointly(tiny_bert, text, 3)
        assert len(calls) == steps - 1  # the first step came from fill_mask's forward
        calls.clear()
        bertdemo.fill_jointly(tiny_bert, text.replace("tower", "city"), 3)
        assert len(calls) == steps  # another sentence: computed
    finally:
        hook.remove()
    assert [r["text"] for r in after] == [r["text"] for r in alone]
    assert [[f["token_id"] for f in r["fills"]] for r in after] == [[f["token_id"] for f in r["fills"]] for r in alone]
    assert [r["log_prob"] for r in after] == pytest.approx([r["log_prob"] for r in alone], abs=1e-5)


# ---------------------------------------------------------------- the lean forward (no padding, last layer at masks)

def _padded_batch_with_masks(lm):
    """Three sentences of different lengths (so two are padded), masks at the start, the middle
    and the end, two in one sentence; asked in an order that is not the batch's."""
    mask = lm.mask_token
    texts = [f"{mask} is the capital of france .", f"the tower is a famous {mask} in the {mask} of paris .",
             f"a short {mask}"]
    inputs = lm.tokenizer(texts, return_tensors="pt", padding=True)
    rows, cols = (inputs["input_ids"] == lm.mask_token_id).nonzero(as_tuple=True)
    order = torch.tensor([3, 0, 2, 1])
    return inputs, rows[order], cols[order]


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta", "minilm"])
def test_lean_forward_equals_the_full_forward_at_the_asked_positions(arch, request, engine):
    lm = engine.load_minilm("cpu") if arch == "minilm" else request.getfixturevalue(arch)
    inputs, rows, cols = _padded_batch_with_masks(lm)
    assert (inputs["attention_mask"] == 0).any()  # padding is really skipped, not absent
    with torch.inference_mode():
        full = lm.model.base_model(**inputs).last_hidden_state[rows, cols]
        lean = lean_forward.hidden_at(lm.model, inputs, rows, cols, lm.caches.packed)
        one = lean_forward.hidden_at(lm.model, {k: v[1:2] for k, v in inputs.items()},
                                     torch.zeros(2, dtype=torch.long), cols[rows == 1], lm.caches.packed)
    torch.testing.assert_close(lean, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(one, full[rows == 1], atol=1e-5, rtol=0)


def test_lean_forward_steps_aside_where_it_would_be_wrong(tiny_bert, tiny_distilbert):
    inputs, rows, cols = _padded_batch_with_masks(tiny_bert)
    padding = (inputs["attention_mask"] == 0).nonzero()[0]
    with torch.inference_mode():
        assert lean_forward.hidden_at(tiny_distilbert.model, inputs, rows, cols) is None  # not BERT's layers
        assert lean_forward.hidden_at(tiny_bert.model, inputs, padding[:1], padding[1:]) is None
    assert lean_forward.hidden_at(tiny_bert.model, inputs, rows, cols) is None  # grad on in eval: attributions
    twin = copy.deepcopy(tiny_bert.model).train().to(torch.bfloat16)
    with torch.inference_mode():
        assert lean_forward.hidden_at(twin, inputs, rows, cols) is None  # trained, not in float32
    # (trained in float32 on a CPU it runs, dropout and all: the tests below)


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta"])
def test_training_through_the_lean_forward_gives_the_models_own_loss_and_gradients(arch, request):
    """A fine-tune on a CPU runs the last layer at its masked tokens only: with dropout at 0 the
    loss and every gradient equal those of the model's own forward over every token."""
    from bertdemo.training.fine_tuning import masked_logits

    lm = request.getfixturevalue(arch)
    model = copy.deepcopy(lm.model).train().requires_grad_(True)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs, rows, cols = _padded_batch_with_masks(lm)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[rows, cols] = inputs["input_ids"][rows, cols]
    assert lean_forward.trains(model)
    logits, targets = masked_logits(model, {**inputs, "labels": labels})
    lean_loss = torch.nn.functional.cross_entropy(logits, targets)
    lean_grads = torch.autograd.grad(lean_loss, list(model.parameters()), allow_unused=True)
    reference = model(**inputs, labels=labels).loss  # transformers' forward, head at every token
    reference_grads = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(lean_loss, reference, atol=1e-5, rtol=0)
    for (name, _), ours, theirs in zip(model.named_parameters(), lean_grads, reference_grads):
        if theirs is None:
            continue
        torch.testing.assert_close(ours if ours is not None else torch.zeros_like(theirs), theirs,
                                   atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ["tiny_bert", "tiny_roberta"])
def test_training_through_the_lean_forward_draws_the_models_own_dropout(arch, request):
    """Under one seed, the lean forward's dropout equals the model's own (every draw made as its
    forward makes it, the last layer's taken at the masks): the same loss and gradients, so a run
    repeats whichever forward it takes (the exported training script's first loss equals the demo's)."""
    from bertdemo.training.fine_tuning import masked_logits

    lm = request.getfixturevalue(arch)
    model = copy.deepcopy(lm.model).train().requires_grad_(True)
    inputs, rows, cols = _padded_batch_with_masks(lm)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[rows, cols] = inputs["input_ids"][rows, cols]
    torch.manual_seed(7)
    lean_loss = torch.nn.functional.cross_entropy(*masked_logits(model, {**inputs, "labels": labels}))
    lean_grads = torch.autograd.grad(lean_loss, list(model.parameters()), allow_unused=True)
    torch.manual_seed(7)
    reference = model(**inputs, labels=labels).loss
    reference_grads = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    torch.manual_seed(8)
    other = torch.nn.functional.cross_entropy(*masked_logits(model, {**inputs, "labels": labels}))
    torch.testing.assert_close(lean_loss, reference, atol=1e-5, rtol=0)
    assert abs(float((other - reference).detach())) > 1e-4  # the dropout is really drawn
    for (name, _), ours, theirs in zip(model.named_parameters(), lean_grads, reference_grads):
        if theirs is not None:
            torch.testing.assert_close(ours if ours is not None else torch.zeros_like(theirs), theirs,
                                       atol=1e-5, rtol=1e-4, msg=name)


def test_training_through_the_lean_forward_applies_dropout(tiny_bert):
    """In train mode the lean forward drops as the modules do: two draws differ, eval does not."""
    from bertdemo.training.fine_tuning import masked_logits

    model = copy.deepcopy(tiny_bert.model).train().requires_grad_(True)
    inputs, rows, cols = _padded_batch_with_masks(tiny_bert)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[rows, cols] = inputs["input_ids"][rows, cols]
    batch = {**inputs, "labels": labels}
    first, second = masked_logits(model, batch)[0], masked_logits(model, batch)[0]
    assert not torch.allclose(first, second)
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(masked_logits(model, batch)[0], masked_logits(model, batch)[0])


def test_a_fine_tunes_evaluation_under_autocast_takes_the_models_own_forward(tiny_bert):
    """On a GPU a fine-tune evaluates under bf16 autocast; the lean forward wrote autocast's bf16
    rows into float32 buffers there and the run failed at its first evaluation."""
    from bertdemo.training.fine_tuning import masked_logits

    inputs, rows, cols = _padded_batch_with_masks(tiny_bert)
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[rows, cols] = inputs["input_ids"][rows, cols]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, targets = masked_logits(tiny_bert.model, {**inputs, "labels": labels})
        full = tiny_bert.model(**inputs).logits.float()
    order = (labels != -100).nonzero(as_tuple=True)
    torch.testing.assert_close(logits, full[order], atol=1e-5, rtol=0)
    assert torch.equal(targets, labels[order])


def test_a_padded_batch_runs_the_last_feed_forward_at_its_masks_only(tiny_bert, monkeypatch):
    """What makes the crowd's batched forward cheaper: rows fed to the first and last layers'
    feed-forward are the real tokens and the masks, not the padded (B x T) grid."""
    texts = ["paris is the [MASK] of france .", "the [MASK] tower is a famous [MASK] in the city of paris ."]
    encs = [fillmask.encode(tiny_bert, t) for t in texts]
    layers = tiny_bert.model.base_model.encoder.layer
    watched, seen = {layers[0].output.dense: "first", layers[-1].output.dense: "last"}, {}
    linear_add = lean_forward.Kernels.linear_add  # what runs a layer's output dense (with its residual)

    def counting(kernels, module, x, residual):
        if module in watched:
            seen[watched[module]] = x.shape[0]
        return linear_add(kernels, module, x, residual)

    monkeypatch.setattr(lean_forward.Kernels, "linear_add", counting)
    fillmask.fill_encoded(tiny_bert, encs, [3, 3])
    assert seen == {"first": sum(e.input_ids.shape[1] for e in encs), "last": 3}


def test_the_packed_linear_follows_a_weight_changed_in_place(tiny_bert):
    """The oneDNN-packed weight of a layer is packed again when its weight changes (a model trained in place
    must not be served with its old weights)."""
    model, packed = copy.deepcopy(tiny_bert.model), lean_forward.PackedWeights()
    dense = model.base_model.encoder.layer[0].intermediate.dense
    x = torch.randn(5, dense.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(lean_forward.linear(dense, x, packed), dense(x), atol=1e-5, rtol=0)
        assert len(packed) == 1
        dense.weight.mul_(2)
        dense.bias.add_(1)
        torch.testing.assert_close(lean_forward.linear(dense, x, packed), dense(x), atol=1e-5, rtol=0)


def test_a_model_evaluated_while_trained_in_place_is_served_with_its_new_weights(tiny_bert):
    """Evaluations during fine-tuning take the lean path too; torch's fused AdamW then writes the
    weights without bumping their version, so a oneDNN-packed copy made by such an evaluation would
    serve the old weights once the model is frozen and served."""
    model, packed = copy.deepcopy(tiny_bert.model).requires_grad_(True), lean_forward.PackedWeights()
    inputs, rows, cols = _padded_batch_with_masks(tiny_bert)
    with torch.no_grad():
        lean_forward.hidden_at(model, inputs, rows, cols, packed)  # an evaluation during training
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    model.train()
    model(**inputs).logits.square().mean().backward()
    optimizer.step()
    model.eval().requires_grad_(False)  # as `training.finetune` hands the tuned model over
    with torch.inference_mode():
        full = model.base_model(**inputs).last_hidden_state[rows, cols]
        lean = lean_forward.hidden_at(model, inputs, rows, cols, packed)
    torch.testing.assert_close(lean, full, atol=1e-5, rtol=0)


def test_attention_with_masks_adds_no_second_packed_decoder(tiny_bert):
    """The attention tab's eager twin shares the model's weights, so its LM head reads the same
    packed decoder: a model used in both tabs holds one packed copy (94 MB for bert-base)."""
    from bertdemo.views.attention_views import attention
    lm = dataclasses.replace(tiny_bert, model=copy.deepcopy(tiny_bert.model))  # weights of its own
    fillmask.fill_mask(lm, "Paris is the [MASK] of France.")  # packs them, decoder included
    packed = len(lm.caches.packed)
    attention(lm, "Paris is the [MASK] of France.")
    assert len(lm.caches.packed) == packed


def test_a_served_model_is_packed_before_its_first_visitor(tmp_path):
    """The page's models are loaded through `Engine.load_allowed`, which packs their weights for
    oneDNN then: the first visitor's prediction packs nothing (it would cost ~0.3 s on bert-base)."""
    folder = str(tiny_models.save_tiny_bert(tmp_path / "fresh", seed=5))
    lm = bertdemo.Engine().load_allowed(folder, [folder], device="cpu")  # an engine of its own
    packed = len(lm.caches.packed)
    assert packed > 0
    fillmask.fill_mask(lm, "Paris is the [MASK] of France.")
    assert len(lm.caches.packed) == packed


def test_gradio_summarises_its_event_log_once_per_hundred_events(app_demo):
    """Gradio rebuilds a pandas summary of up to 10,000 past events after every event (for a
    monitoring page this app does not open): 2-13 ms of CPU per request. The app asks for it once
    per 100 events; this fails if Gradio stops reading the setting where the app puts it."""
    assert app_demo._queue.ANAYLTICS_CACHE_FREQUENCY == 100


def test_the_page_keeps_no_run_history_unless_asked(monkeypatch):
    """Gradio's run history re-reads and re-writes every past event's outputs (a feature map's 260 kB
    each) in the visitor's browser on each event: off unless GRADIO_RUN_HISTORY asks for it."""
    import gradio as gr

    from bertdemo.config import Settings
    from bertdemo.ui.serving import lifecycle

    monkeypatch.delenv("GRADIO_RUN_HISTORY", raising=False)
    assert lifecycle.run_history() is False
    monkeypatch.setenv("GRADIO_RUN_HISTORY", "true")
    assert lifecycle.run_history() is None  # Gradio reads it itself
    monkeypatch.delenv("GRADIO_RUN_HISTORY")
    with gr.Blocks() as demo:
        gr.Markdown("page")
    lifecycle.serve(demo, Settings(model="tiny", device="cpu", port=None), block=False)
    try:
        assert demo.run_history is False and "runs" not in demo.footer_links
    finally:
        demo.close()


def test_gradio_makes_the_apps_fastapi_app_once_at_launch(tiny_bert_dir, monkeypatch):
    """Gradio makes a demo's FastAPI app in `gr.Blocks()`, when its `with` block ends, again in
    `queue()`, and once more in `launch()`, which serves only that one: `app.build_demo` skips the
    first three (0.3 s of CPU a start; `lifecycle.app_made_at_launch`). Fails when Gradio stops
    making them so (the skip is then dead code) or calls them otherwise (it then skips nothing);
    the one launch makes serves the whole page."""
    import gradio as gr
    import httpx
    from gradio import routes

    import app
    from bertdemo.config import Settings
    from bertdemo.ui.serving import lifecycle
    from conftest import launch

    calls = []

    def counted(blocks, **kwargs):
        calls.append(kwargs)
        return real(blocks, **kwargs)

    real = lifecycle._GRADIOS_CREATE_APP
    monkeypatch.setattr(lifecycle, "_GRADIOS_CREATE_APP", counted)
    monkeypatch.setattr(routes.App, "create_app", staticmethod(lifecycle._create_app))
    with gr.Blocks() as plain:  # any other demo: Gradio's own calls, with the arguments the skip knows
        gr.Markdown("page")
    plain.queue()
    assert calls == [{"mcp_server": False}] * 3 and plain.app is not None
    calls.clear()
    demo = app.build_demo(Settings(model=str(tiny_bert_dir), device="cpu", onnx=False))
    assert calls == []
    url = launch(demo)
    try:
        assert len(calls) == 1 and demo.app is not None
        config = httpx.get(f"{url.rstrip('/')}/config", timeout=20).json()
        assert {c.get("api_name") for c in config["dependencies"]} >= {"fill_mask", "attention"}
    finally:
        demo.close()
