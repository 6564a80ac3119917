"""int8 as a candidate for a CPU without native bfloat16: ONNX Runtime's dynamic int8 quantization of
the app's own export, against the forwards the app serves with, side by side (not served yet).

For an Intel Xeon without AVX512-BF16 or AMX (the CPU where the crowd stays furthest from its
floor, docs/benchmarks.md), bfloat16 is slower than float32 and int8 is what it multiplies
natively (AVX512-VNNI). This times, interleaved, on a crowd of 16 different one-mask sentences and
on one: ONNX Runtime on the app's export (`forward.onnx_engine.export`: fused, head at the masks) in
float32 and quantized to int8 (`onnxruntime.quantization.quantize_dynamic`, per tensor and per
channel), and the lean torch forward in float32 and bfloat16. Fidelity on the bundled model
(trained weights) over its everyday sentences, the answer word masked: how often int8's top word is
float32's, and the largest move of a float32 top-5 word's probability.
Run: python bench/bench_int8.py [--repeats 15]
"""
import argparse
import copy
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.forward import lean_forward, onnx_engine  # noqa: E402
from bertdemo.model.logits import mlm_logits  # noqa: E402
from bench_viewers import DIFFERENT  # noqa: E402
from common import ROOT, load_bert_base, machine  # noqa: E402

FLOAT = 1  # onnx.TensorProto.FLOAT: the quantizer's default type for the fused graph's outputs


def sessions(lm, folder: Path) -> dict:
    """{"float32" | "int8" | "int8, per channel": an ONNX Runtime session (2 threads)} of `lm`'s export."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    paths = {"float32": folder / "model.onnx", "int8": folder / "int8.onnx",
             "int8, per channel": folder / "int8-channel.onnx"}
    onnx_engine.export(lm.model, paths["float32"])
    for name, per_channel in (("int8", False), ("int8, per channel", True)):
        quantize_dynamic(str(paths["float32"]), str(paths[name]), weight_type=QuantType.QInt8,
                         per_channel=per_channel, extra_options={"DefaultTensorType": FLOAT})
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    onnx_engine._never_spin(options)
    return {name: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            for name, path in paths.items()}


def batch(lm, texts: list[str]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    inputs = dict(lm.tokenizer([lm.to_model_text(t) for t in texts], return_tensors="pt", padding=True))
    rows, cols = (inputs["input_ids"] == lm.mask_token_id).nonzero(as_tuple=True)
    return inputs, rows, cols


def ort_logits(session, inputs: dict, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    feeds = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
             "token_type_ids": inputs.get("token_type_ids", torch.zeros_like(inputs["input_ids"])),
             "rows": rows, "cols": cols}
    arrays = {k: np.ascontiguousarray(v.numpy(), dtype=np.int64) for k, v in feeds.items()}
    return torch.from_numpy(session.run(["logits"], arrays)[0])


def speed(repeats: int) -> None:
    lm = load_bert_base()
    half = copy.deepcopy(lm.model).to(torch.bfloat16)
    packed = {"float32": lean_forward.PackedWeights(), "bfloat16": lean_forward.PackedWeights()}
    with tempfile.TemporaryDirectory() as folder:
        found = sessions(lm, Path(folder))
        shapes = {"16 different sentences": batch(lm, DIFFERENT), "one sentence": batch(lm, DIFFERENT[:1])}
        calls = {(f"ONNX Runtime {name}", shape): (lambda s=s, x=x: ort_logits(s, *x))
                 for name, s in found.items() for shape, x in shapes.items()}
        calls.update({(f"torch {name}", shape): (lambda m=m, p=packed[name], x=x: mlm_logits(m, *x, packed=p))
                      for name, m in (("float32", lm.model), ("bfloat16", half)) for shape, x in shapes.items()})
        times = {key: [] for key in calls}
        with torch.inference_mode():
            for call in calls.values():
                call(), call()  # warm: packs the weights, builds the kernels
            for _ in range(repeats):
                for key, call in calls.items():
                    start = time.perf_counter()
                    call()
                    times[key].append(time.perf_counter() - start)
    for shape in shapes:
        base = statistics.median(times["torch float32", shape])
        print(f"bert-base-sized, {shape} (medians of {repeats}, interleaved):")
        for (name, at), values in times.items():
            if at == shape:
                median = statistics.median(values)
                print(f"  {name:32s} {median * 1000:7.1f} ms  ({base / median:.2f}x torch float32's speed)")


def fidelity() -> None:
    lm = bertdemo.load_bundled("cpu")
    texts = []
    for line in (ROOT / "assets" / "bundled" / "everyday.tsv").read_text(encoding="utf-8").splitlines():
        sentence, word = line.split("\t")[:2]
        masked = re.sub(rf"\b{re.escape(word)}\b", "[MASK]", sentence, count=1)
        if "[MASK]" in masked:
            texts.append(masked)
    with tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        found = sessions(lm, Path(folder))
        for name in ("int8", "int8, per channel"):
            same, moved = 0, 0.0
            for text in texts:
                x = batch(lm, [text])
                clean = ort_logits(found["float32"], *x).softmax(-1)[0]
                quantized = ort_logits(found[name], *x).softmax(-1)[0]
                same += int(clean.argmax() == quantized.argmax())
                top = clean.topk(5).indices
                moved = max(moved, float((clean[top] - quantized[top]).abs().max()))
            print(f"bundled model, {name} against float32 over {len(texts)} everyday sentences: top word the same "
                  f"in {same}; largest move of a float32 top-5 word's probability {moved:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(machine())
    speed(args.repeats)
    fidelity()


if __name__ == "__main__":
    main()
