"""Circuits: exact, faithful in the real model, complete, and fast enough to click through.

Goals (2 CPU threads; the bundled model and its shipped transcoders unless said):
- exactness: for every target node of every graph, its incoming edges plus its bias equal its clean
  value within 1e-4, relative to the terms summed; sampled edges equal the change when their source
  alone is removed in the frozen replacement;
- faithful in the real model, over the 20 everyday sentences below (target: the mask's top word):
  switching off the graph's 10 most influential feature nodes lowers the target's log-probability
  more than 10 random active features at the same layers in >= 90% of sentences; over the top 20
  nodes, one at a time, Spearman's rank correlation of the predicted logit change and the
  measured one >= 0.6 (median over sentences), for the frozen graph's total effect (the graph's
  prediction), and beside it the real model's slope (first order, every multiplier live); each
  for both ways of freezing the norms, at their slope (the default) and by 1/sigma alone;
- completeness >= 0.8 (replacement reported);
- speed: a 12-token graph <= 5 s from the call to the drawing's JSON; how it grows with 12, 32 and
  64 tokens; a bert-base-sized model (random weights) with transcoders of a live run's shape
  (`--bert-base`) <= 60 s for 12 tokens, RSS growth while building it <= 500 MB.
Run: python bench/bench_circuits.py [--sentences N] [--bert-base] [--skip-speed] [--skip-faithfulness]
     [--norms slope|scale] [--frozen-parts]
"""
import argparse
import random
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

import bertdemo  # noqa: E402
from bertdemo.circuits import attribution, interventions  # noqa: E402
from bertdemo.circuits.replacement import NORMS, Replacement, demeaned  # noqa: E402
from bertdemo.circuits.transcoders import transcoders_for  # noqa: E402
from common import load_bert_base, machine, sentence_of  # noqa: E402

WAYS = {"slope": "slope at the clean input (the default)", "scale": "1/sigma alone (as circuit-tracer)"}

SENTENCES = [
    "Paris is the [MASK] of France.",
    "She poured milk into her [MASK] of coffee.",
    "The cat is sleeping on the [MASK].",
    "I brush my [MASK] every morning.",
    "We went to the [MASK] to buy some bread.",
    "He opened the door with his [MASK].",
    "The sun rises in the [MASK].",
    "My sister plays the [MASK] in a band.",
    "It was raining, so I took my [MASK].",
    "The children are playing in the [MASK].",
    "She wrote a [MASK] to her grandmother.",
    "The doctor told him to take the [MASK] twice a day.",
    "They watched a [MASK] at the cinema last night.",
    "The train to London leaves at nine [MASK].",
    "I need a new pair of [MASK] for running.",
    "The baby is crying because she is [MASK].",
    "He drank a glass of [MASK] after the game.",
    "The river flows into the [MASK].",
    "We eat breakfast in the [MASK].",
    "The teacher asked the students to open their [MASK].",
]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def target_logprob(lm, text: str, nodes: list[str], graph, word: int, scale: float = 0.0) -> float:
    """The change of the target word's log-probability when `nodes` are scaled, in the real model."""
    result = interventions.intervene(lm, text, nodes, scale, graph=graph)
    after = next(w for w in result["words"] if w["word"] == lm.tokenizer.convert_ids_to_tokens(word))
    return float(torch.log(torch.tensor(after["probability_after"])) - torch.log(torch.tensor(after["probability_before"])))


def faithfulness(lm, sentences: list[str], rng: random.Random, norms: tuple[str, ...] = NORMS) -> None:
    """Every figure of the graph's faithfulness, for each way of freezing the norms (`norms`)."""
    for way in norms:
        print(f"the graph with each norm frozen by its {WAYS[way]}:", flush=True)
        _faithfulness(lm, sentences, random.Random(rng.random()), way)


def _faithfulness(lm, sentences: list[str], rng: random.Random, norms: str) -> None:
    beats, correlations, slope_correlations, completeness, replacement, exact, sampled = 0, [], [], [], [], [], []
    through_nodes, promoters_beat = [], 0
    for text in sentences:
        graph = attribution.attribution_graph(lm, text, target=_top_word(lm, text), norms=norms)
        exact.append(attribution.check_exactness(graph))
        sampled.append(_sampled_edges(lm, text, graph, rng, norms))
        completeness.append(graph.scores["completeness"])
        replacement.append(graph.scores["replacement"])
        adjacency = graph.adjacency
        through_nodes.append(float(adjacency.rows[0].sum() / adjacency.value[0]))
        word = adjacency.logits[0].feature
        features = [n for n in adjacency.columns if n.kind == "feature"]
        ranked = sorted(range(len(adjacency.columns)), key=lambda i: -float(_influence(graph)[i]))
        top = [adjacency.columns[i] for i in ranked if adjacency.columns[i].kind == "feature"][:10]
        random_same_layers = []
        for node in top:
            pool = [n for n in features if n.layer == node.layer and n not in top and n not in random_same_layers]
            random_same_layers.append(rng.choice(pool))
        drop_top = target_logprob(lm, text, [n.id for n in top], graph, word)
        drop_random = target_logprob(lm, text, [n.id for n in random_same_layers], graph, word)
        beats += drop_top < drop_random
        effects = interventions.total_effects(adjacency)[0]
        index = {n.id: i for i, n in enumerate(adjacency.columns)}
        promoters = sorted(features, key=lambda n: -float(effects[index[n.id]]))[:10]  # the graph's own sign
        promoters_beat += target_logprob(lm, text, [n.id for n in promoters], graph, word) < drop_random
        twenty = [adjacency.columns[i] for i in ranked if adjacency.columns[i].kind == "feature"][:20]
        predicted = [-float(effects[index[n.id]]) for n in twenty]
        single = [interventions.intervene(lm, text, [n.id], 0.0, graph=graph)["words"][0] for n in twenty]
        measured = [w["change"] for w in single]
        rho = spearmanr(predicted, measured).statistic
        rho_slope = spearmanr([w["first_order_change"] for w in single], measured).statistic
        correlations.append(rho)
        slope_correlations.append(rho_slope)
        print(f"  {text:<62} top10 {drop_top:+.3f} random10 {drop_random:+.3f} nats; rank corr graph {rho:.2f} "
              f"slope {rho_slope:.2f}; "
              f"completeness {graph.scores['completeness']:.2f} replacement {graph.scores['replacement']:.2f}",
              flush=True)
    n = len(sentences)
    print(f"exactness: largest relative gap {max(exact):.2e} (goal <= 1e-4); sampled edges vs removal: "
          f"largest gap {max(sampled):.2e}")
    print(f"faithful: top-10 off beat 10 random at the same layers in {beats}/{n} = {beats / n:.0%} (goal >= 90%); "
          f"the 10 the graph says raise the word most (its total effect, signed) in {promoters_beat}/{n}")
    print(f"rank correlation (the graph's top 20 feature nodes one at a time, predicted vs measured logit change), "
          f"median (min): the frozen graph's total effect {statistics.median(correlations):.2f} "
          f"({min(correlations):.2f}) (goal median >= 0.6); the model's slope, shown beside it, "
          f"{statistics.median(slope_correlations):.2f} ({min(slope_correlations):.2f})")
    print(f"completeness: mean {statistics.mean(completeness):.3f}, min {min(completeness):.3f} (goal >= 0.8); "
          f"replacement: mean {statistics.mean(replacement):.3f}, min {min(replacement):.3f}")
    print(f"the top word's logit through the nodes' edges (the rest is the bias: every constant, and what the norms "
          f"keep of their clean inputs): median {statistics.median(through_nodes):.0%} "
          f"({min(through_nodes):.0%} to {max(through_nodes):.0%})", flush=True)


def _influence(graph) -> torch.Tensor:
    from bertdemo.circuits.graph import influence

    return influence(graph.adjacency)


def _top_word(lm, text: str) -> str:
    inputs, position = attribution.encode(lm, text)
    with torch.no_grad():
        return lm.tokenizer.convert_ids_to_tokens(int(lm.model(**inputs).logits[0, position].argmax()))


def _sampled_edges(lm, text: str, graph, rng: random.Random, norms: str, count: int = 5) -> float:
    """Largest gap between an edge into a logit and the logit's change with its source zeroed."""
    replacement = Replacement(lm, transcoders_for(lm), norms=norms)
    inputs, position = attribution.encode(lm, text)
    ids = inputs["input_ids"][0]
    sentence = replacement.trace(inputs, position, lm.tokenizer.convert_ids_to_tokens(ids.tolist()),
                                 attribution.coded_positions(lm, ids))
    words = torch.tensor(graph.adjacency.extra["words"])
    with torch.no_grad():
        clean = demeaned(replacement.forward(sentence, sentence.leaves))[words]
    gaps = []
    for column in rng.sample(range(len(graph.adjacency.columns)), count):
        node = graph.adjacency.columns[column]
        leaves = sentence.leaves.copy()
        with torch.no_grad():
            if node.kind == "feature":
                slot = int((sentence.indices[node.layer][node.position] == node.feature).nonzero()[0])
                leaves.features[node.layer][node.position, slot] = 0
            elif node.kind == "error":
                leaves.errors[node.layer][node.position] = 0
            else:
                leaves.tokens[node.position] = 0
            removed = demeaned(replacement.forward(sentence, leaves))[words]
        edge = graph.adjacency.rows[:len(words), column]
        gaps.append(float(((clean - removed) - edge).abs().max() / clean.abs().max()))
    return max(gaps)


def frozen_parts(lm, sentences: list[str]) -> None:
    """Which frozen multiplier parts the graph from the real model: the real model's slope with
    each LayerNorm's 1/sigma held (detached), attention weights held, or both, correlated with the
    measured single-node changes as above. A bench-only experiment: it swaps torch's layer_norm and
    softmax for held versions while the slope is taken (the model's modules call them)."""
    import torch.nn.functional as F

    from bertdemo.forward import mlp_points
    from bertdemo.views.attention_views import eager_twin

    coders = transcoders_for(lm)
    model = eager_twin(lm)  # attention through softmax (the served model's SDPA has none to hold)
    layer_norm, softmax = F.layer_norm, F.softmax

    def held_norm(x, shape, weight=None, bias=None, eps=1e-5):
        y = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt().detach()
        return y * weight + bias if weight is not None else y

    def held_softmax(x, dim=None, **kwargs):
        return softmax(x, dim=dim, **kwargs).detach()

    def slopes(text, word, nodes, held):
        inputs, position = attribution.encode(lm, text)
        probes = {}

        def probe(layer):
            def edit(output, block_input):
                probes[layer] = torch.zeros_like(output, requires_grad=True)
                return output + probes[layer]
            return edit
        layers = range(1, len(coders) + 1)
        F.layer_norm = held_norm if "norms" in held else layer_norm
        F.softmax = held_softmax if "attention" in held else softmax
        try:
            with torch.enable_grad(), mlp_points.edited(model, {layer: probe(layer) for layer in layers}):
                logit = model(**inputs).logits[0, position, word]
                grads = torch.autograd.grad(logit, [probes[layer] for layer in layers])
        finally:
            F.layer_norm, F.softmax = layer_norm, softmax
        return [-n.activation * float(grads[n.layer - 1][0, n.position] @ coders[n.layer].coder.W_dec[n.feature])
                for n in nodes]

    kinds = ("nothing", "norms", "attention", "norms+attention")
    found = {kind: [] for kind in kinds}
    for text in sentences:
        graph = attribution.attribution_graph(lm, text, target=_top_word(lm, text))
        adjacency = graph.adjacency
        ranked = sorted(range(len(adjacency.columns)), key=lambda i: -float(_influence(graph)[i]))
        twenty = [adjacency.columns[i] for i in ranked if adjacency.columns[i].kind == "feature"][:20]
        measured = [interventions.intervene(lm, text, [n.id], 0.0, graph=graph)["words"][0]["change"] for n in twenty]
        for kind in kinds:
            found[kind].append(spearmanr(slopes(text, adjacency.logits[0].feature, twenty, kind), measured).statistic)
    print("the real model's slope with these held, rank correlation with the measured change (median, min): " +
          "; ".join(f"{kind} held {statistics.median(v):.2f} ({min(v):.2f})" for kind, v in found.items()))


def speed(lm, lengths=(12, 32, 64), repeats: int = 3) -> None:
    try:
        from bertdemo.circuits import drawing
    except ImportError:
        drawing = None
    for length in lengths:
        text = sentence_of(lm, length, 1)
        times, parts = [], None
        first = time.perf_counter()
        attribution.attribution_graph(lm, text)
        first = time.perf_counter() - first
        before = current_rss_mb()
        for _ in range(repeats):
            start = time.perf_counter()
            graph = attribution.attribution_graph(lm, text)
            if drawing is not None:
                drawing.figure(graph).to_json()
            times.append(time.perf_counter() - start)
            parts = graph.timings
        features = sum(n.kind == "feature" for n in graph.adjacency.columns)
        print(f"{length:>3} tokens: {statistics.median(times):.2f} s median of {repeats} after a first call of "
              f"{first:.2f} s (trace {parts['trace']:.2f} s, "
              f"edges {parts['edges']:.2f} s), {features:,} active features, {graph.adjacency.rows.shape[0]:,} rows; "
              f"RSS now +{current_rss_mb() - before:.0f} MB", flush=True)


def bert_base() -> None:
    """A bert-base-sized model (random weights) with transcoders of the shape a live run trains
    (8 x 768 latents, k = 32) at random weights: a graph's cost depends on the sizes and on k (every
    coded position has k active features), not on what the transcoders learned."""
    from sparsify import SparseCoder, SparseCoderConfig

    from bertdemo.features.dictionary import Dictionary

    lm = load_bert_base()
    width, layers = lm.model.config.hidden_size, lm.model.config.num_hidden_layers
    torch.manual_seed(0)
    coders = {}
    for layer in range(1, layers + 1):
        coder = SparseCoder(width, SparseCoderConfig(num_latents=8 * width, k=32, transcode=True, skip_connection=True))
        torch.nn.init.normal_(coder.W_dec, std=0.05)
        coders[layer] = Dictionary(coder.eval().requires_grad_(False), layer)
    text = sentence_of(lm, 12, 1)
    attribution.attribution_graph(lm, text, transcoders=coders)  # warm
    before = current_rss_mb()
    start = time.perf_counter()
    with PeakRss() as peak:
        graph = attribution.attribution_graph(lm, text, transcoders=coders)
    print(f"bert-base-sized, 12 tokens: {time.perf_counter() - start:.1f} s (goal <= 60 s; trace "
          f"{graph.timings['trace']:.2f} s, edges {graph.timings['edges']:.2f} s); "
          f"{sum(n.kind == 'feature' for n in graph.adjacency.columns):,} active features; RSS during the build "
          f"at most {peak.mb - before:+.0f} MB over its start (goal <= 500 MB), after it {current_rss_mb() - before:+.0f} "
          f"MB (the graph kept, and what the allocator has not given back); the process's peak {rss_mb():.0f} MB")


class PeakRss:
    """The largest resident set (MB) seen while its block runs, read every 5 ms by a thread: the
    process's own peak (ru_maxrss) is usually the model's load, and its RSS after a build depends on
    what the allocator gives back."""

    def __enter__(self):
        self.mb, self._done = current_rss_mb(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._done.wait(0.005):
            self.mb = max(self.mb, current_rss_mb())

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.mb = max(self.mb, current_rss_mb())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--bert-base", action="store_true")
    parser.add_argument("--skip-faithfulness", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--norms", choices=NORMS, action="append", help="one way of freezing the norms (default: each)")
    parser.add_argument("--frozen-parts", action="store_true", help="which held multipliers part the graph from the model")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(machine())
    lm = bertdemo.load_bundled()
    if not transcoders_for(lm):
        sys.exit("The bundled model has no transcoders: python -m bertdemo train-transcoders")
    if not args.skip_speed:
        speed(lm)
    if not args.skip_faithfulness:
        faithfulness(lm, SENTENCES[:args.sentences], random.Random(0), tuple(args.norms or NORMS))
    if args.frozen_parts:
        frozen_parts(lm, SENTENCES[:args.sentences])
    if args.bert_base:
        bert_base()


if __name__ == "__main__":
    main()
