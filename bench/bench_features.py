"""Features: live training against the plainest sparsify loop, and the views against one fill-mask.

Goals (2 CPU threads; the bundled model unless said):
- live training of one layer reaches held-out FVU <= 0.2 within 2 minutes while the page keeps
  answering (`--live`: fill-mask requests from another thread all along, their latency compared
  with the same requests without training);
- training tokens/s, ours against the plainest loop written with sparsify's own code (HF's
  `output_hidden_states`, the special tokens dropped, the same coder and optimizer step), for the
  bundled model and a bert-base-sized one, rounds interleaved: goal ours >= plain; where the time
  goes (the model's forward vs the coder's step); RSS growth while training bert-base <= 500 MB;
- a sentence's features (12 tokens) <= 100 ms; a feature card <= 300 ms; steer <= 2x one
  fill-mask; the features behind a prediction (top 20 candidates) <= 2 s.
Run: python bench/bench_features.py [--live] [--skip-training] [--skip-views]
"""
import argparse
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from schedulefree import ScheduleFreeWrapper  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.features import making, quality_views, views  # noqa: E402
from bertdemo.features.data import Lines  # noqa: E402
from bertdemo.features.dictionary import SignSGD, new_coder  # noqa: E402
from bertdemo.features.store import FeatureStore  # noqa: E402
from bertdemo.features.training import FeatureSettings, train  # noqa: E402
from common import interleaved_medians, load_bert_base, machine  # noqa: E402

THREADS = 2


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------- the plainest loop

class PlainLoop:
    """The same coder and optimizer, fed by the model's own `output_hidden_states` (the whole
    forward, every layer kept), positions chosen by the tokenizer's special-tokens mask."""

    def __init__(self, lm, layer: int, lines: Lines, batch_tokens: int):
        self.lm, self.layer = lm, layer
        self.coder = new_coder(lm.model.config.hidden_size)
        rate = 5e-3 / math.sqrt(self.coder.num_latents / 2 ** 14)
        self.optimizer = ScheduleFreeWrapper(SignSGD([{"params": self.coder.parameters(), "lr": rate}]), momentum=0.95)
        self.optimizer.train()
        self.batches = lines.batches(lm, batch_tokens=batch_tokens, seed=1)
        self.tokens = 0
        self.forward_s = self.coder_s = 0.0
        self.started = False

    def steps(self, n: int) -> None:
        for _ in range(n):
            batch = next(self.batches)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = self.lm.model(**batch.inputs, output_hidden_states=True)
            x = out.hidden_states[self.layer][batch.keep].float()
            t1 = time.perf_counter()
            if not self.started:
                self.coder.b_dec.data = x.mean(0)
                self.started = True
            self.coder.set_decoder_norm_to_unit_norm()
            fwd = self.coder(x)
            fwd.fvu.backward()
            self.coder.remove_gradient_parallel_to_decoder_directions()
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.tokens += x.shape[0]
            self.forward_s += t1 - t0
            self.coder_s += time.perf_counter() - t1


class OurLoop:
    """`training.train` on one layer, run a few steps at a time (it stops by its should_stop)."""

    def __init__(self, lm, layer: int, lines: Lines, batch_tokens: int):
        self.lm, self.layer, self.lines = lm, layer, lines
        self.settings = FeatureSettings(batch_tokens=batch_tokens, max_tokens=10 ** 12, max_seconds=1e9)
        self.tokens = 0
        self.forward_s = self.coder_s = 0.0
        self.kept = None

    def steps(self, n: int) -> None:
        count = {"n": 0}

        def stop():
            count["n"] += 1
            return count["n"] > n
        start = {self.layer: self.kept} if self.kept is not None else None
        trained, history = train(self.lm, [self.layer], self.lines, self.settings, should_stop=stop, start_from=start)
        self.kept = trained[self.layer]
        self.tokens += history.tokens
        self.forward_s += sum(s.forward_seconds for s in history.steps)
        self.coder_s += sum(s.coder_seconds for s in history.steps)


class PeakRss:
    """The process's largest RSS while the block runs, sampled every 20 ms."""

    def __enter__(self):
        self.before = self.peak = rss_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._done.wait(0.02):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def training_speed(name: str, lm, layer: int, rounds: int = 6, steps: int = 6, batch_tokens: int = 4096) -> None:
    lines = Lines(lm, making.default_texts())
    loops = {"ours": OurLoop(lm, layer, lines, batch_tokens), "plain sparsify": PlainLoop(lm, layer, lines, batch_tokens)}
    with PeakRss() as memory:  # ours alone first: its memory, not the plain loop's
        loops["ours"].steps(steps)
    wall = {k: 0.0 for k in loops}
    for _ in range(rounds):
        for key, loop in loops.items():
            t = time.perf_counter()
            loop.steps(steps)
            wall[key] += time.perf_counter() - t
    rates = {k: loops[k].tokens / wall[k] for k in loops}
    print(f"\n{name}, layer {layer}, {batch_tokens} padded tokens a batch, {rounds} x {steps} steps each, interleaved")
    for key, loop in loops.items():
        total = loop.forward_s + loop.coder_s
        print(f"  {key:15s} {rates[key]:8,.0f} tokens/s  (model forward {loop.forward_s / total:5.1%}, "
              f"coder step {loop.coder_s / total:5.1%})")
    print(f"  ours / plain: {rates['ours'] / rates['plain sparsify']:.2f}x tokens/s (goal >= 1.00)")
    print(f"  ours alone, {steps} steps: RSS {memory.before:,.0f} MB before, {memory.peak:,.0f} MB at its peak: "
          f"+{memory.peak - memory.before:,.0f} MB (goal <= 500 MB for bert-base)")


# ---------------------------------------------------------------- live, beside a page

def live(lm, layer: int = 3, seconds: float = 120.0) -> None:
    text = "The doctor gave him some [MASK] for the pain."
    latencies: dict[str, list[float]] = {"alone": [], "training": []}
    phase = {"name": "alone"}
    done = threading.Event()

    def visitor():
        while not done.is_set():
            t = time.perf_counter()
            bertdemo.fill_mask(lm, text)
            latencies[phase["name"]].append(time.perf_counter() - t)
            time.sleep(0.2)
    thread = threading.Thread(target=visitor, daemon=True)
    thread.start()
    time.sleep(10)
    phase["name"] = "training"
    store = FeatureStore(Path("/tmp/bench-features-cache"), shipped=None)
    curve = []
    dictionary, history = making.train_features(lm, layer, None, FeatureSettings(max_seconds=seconds),
                                                store=store, on_event=curve.append)
    done.set()
    thread.join()
    q = dictionary.record["quality"]
    print(f"\nlive training, layer {layer}, default corpus, {seconds:.0f} s limit: {history.tokens:,} tokens in "
          f"{history.seconds:.0f} s ({history.tokens / history.seconds:,.0f}/s)")
    for mark in (30, 60, 90, 120):
        step = next((s for s in curve if s.elapsed >= mark), None)
        if step is not None:
            print(f"  at {mark:3d} s: training FVU {step.fvu[0]:.3f}, dead {step.dead[0]:.1%}")
    print("  " + making.quality_echo(layer, q))
    for note in quality_views.feature_quality(lm, layer, store)["notes"]:  # held-out tokens, intervals, overfitting
        print(f"  {note}")
    for key, values in latencies.items():
        print(f"  fill-mask beside it, {key:8s}: median {statistics.median(values) * 1e3:6.1f} ms, "
              f"p90 {sorted(values)[int(0.9 * len(values))] * 1e3:6.1f} ms over {len(values)} requests")


# ---------------------------------------------------------------- the views

def views_speed(lm) -> None:
    store = FeatureStore(Path("/tmp/bench-features-cache"))
    layer = 3
    sentence = "The doctor gave the patient some medicine for the pain today."
    masked = "The doctor gave him some [MASK] for the pain."
    assert len(lm.tokenizer(sentence)["input_ids"]) == 14
    feature = views.sentence_features(lm, sentence, layer, store=store)["per_token"][1]["features"][0]["feature"]
    medians = interleaved_medians({
        "fill_mask": lambda: bertdemo.fill_mask(lm, masked),
        "sentence_features": lambda: views.sentence_features(lm, sentence, layer, store=store),
        "feature_card": lambda: views.feature_card(lm, layer, feature, store=store),
        "steer": lambda: views.steer(lm, masked, layer, feature, 0.0, store=store),
        "prediction_features": lambda: views.prediction_features(lm, masked, layer, candidates=20, store=store),
    }, repeats=7, warmup=1)
    one = medians["fill_mask"]
    goals = {"sentence_features": "<= 100 ms (14 tokens)", "feature_card": "<= 300 ms",
             "steer": "<= 2x one fill-mask", "prediction_features": "<= 2 s, 20 candidates"}
    print(f"\nviews, bundled model, layer {layer}, shipped dictionary")
    print(f"  fill_mask            {one * 1e3:8.1f} ms")
    for name, goal in goals.items():
        print(f"  {name:20s} {medians[name] * 1e3:8.1f} ms  ({medians[name] / one:5.2f}x one fill-mask; goal {goal})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--live", action="store_true", help="the 2-minute live run beside fill-mask requests")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-views", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    print(machine())
    bundled = bertdemo.load_bundled(device="cpu")
    if not args.skip_views:
        views_speed(bundled)
    if not args.skip_training:
        training_speed("bundled model", bundled, 3)
        training_speed("bert-base-sized model", load_bert_base(), 6, rounds=4, steps=3)
    if args.live:
        live(bundled)


if __name__ == "__main__":
    main()
