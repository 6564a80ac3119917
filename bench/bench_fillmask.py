"""Fill-mask latency: bertdemo.fill_mask vs ONNX Runtime's fused BERT vs pipeline("fill-mask"),
side by side in one interleaved run.

Goals: ours/ORT <= 0.90 and ours/pipe <= 0.60 at every case (1-3 masks at 9, 12, 32 and 128
tokens), on any CPU. ORT is what a user picks for CPU speed: the model exported with
`torch.onnx.export`, fused by `onnxruntime.transformers.optimizer` (model_type "bert": Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization), ORT_ENABLE_ALL, the same thread count,
threads that sleep when they wait, as ours (bertdemo/forward/onnx_engine.py says why;
--ort-spinning "within runs"|always to spin within a run, or ORT's default);
it computes the whole MLM head at every token, as an exported *ForMaskedLM does. "bound" is
transformers' base-model forward plus the LM head at the masked positions only. Rounds interleave
the four, call by call, so machine noise and the caches' state between calls hit all alike, and
run on the engine's compute thread, where the app runs its forwards (bertdemo/serving/compute.py:
one thread calling torch keeps torch's OpenMP workers spinning between operations), for all four.
Run: python bench/bench_fillmask.py [--repeats N] [--device cuda]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from transformers import pipeline  # noqa: E402

import bertdemo  # noqa: E402
from common import bert_base_folder, interleaved_medians, machine, sentence_of  # noqa: E402

# (tokens incl. [CLS]/[SEP], masks)
CASES = [(n, m) for n in (9, 12, 32, 128) for m in (1, 2, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds per case (median)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda (then no ORT column)")
    parser.add_argument("--ort-spinning", default="never", choices=["within runs", "always", "never"],
                        help="the peer's threads: sleeping when they wait, as ours (default), spinning within runs, or ORT's default (always)")
    parser.add_argument("--torch", action="store_true",
                        help="ours through torch (--no-onnx), not ONNX Runtime or torch as measured faster")
    parser.add_argument("--tokens", default="9,12,32,128",
                        help="the sentence lengths to run (tokens, specials included), comma-separated: some of 9,12,32,128")
    args = parser.parse_args()
    lengths = {int(n) for n in args.tokens.split(",")}
    if not lengths <= {n for n, _ in CASES}:
        parser.error(f"--tokens: each of {sorted({n for n, _ in CASES})}, comma-separated")
    folder = str(bert_base_folder())
    engine = bertdemo.Engine(onnx=False if args.torch else None)  # as the app serves it: by measurement
    lm = engine.load_allowed(folder, [folder], device=args.device)
    forward = "torch (lean_forward)"
    if engine.onnx_ready(lm, timeout=600):
        crossover = lm.caches.onnx_for(lm.model).crossover
        forward = (f"ONNX Runtime up to {crossover.single_tokens} tokens, torch beyond (measured)"
                   if crossover is not None else "ONNX Runtime (onnx_engine)")
    fill = pipeline("fill-mask", model=lm.model, tokenizer=lm.tokenizer, device=lm.device)
    session = None
    if lm.device.type == "cpu":
        from ort_peer import ort_session

        session = ort_session(bert_base_folder(), threads=torch.get_num_threads(), spinning=args.ort_spinning)
    print(f"machine: {machine()}")
    print(f"model: bert-base-sized BertForMaskedLM, device {lm.device}; ours runs through {forward}; "
          f"ORT peer's threads spinning: {args.ort_spinning}")
    print(f"{'case':>22} {'ours ms':>8} {'ORT ms':>8} {'pipe ms':>8} {'bound':>8} {'ours/ORT':>9} {'ours/pipe':>9}")
    rows = [engine.compute.run(measure_case, lm, fill, session, n_tokens, n_masks, args.repeats)
            for n_tokens, n_masks in CASES if n_tokens in lengths]
    if session is not None:
        print(f"worst ours/ORT: {max(r[0] for r in rows):.2f} (goal <= 0.90)")
    print(f"worst ours/pipe: {max(r[1] for r in rows):.2f} (goal <= 0.60)")


def measure_case(lm, fill, session, n_tokens: int, n_masks: int, repeats: int = 15) -> tuple[float, float]:
    """Print one row of medians; returns (ours/ORT, ours/pipe)."""
    from ort_peer import ort_fill_mask

    text = sentence_of(lm, n_tokens, n_masks)
    model_text = lm.to_model_text(text)
    inputs = lm.tokenizer(model_text, return_tensors="pt").to(lm.device)
    positions = (inputs["input_ids"][0] == lm.mask_token_id).nonzero().flatten()

    def bound():  # encoder + head at the masked positions only
        with torch.inference_mode():
            hidden = lm.model.base_model(**inputs).last_hidden_state
            lm.model.cls(hidden[0, positions]).cpu()

    fns = {"ours": lambda: bertdemo.fill_mask(lm, text, top_k=5),
           "pipe": lambda: fill(model_text, top_k=5), "bound": bound}
    if session is not None:
        fns["ort"] = lambda: ort_fill_mask(session, lm.tokenizer, model_text, top_k=5)
    medians = interleaved_medians(fns, repeats=repeats)
    ort = medians.get("ort", float("nan"))
    ratios = (medians["ours"] / ort, medians["ours"] / medians["pipe"])
    print(f"{f'{n_tokens} tokens, {n_masks} mask(s)':>22} {medians['ours'] * 1e3:8.2f} {ort * 1e3:8.2f} "
          f"{medians['pipe'] * 1e3:8.2f} {medians['bound'] * 1e3:8.2f} {ratios[0]:9.2f} {ratios[1]:9.2f}", flush=True)
    return ratios


if __name__ == "__main__":
    main()
