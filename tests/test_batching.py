"""Micro-batching: concurrent fill-mask requests share forwards, results equal unbatched ones."""
import threading

import pytest

import bertdemo
from bertdemo.batching import MicroBatcher

TEXTS = ["Paris is the [MASK] of France.", "The [MASK] tower is a famous [MASK].",
         "[MASK] is the capital of germany and berlin is a big [MASK] with a river .",
         "a [MASK]", "la tour eiffel est situee a [MASK] ."]


def _run_together(batcher, lm, texts, top_k=5):
    """Call batcher.fill_mask from one thread per text, all released at once."""
    barrier = threading.Barrier(len(texts))
    results, errors = [None] * len(texts), [None] * len(texts)

    def call(i):
        barrier.wait()
        try:
            results[i] = batcher.fill_mask(lm, texts[i], top_k)
        except ValueError as err:
            errors[i] = err

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results, errors


def test_batched_equals_unbatched_and_uses_fewer_forwards(tiny_bert):
    forwards = []
    hook = tiny_bert.model.base_model.register_forward_hook(lambda m, i, o: forwards.append(1))
    try:
        results, errors = _run_together(MicroBatcher(), tiny_bert, TEXTS * 4)
    finally:
        hook.remove()
    assert errors == [None] * len(results)
    assert len(forwards) < len(results)  # concurrent requests shared forwards
    for text, result in zip(TEXTS * 4, results):
        alone = bertdemo.fill_mask(tiny_bert, text)
        assert [[p["token_id"] for p in row] for row in result] == \
               [[p["token_id"] for p in row] for row in alone]
        for row, ref in zip(result, alone):
            assert [p["score"] for p in row] == pytest.approx([p["score"] for p in ref], abs=1e-5)


def test_bad_input_fails_only_its_own_request(tiny_bert):
    texts = ["Paris is the [MASK].", "no mask at all", "", "The [MASK] tower."]
    results, errors = _run_together(MicroBatcher(), tiny_bert, texts)
    assert errors[0] is None and errors[3] is None
    assert "No [MASK]" in str(errors[1]) and "empty" in str(errors[2])
    assert len(results[0]) == 1 and len(results[3]) == 1


def test_mixed_models_are_batched_separately(tiny_bert, tiny_distilbert):
    batcher = MicroBatcher()
    barrier = threading.Barrier(2)
    out = {}

    def call(name, lm):
        barrier.wait()
        out[name] = batcher.fill_mask(lm, "Paris is the [MASK] of France.", 3)

    threads = [threading.Thread(target=call, args=a) for a in
               (("bert", tiny_bert), ("distil", tiny_distilbert))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for name, lm in (("bert", tiny_bert), ("distil", tiny_distilbert)):
        alone = bertdemo.fill_mask(lm, "Paris is the [MASK] of France.", 3)
        assert [p["token_id"] for p in out[name][0]] == [p["token_id"] for p in alone[0]]
