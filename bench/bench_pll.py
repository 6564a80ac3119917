"""Sentence score (PLL): bertdemo.sentence_score's batched pass vs one forward per token.

Goal: at least 3x faster at 20 tokens. Run: python bench/bench_pll.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import bertdemo  # noqa: E402
from common import interleaved_medians, load_bert_base, sentence_of  # noqa: E402


def main() -> None:
    lm = load_bert_base()
    for n_tokens in (20, 64):
        text = sentence_of(lm, n_tokens, 0)
        ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]

        def one_forward_per_token():  # the textbook loop: mask token i, full forward, read p
            total = 0.0
            with torch.inference_mode():
                for pos in range(1, ids.shape[1] - 1):
                    masked = ids.clone()
                    masked[0, pos] = lm.mask_token_id
                    logits = lm.model(input_ids=masked).logits[0, pos]
                    total += logits.log_softmax(-1)[ids[0, pos]].item()
            return total

        ours = bertdemo.sentence_score(lm, text)["pll"]
        assert abs(ours - one_forward_per_token()) < 1e-2 * max(1.0, abs(ours))
        medians = interleaved_medians({"batched": lambda: bertdemo.sentence_score(lm, text),
                                       "loop": one_forward_per_token}, repeats=5, warmup=1)
        print(f"PLL at {n_tokens} tokens: batched {medians['batched'] * 1e3:7.1f} ms, "
              f"one forward per token {medians['loop'] * 1e3:7.1f} ms, "
              f"speed-up {medians['loop'] / medians['batched']:5.2f}x (goal >= 3x at 20 tokens)")


if __name__ == "__main__":
    main()
