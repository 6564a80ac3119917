"""Embeddings and layer probes: their time for 20 sentences on bert-base, beside one forward.

Goals, on a bert-base-sized random-weight model with the real vocab, 2 CPU threads:
- embedding_map of one word in 20 sentences (~12 tokens each), last layer: under 1 s;
- probe_layers on 20 labelled sentences (2 labels), all 13 layers: under 5 s.
The reference is one forward of the same 20 sentences with output_hidden_states (what both need).
Run: python bench/bench_embeddings.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.config import cpu_model  # noqa: E402
from common import interleaved_medians, load_bert_base  # noqa: E402

THREADS = 2  # the goals are stated for a 2-core CPU Space
RIVER = ["We walked along the bank of the river at dawn.", "The boat drifted toward the muddy bank.",
         "Reeds grew thick on the far bank of the stream.", "He sat on the grassy bank and fished all day.",
         "The river burst its bank after the storm."]
MONEY = ["She opened an account at the bank downtown.", "The bank approved our loan this morning.",
         "He works as a clerk at the local bank.", "The bank raised its interest rates again.",
         "I need to transfer money from my bank account."]
SENTENCES = (RIVER + MONEY) * 2  # 20


def forward(lm, texts):
    batch = lm.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        return lm.model.base_model(**batch, output_hidden_states=True).hidden_states


def main() -> None:
    torch.set_num_threads(THREADS)
    lm = load_bert_base()
    layers = lm.model.config.num_hidden_layers
    examples = [(text, "river") for text in RIVER * 2] + [(text, "money") for text in MONEY * 2]
    medians = interleaved_medians({
        "forward": lambda: forward(lm, SENTENCES),
        "map_word": lambda: bertdemo.embedding_map(lm, SENTENCES, layer=layers, word="bank"),
        "map_tokens": lambda: bertdemo.embedding_map(lm, SENTENCES, layer=layers),
        "probes": lambda: bertdemo.probe_layers(lm, examples, seed=0),
    }, repeats=5, warmup=1)
    one = medians["forward"]
    print(f"CPU: {cpu_model()}, {torch.get_num_threads()} threads; bert-base-sized, {len(SENTENCES)} sentences")
    print(f"one forward, output_hidden_states      {one * 1e3:8.1f} ms  (1.00x)")
    for name, label, goal in (("map_word", "embedding_map, word 'bank'", 1.0),
                              ("map_tokens", "embedding_map, every token", 1.0),
                              ("probes", f"probe_layers, {layers + 1} layers", 5.0)):
        print(f"{label:38s}  {medians[name] * 1e3:8.1f} ms  ({medians[name] / one:4.2f}x; goal < {goal:g} s: "
              f"{'met' if medians[name] < goal else 'NOT met'})")


if __name__ == "__main__":
    main()
