"""bfloat16 vs float32 serving on CPU (`--dtype bfloat16`): speed and fidelity, side by side.

Speed: median `fill_mask` time of the same model loaded in each dtype, interleaved. Fidelity over
a set of one-mask sentences: how often the top-1 prediction agrees with float32, how much of the
top-5 is shared, and the largest probability difference anywhere in the vocabulary.
Default model: bert-base-sized random weights with the real vocab (as the other benches); random
weights give flat distributions with many near-ties, so agreement there is a floor. Pass
`--model FOLDER` (e.g. a saved bert-base-uncased) for a trained model's figures.
Run: python bench/bench_bf16.py [--model FOLDER]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.views import fillmask  # noqa: E402
from common import bert_base_folder, interleaved_medians, sentence_of  # noqa: E402

SENTENCES = [
    "Paris is the [MASK] of France.", "The Eiffel [MASK] is a famous landmark.",
    "The man went to the [MASK] to buy milk.", "She is a [MASK] at the hospital.",
    "The [MASK] sat on the mat.", "BERT learns by predicting [MASK] words from both sides.",
    "I drink a cup of [MASK] every morning.", "The capital of Germany is [MASK].",
    "He plays the [MASK] in a rock band.", "It was raining, so I took my [MASK].",
    "The students handed in their [MASK] on time.", "Water boils at one hundred [MASK].",
    "My sister lives in a small [MASK] near the sea.", "The doctor told him to [MASK] more.",
    "They watched a [MASK] at the cinema last night.", "The train to London was [MASK] by an hour.",
    "She opened the [MASK] and let the cat in.", "The children played in the [MASK] after school.",
    "A [MASK] is a large animal with a trunk.", "He wrote a [MASK] to his grandmother.",
    "The sun rises in the [MASK].", "We need more [MASK] to finish the project.",
    "The book was so [MASK] that I read it twice.", "Please turn off the [MASK] when you leave.",
]


def fidelity(f32, b16) -> dict:
    """Top-1 agreement, mean top-5 overlap and max |p32 - p16| over SENTENCES' masks."""
    agree, overlap, max_diff = 0, 0.0, 0.0
    for text in SENTENCES:
        enc = fillmask.encode(f32, text)
        rows = torch.zeros(len(enc.mask_positions), dtype=torch.long)
        cols = torch.tensor(enc.mask_positions)
        p32 = fillmask.logits_at(f32, enc.inputs, rows, cols).softmax(-1)  # (1, V)
        p16 = fillmask.logits_at(b16, enc.inputs, rows, cols).softmax(-1)
        top32, top16 = p32.topk(5).indices[0].tolist(), p16.topk(5).indices[0].tolist()
        agree += top32[0] == top16[0]
        overlap += len(set(top32) & set(top16)) / 5
        max_diff = max(max_diff, float((p32 - p16).abs().max()))
    n = len(SENTENCES)
    return {"top1": agree / n, "top5_overlap": overlap / n, "max_prob_diff": max_diff, "n": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a saved masked-LM folder (default: bert-base-sized, random)")
    args = parser.parse_args()
    folder = args.model or str(bert_base_folder())
    f32 = bertdemo.load(folder, device="cpu")
    b16 = bertdemo.load(folder, device="cpu", dtype="bfloat16")
    print(f"model: {f32.card.summary()}; {torch.get_num_threads()} threads")
    print(f"bfloat16 weights: {b16.card.size_mb:,.0f} MB vs {f32.card.size_mb:,.0f} MB")
    print(f"{'case':>22} {'f32 ms':>8} {'bf16 ms':>8} {'bf16/f32':>8}")
    for n_tokens, n_masks in ((12, 1), (12, 3), (128, 1)):
        text = sentence_of(f32, n_tokens, n_masks)
        medians = interleaved_medians({"f32": lambda: bertdemo.fill_mask(f32, text),
                                       "b16": lambda: bertdemo.fill_mask(b16, text)})
        print(f"{f'{n_tokens} tokens, {n_masks} mask(s)':>22} {medians['f32'] * 1e3:8.2f} "
              f"{medians['b16'] * 1e3:8.2f} {medians['b16'] / medians['f32']:8.2f}", flush=True)
    if f32.card.head_missing or f32.card.body_missing:  # e.g. MiniLM: no MLM head in the checkpoint
        print("fidelity skipped: the checkpoint lacks weights, which each load initialises at random, "
              "so the two models differ by more than precision")
        return
    fid = fidelity(f32, b16)
    print(f"fidelity over {fid['n']} sentences: top-1 agreement {fid['top1']:.0%}, "
          f"top-5 overlap {fid['top5_overlap']:.0%}, max probability difference {fid['max_prob_diff']:.4f}")


if __name__ == "__main__":
    main()
