"""The running app, called through its public API with gradio_client, as a Space visitor's script would."""
import pytest
from gradio_client.exceptions import AppError

import bertdemo


def test_fill_mask_endpoint_matches_service(client, tiny_bert):
    text = "Paris is the [MASK] of [mask]."
    plot, raw, info = client.predict(text, 4, api_name="/fill_mask")
    expected = bertdemo.fill_mask(tiny_bert, text, top_k=4)
    assert [[p["token_id"] for p in row] for row in raw] == [[p["token_id"] for p in row] for row in expected]
    assert "tiny-bert" in info
    assert plot is not None


def test_joint_and_candidates_and_sentence_score(client, tiny_bert):
    text = "Paris is the [MASK] of France."
    joint = client.predict(text, 2, api_name="/fill_jointly")
    assert len(joint["data"]) == 2 and "[MASK]" not in joint["data"][0][-1]  # the filled sentence, last
    table = client.predict(text, "capital, unbelievably", 1, api_name="/score_candidates")
    words = [row[0] for row in table["data"]]
    assert sorted(words) == ["capital", "unbelievably"]
    summary, _ = client.predict("Paris is the capital of France.", api_name="/sentence_score")
    expected = bertdemo.sentence_score(tiny_bert, "Paris is the capital of France.")
    assert f"{expected['pseudo_perplexity']:.2f}" in summary


@pytest.mark.parametrize("text, message", [
    ("", "empty"), ("no mask here", "No \\[MASK\\]"), ("[MASK] " * 11, "at most 10"),
    ("[MASK] " + "paris " * 100, "at most 64 tokens"),
])
def test_bad_input_shows_message_and_server_stays_up(client, text, message):
    with pytest.raises(AppError, match=message):
        client.predict(text, 5, api_name="/fill_mask")
    _, raw, _ = client.predict("Paris is the [MASK].", 5, api_name="/fill_mask")
    assert len(raw) == 1


def test_bad_candidate_mask_number(client):
    with pytest.raises(AppError, match="whole number|minimum value 1"):
        client.predict("Paris is the [MASK].", "city", -3, api_name="/score_candidates")
