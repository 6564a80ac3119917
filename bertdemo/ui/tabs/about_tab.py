"""The About tab: what masked-language modelling is, and the article's GLUE table as a chart."""
import gradio as gr

from ... import plots
from ...config import Settings
from ..parts.context import AppContext, Visitor, handler, standalone_demo

MLM_TEXT = r"""
### Masked-language modelling in one formula
BERT reads a whole sentence at once. To train it, pick a random set $M$ of positions of the
sentence $x$, corrupt them into $\tilde x$, and ask the model for the original tokens:

$$\mathcal{L}_\text{MLM} = -\sum_{i \in M} \log p_\theta\left(x_i \mid \tilde x\right)$$

Only the picked positions count in the loss (in code, every other label is `-100`).

- **15%** of the tokens (never `[CLS]`, `[SEP]` or padding) are picked.
- Of those, **80%** become `[MASK]`, **10%** a random token, **10%** stay as they are. So about
  12% of the input is `[MASK]`, 1.5% random, 1.5% unchanged-but-predicted. `[MASK]` never appears
  when the model is used later, so it must keep a good guess for *every* token, not only masked ones.
- **Static vs dynamic masking.** Original BERT chose the masks once, when the data was prepared,
  so a sentence met the same masks epoch after epoch; RoBERTa (Liu et al. 2019) draws fresh masks
  each time a sentence is fed in, which did as well or slightly better. Transformers'
  `DataCollatorForLanguageModeling` masks while building each batch (dynamic); the **Fine-tune**
  tab can train either way, and the **Mask sampling** tab shows the difference.

The `mask_tokens` snippet of the article this demo started from, *Fine-Tuning BERT with Masked
Language Modeling: A Comprehensive Guide*, gets this backwards: it sets the labels of the *masked*
tokens to `-100`, so the loss is computed on the tokens the model can see; it also always writes
`[MASK]` (no 80/10/10), may mask `[CLS]`, `[SEP]` and padding, and masks once before its 100 epochs
(static).
"""

LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]
GLUE_TASKS = ["MNLI", "QQP", "QNLI", "SST-2", "CoLA", "STS-B", "MRPC", "RTE"]
# As printed in the article's table (GLUE test set); sources in GLUE_SOURCES.
GLUE_SCORES = {
    "BiLSTM+ELMo+Attn [2]": [76.4, 87.4, 87.1, 93.2, 44.1, 70.3, 84.9, 63.8],
    "OpenAI GPT [3]": [82.1, 88.5, 88.1, 91.3, 45.4, 80.0, 82.3, 56.0],
    "BERT-base [4]": [84.6, 89.2, 90.5, 93.5, 52.1, 85.8, 88.9, 66.4],
    "BERT-large [4]": [86.7, 91.1, 92.7, 94.9, 60.5, 86.5, 89.3, 70.1],
}
GLUE_SOURCES = """
**Where the numbers come from.** The table of *Fine-Tuning BERT with Masked Language Modeling: A
Comprehensive Guide* (the article this demo started from), which cites (numbered here in the
order they appear on this page):
- [1] Wang et al., *GLUE: A Multi-Task Benchmark and Analysis Platform for Natural Language
  Understanding*, BlackboxNLP workshop at EMNLP 2018 (arXiv:1804.07461): the benchmark
- [2] Peters et al., *Deep contextualized word representations*, NAACL 2018
- [3] Radford et al., *Improving Language Understanding by Generative Pre-Training*, OpenAI 2018
- [4] Devlin et al., *BERT: Pre-training of Deep Bidirectional Transformers for Language
  Understanding*, NAACL 2019 (arXiv:1810.04805), Table 1

Before quoting them, check the BERT paper's Table 1: it reports F1 for QQP and MRPC, Spearman
correlation for STS-B and accuracy for the rest, and its QQP numbers (e.g. 71.2 for BERT-base, 72.1
for BERT-large) differ from the article's, which look like accuracies; the article's ELMo row also
differs from the paper in several columns. The chart shows the article's numbers unchanged.
"""


def render(ctx: AppContext) -> None:
    """Build the tab inside the current Blocks/Tab context. Static: no model calls, no events."""
    gr.Markdown(MLM_TEXT, latex_delimiters=LATEX)
    gr.Plot(glue_figure(), label="GLUE [1] scores (higher is better)")
    gr.Markdown("**This is how those numbers are made**: pre-trained body, new head, cross-entropy, small learning rate. Try it on your own labelled lines in the **Classify** tab.")
    with gr.Accordion("The numbers", open=False):
        gr.Markdown(_glue_markdown_table())
    gr.Markdown(GLUE_SOURCES)
    with gr.Accordion("This server's disk", open=False):
        cache = gr.Markdown("Search indexes, ONNX exports, feature dictionaries and the examples' results "
                            "share one disk budget on this server (least recently used deleted first).")
        gr.Button("How much of it is used?", size="sm").click(handler(ctx, on_disk), None, cache,
                                                              api_visibility="private")


def on_disk(visitor: Visitor) -> str:
    """The server's disk caches: used against the budget, per kind."""
    cache = visitor.engine.disk
    kinds = ", ".join(f"{kind} {mb:,.1f} MB" for kind, mb in cache.kinds_mb().items())
    return (f"**{cache.line()}** ({kinds}). The operator sets the budget with `--cache-mb` "
            "(`BERTDEMO_CACHE_MB`); the least recently used entries are deleted first, never the default "
            "corpus' index or the served model's export.")


def create_demo(store=None, settings: Settings | None = None) -> gr.Blocks:
    """The tab on its own, for running or testing it alone."""
    return standalone_demo("about", render, store, settings)


def glue_figure():
    return plots.grouped_bars(GLUE_TASKS, GLUE_SCORES, "GLUE [1] test scores, as given in the article",
                              "score")


def _glue_markdown_table() -> str:
    rows = ["| system | " + " | ".join(GLUE_TASKS) + " |", "|---" * (len(GLUE_TASKS) + 1) + "|"]
    rows += [f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + " |"
             for name, values in GLUE_SCORES.items()]
    return "\n".join(rows)
