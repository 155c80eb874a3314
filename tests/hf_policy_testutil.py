"""Tiny Hugging Face policies and GSM8K / MATH files for trainer tests.

``write_policy`` saves a random two-layer Qwen2 (or Llama, or Qwen3) checkpoint with ``save_pretrained`` and
a byte-level BPE ``tokenizer.json`` trained on the given texts, with Qwen's special tokens
(``<|endoftext|>`` as eos and pad, ``<|im_start|>``, ``<|im_end|>``). The model's vocabulary is
a little larger than the tokenizer's, as in the Qwen checkpoints.
"""

from __future__ import annotations

import json
import os
import tempfile

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

GSM8K_TRAIN = [
    {"question": "Tom has 3 apples and buys 2 more. How many apples does he have?",
     "answer": "He has 3 + 2 = 5 apples.\n#### 5"},
    {"question": "A box holds 4 pens. How many pens are in 3 boxes?",
     "answer": "3 boxes hold 3 * 4 = 12 pens.\n#### 12"},
    {"question": "Sara reads 10 pages a day for 7 days. How many pages does she read?",
     "answer": "She reads 10 * 7 = 70 pages.\n#### 70"},
    {"question": "A shirt costs 1,200 cents. How many cents do two shirts cost?",
     "answer": "Two cost 2 * 1200 = 2400 cents.\n#### 2,400"},
]
GSM8K_TEST = [
    {"question": "Ann had 9 stickers and gave away 4. How many are left?",
     "answer": "9 - 4 = 5\n#### 5"},
    {"question": "Each of 6 bags has 5 marbles. How many marbles in all?",
     "answer": "6 * 5 = 30\n#### 30"},
]
MATH_TRAIN = [
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
     "solution": "Add: $\\frac{2}{4} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$.",
     "level": "Level 1", "type": "Prealgebra"},
    {"problem": "Solve $2x + 3 = 11$ for $x$.", "solution": "$2x = 8$, so $x = \\boxed{4}$.",
     "level": "Level 2", "type": "Algebra"},
    {"problem": "How many positive divisors does $12$ have?",
     "solution": "They are 1, 2, 3, 4, 6, 12: $\\boxed{6}$.", "level": "Level 3",
     "type": "Number Theory"},
    {"problem": "Compute $\\sqrt{49}$.", "answer": "7", "level": 1, "subject": "Algebra"},
]
MATH_TEST = [
    {"problem": "What is $0.5 \\cdot 6$?", "answer": "3", "level": 1, "subject": "Prealgebra"},
    {"problem": "Find $x$ if $x^2 = 25$ and $x > 0$.", "solution": "$x = \\boxed{5}$.",
     "level": "Level 4", "type": "Algebra"},
    {"problem": "What is $\\frac{6}{8}$ in lowest terms?", "answer": "\\frac{3}{4}",
     "level": 2, "subject": "Prealgebra"},
]


def write_jsonl(path, records) -> str:
  os.makedirs(os.path.dirname(str(path)), exist_ok=True)
  with open(path, "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  return str(path)


def write_math_data(root) -> dict:
  """GSM8K and MATH train / test files under ``root``: {"gsm8k": spec, "math": spec}."""
  root = str(root)
  return {
      "gsm8k": {"train": write_jsonl(os.path.join(root, "gsm8k", "train.jsonl"), GSM8K_TRAIN),
                "test": write_jsonl(os.path.join(root, "gsm8k", "test.jsonl"), GSM8K_TEST)},
      "math": {"train": write_jsonl(os.path.join(root, "math", "train.jsonl"), MATH_TRAIN),
               "test": write_jsonl(os.path.join(root, "math", "test.jsonl"), MATH_TEST)},
  }


def corpus() -> list[str]:
  """Every text of the tiny data sets (questions, solutions, answers)."""
  out = []
  for r in GSM8K_TRAIN + GSM8K_TEST:
    out += [r["question"], r["answer"]]
  for r in MATH_TRAIN + MATH_TEST:
    out += [r["problem"], r.get("solution", ""), r.get("answer", "")]
  return out


def _tokenizer(texts, vocab_size: int):
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(list(texts), trainer)
  return tok


def write_policy(path, *, texts=(), architecture: str = "qwen2", tie_embeddings: bool = True,
                 rope_theta: float = 10000.0, rms_norm_eps: float = 1e-6,
                 max_seq_len: int = 4096, heads_per_kv: int = 2, num_layers: int = 2,
                 seed: int = 0) -> str:
  """Write a random tiny checkpoint with a tokenizer trained on ``texts`` (+ the tiny data).

  The model has ``heads_per_kv`` query heads over one key-value head of dimension 8 (so the
  grouped-query ratio can mirror a real checkpoint's), hidden size 8 * heads_per_kv, MLP 64.
  """
  from rlpost.models import hf
  from rlpost.models.transformer import TransformerConfig, init_model

  tok = _tokenizer(list(texts) + corpus(), vocab_size=400)
  eos = tok.token_to_id("<|endoftext|>")
  cfg = TransformerConfig(
      vocab_size=tok.get_vocab_size() + 13, hidden_size=8 * heads_per_kv, num_layers=num_layers,
      num_heads=heads_per_kv, num_kv_heads=1, intermediate_size=64, rope_theta=rope_theta,
      rms_norm_eps=rms_norm_eps, qkv_bias=architecture == "qwen2",
      qk_norm=architecture == "qwen3",
      tie_embeddings=tie_embeddings, max_seq_len=max_seq_len)
  model = init_model(cfg, seed=seed)
  with tempfile.TemporaryDirectory() as staging:
    tok_file = os.path.join(staging, "tokenizer.json")
    tok.save(tok_file)
    tok_cfg = os.path.join(staging, "tokenizer_config.json")
    with open(tok_cfg, "w") as f:
      json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, f)
    hf.save_pretrained(model, path, architecture=architecture,
                       extra_config={"eos_token_id": eos, "bos_token_id": eos},
                       extra_files=[tok_file, tok_cfg])
  return str(path)


def write_policy_like(path, arch: dict, *, texts=(), seed: int = 0) -> str:
  """A tiny checkpoint with the flags of a real one (``experiments.full_size.POLICIES``):
  architecture, tied embeddings, rope_theta, rms_norm_eps, context length and the number of
  query heads per key-value head."""
  return write_policy(path, texts=texts, architecture=arch["architecture"],
                      tie_embeddings=arch["tie_embeddings"], rope_theta=arch["rope_theta"],
                      rms_norm_eps=arch["rms_norm_eps"], max_seq_len=arch["max_seq_len"],
                      heads_per_kv=arch["num_heads"] // arch["num_kv_heads"], seed=seed)
