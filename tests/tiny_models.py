"""Tiny random-weight masked LMs built in code and saved to a folder, for hermetic tests.

BERT and DistilBERT use the committed 210-word `vocab.txt`; RoBERTa gets a byte-level BPE
trained here on a few sentences, so its mask token is the real `<mask>`.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import (BertConfig, BertForMaskedLM, BertTokenizerFast, DistilBertConfig,
                          DistilBertForMaskedLM, RobertaConfig, RobertaForMaskedLM,
                          RobertaTokenizerFast)

VOCAB = Path(__file__).with_name("vocab.txt")
SENTENCES = ["Paris is the capital of France.", "The Eiffel tower is a famous landmark.",
             "La Tour Eiffel est située à Paris.", "Berlin is the capital of Germany."]
# A larger init than BERT's 0.02 gives peaked, tie-free distributions: rankings are stable.
_SMALL = dict(initializer_range=0.2, max_position_embeddings=64)


def bert_tokenizer() -> BertTokenizerFast:
    return BertTokenizerFast(vocab=str(VOCAB), do_lower_case=True)


def save_tiny_bert(folder: Path, seed: int = 0, layers: int = 2, heads: int = 2) -> Path:
    """A 2-layer, 2-head, hidden-32 BertForMaskedLM with the committed vocab, saved to `folder`."""
    torch.manual_seed(seed)
    tok = bert_tokenizer()
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=64, **_SMALL)
    return _save(BertForMaskedLM(config), tok, folder)


def save_tiny_distilbert(folder: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tok = bert_tokenizer()
    config = DistilBertConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=2,
                              hidden_dim=64, initializer_range=0.2, max_position_embeddings=64)
    return _save(DistilBertForMaskedLM(config), tok, folder)


def save_tiny_roberta(folder: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 5, vocab_size=300, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok = RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                               sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                               pad_token="<pad>", mask_token="<mask>", model_max_length=62)
    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64, pad_token_id=1,
                           bos_token_id=0, eos_token_id=2, type_vocab_size=1, **_SMALL)
    return _save(RobertaForMaskedLM(config), tok, folder)


def _save(model, tokenizer, folder: Path) -> Path:
    folder = Path(folder)
    model.save_pretrained(folder)  # safetensors by default
    tokenizer.save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- one tiny model per encoder family
# Each family gets its own tokenizer kind where the `tokenizers` library builds it offline:
# WordPiece (the committed vocab), byte-level BPE (RoBERTa, ModernBERT, EuroBERT), Unigram
# (SentencePiece's model: ALBERT, XLM-R, CamemBERT, DeBERTa-v3).
_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             max_position_embeddings=64, initializer_range=0.2)
FAMILY_CONFIGS = {
    "bert": ("wordpiece", {}),
    "distilbert": ("wordpiece", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, initializer_range=0.2,
                                     max_position_embeddings=64)),
    "roberta": ("bpe", dict(type_vocab_size=1)),
    "xlm-roberta": ("unigram", dict(type_vocab_size=1)),
    "camembert": ("unigram", dict(type_vocab_size=1)),
    "albert": ("unigram", dict(embedding_size=16)),
    "electra": ("wordpiece", dict(embedding_size=16)),
    "modernbert": ("bpe", dict(global_attn_every_n_layers=2, local_attention=4, hidden_activation="gelu")),
    "deberta-v2": ("unigram", dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
                                   max_relative_positions=32, norm_rel_ebd="layer_norm", share_att_key=True,
                                   position_biased_input=False, type_vocab_size=0)),
    "mpnet": ("wordpiece", {}),
    "eurobert": ("bpe", dict(num_key_value_heads=1, hidden_act="gelu")),
    "mobilebert": ("wordpiece", dict(embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
                                     num_feedforward_networks=2)),
    "big_bird": ("wordpiece", dict(attention_type="original_full")),
    "megatron-bert": ("wordpiece", {}),
    "roformer": ("wordpiece", dict(embedding_size=32)),
}
FAMILIES = list(FAMILY_CONFIGS)
_CORPUS = SENTENCES + ["The cat sat on the mat.", "A dog ran in the park.", "We went to the river bank.",
                       "She reads a book every day.", "The weather is cold in winter."]


def family_tokenizer(kind: str):
    """A fast tokenizer of `kind` with a mask token, built offline."""
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import PreTrainedTokenizerFast

    if kind == "wordpiece":
        return bert_tokenizer()
    if kind == "bpe":
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(_CORPUS * 5, vocab_size=300, min_frequency=1,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                    sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                                    pad_token="<pad>", mask_token="<mask>", model_max_length=62)
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(_CORPUS * 5, vocab_size=200,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "[MASK]"], unk_token="<unk>")
    from tokenizers.processors import TemplateProcessing
    unigram._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", unigram.token_to_id("<s>")), ("</s>", unigram.token_to_id("</s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=unigram._tokenizer, bos_token="<s>", eos_token="</s>",
                                   sep_token="</s>", cls_token="<s>", unk_token="<unk>", pad_token="<pad>",
                                   mask_token="[MASK]", model_max_length=62)


def save_tiny_family(family: str, folder: Path, seed: int = 0) -> Path:
    """A 2-layer, 2-head, hidden-32 masked LM of `family` (a key of FAMILY_CONFIGS) with its own
    tokenizer kind, random weights, saved to `folder`."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    kind, extra = FAMILY_CONFIGS[family]
    tok = family_tokenizer(kind)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    if family in ("modernbert",):
        ids.update(cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id)
    if family in ("eurobert",):
        ids.update(mask_token_id=tok.mask_token_id)
    settings = ({} if family == "distilbert" else dict(_TINY)) | ids | extra
    config = AutoConfig.for_model(family, vocab_size=len(tok), **settings)
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(config)
    return _save(model, tok, folder)


def tiny_transcoders(lm, seed: int = 0, latents: int = 64, k: int = 8) -> dict:
    """{layer: Dictionary} of random transcoders for every layer of `lm` (a loaded model), with a
    skip path and a decoder bias: what `bertdemo.attribution_graph(..., transcoders=...)` takes.
    Exactness and the views do not depend on the transcoders being good."""
    from bertdemo.features.dictionary import Dictionary, SparseCoder, SparseCoderConfig
    from bertdemo.forward import anatomy

    torch.manual_seed(seed)
    found = {}
    for layer in range(1, len(anatomy.of(lm.model).layers) + 1):
        coder = SparseCoder(lm.model.config.hidden_size,
                            SparseCoderConfig(num_latents=latents, k=k, transcode=True, skip_connection=True))
        torch.nn.init.normal_(coder.W_dec, std=0.3)
        torch.nn.init.normal_(coder.W_skip, std=0.05)
        torch.nn.init.normal_(coder.b_dec, std=0.1)
        found[layer] = Dictionary(coder.eval().requires_grad_(False), layer)
    return found
