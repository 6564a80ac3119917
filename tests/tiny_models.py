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
