"""The peer a user picks for fast CPU fill-mask: the model exported to ONNX and run by ONNX Runtime
with its transformer optimizer (fused attention, LayerNorm and GELU kernels), as its docs show.

    session = ort_session(folder, threads=2)              # exported and optimised once per folder
    probs = ort_fill_mask(session, lm.tokenizer, text)    # (masks, vocab) probabilities

The session computes the whole MLM head at every position (logits (1, T, vocab)), as an exported
*ForMaskedLM does; the softmax at the masks is taken here, as the pipeline does.
"""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import torch

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_and_optimise(model, folder: Path) -> Path:
    """`model` (a BertForMaskedLM in eval mode) -> folder/model.opt.onnx, fused for CPU float32."""
    from onnxruntime.transformers.optimizer import optimize_model

    raw, fused = folder / "model.onnx", folder / "model.opt.onnx"
    if not fused.exists():
        folder.mkdir(parents=True, exist_ok=True)
        example = {name: torch.ones(1, 8, dtype=torch.long) for name in INPUTS}
        example["token_type_ids"].zero_()
        dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
        with torch.inference_mode(False), torch.no_grad():
            torch.onnx.export(model.eval(), (), str(raw), kwargs=example, input_names=list(INPUTS),
                              output_names=["logits"], dynamic_axes={**dynamic, "logits": {0: "batch", 1: "sequence"}},
                              opset_version=17, dynamo=False)
        config = model.config
        optimised = optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                                   hidden_size=config.hidden_size, opt_level=1)
        optimised.save_model_to_file(str(fused))
        print(f"ORT fusions: {optimised.get_fused_operator_statistics()}")
    return fused


def ort_session(folder, threads: int, spinning: str = "never"):
    """An InferenceSession over the fused graph of the BertForMaskedLM saved in `folder`,
    ORT_ENABLE_ALL, `threads` intra-op threads; the export is kept in the temp dir under a key of
    the weights. Exported with eager attention: ORT's optimizer fuses that pattern into its
    Attention op (12 of 12 on bert-base), not the SDPA one (0 of 12).

    `spinning`: "never" (default), as ours runs (bertdemo/forward/onnx_engine.py): threads sleep
    when they wait; "within runs": they busy-wait between the operators of a run and stop when it
    ends (`session.force_spinning_stop`); "always", ORT's default, its threads also busy-wait
    after each run, which takes the CPU from whichever call comes next (measured: ours 23.6 ms
    alone, 31.8 ms right after such a peer)."""
    import onnxruntime as ort
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    key = hashlib.sha1(b"".join(p.detach().flatten()[:64].numpy().tobytes()
                                for p in model.parameters())).hexdigest()[:12]
    path = export_and_optimise(model, Path(tempfile.gettempdir()) / f"bertdemo-bench-onnx-{key}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if spinning != "always":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0" if spinning == "never" else "1")
    if spinning == "within runs":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_fill_mask(session, tokenizer, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
    """Top-k (token, probability) at each [MASK] of `text`, from the session's full logits."""
    encoded = tokenizer(text, return_tensors="np")
    feeds = {name: encoded[name].astype(np.int64) for name in INPUTS}
    logits = session.run(["logits"], feeds)[0][0]  # (T, vocab)
    masked = logits[encoded["input_ids"][0] == tokenizer.mask_token_id]  # (masks, vocab)
    probs = np.exp(masked - masked.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argpartition(-probs, top_k, -1)[:, :top_k]  # then sorted: the top k only
    best = np.take_along_axis(top, np.argsort(-np.take_along_axis(probs, top, -1), -1), -1)
    return [[(tokenizer.convert_ids_to_tokens(int(i)), float(row[i])) for i in ids]
            for row, ids in zip(probs, best)]
