"""Shared fixtures of the e2e tier: a tiny model saved to disk and GSM8K-shaped JSONL files
(no hub, no real GSM8K)."""

from __future__ import annotations

import json

import pytest

QUESTIONS = ["Tom has 3 apples and buys 4 more. How many?",
             "A box holds 12 eggs. How many in 2 boxes?",
             "Sam reads 5 pages a day. How many in a week?",
             "A car goes 60 km an hour. How far in 3 hours?",
             "Ann had 10 coins and lost 4. How many are left?",
             "Each bag has 6 pens. How many pens in 5 bags?",
             "A class has 20 pupils and 8 are boys. How many girls?",
             "Bob saves 2 dollars a week. How much in 9 weeks?"]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama + a byte-level BPE tokenizer trained here, saved with
    save_pretrained, and GSM8K-shaped JSONL files."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny_model")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(QUESTIONS + ["Question: Answer: ####"], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<pad>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="</s>")
    fast.save_pretrained(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=48, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                      max_position_embeddings=128, pad_token_id=fast.pad_token_id,
                      eos_token_id=fast.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(d)
    data = tmp_path_factory.mktemp("gsm8k")
    for split in ("train", "test"):
        with open(data / f"{split}.jsonl", "w") as fh:
            for i, q in enumerate(QUESTIONS):
                fh.write(json.dumps({"question": q, "answer": f"... #### {i + 7}"}) + "\n")
    return d, data
