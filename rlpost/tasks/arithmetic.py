"""Multi-step arithmetic with a worked answer, and its reward computed in JAX.

A problem adds (or subtracts) ``terms`` integers of ``d`` digits each; the difficulty label is d.
Prompt ``"12+34+5="``; the worked completion lists the running results separated by commas and
ends with EOS: ``"46,51"``. With two terms the completion is just the result (``"12+34="`` ->
``"46"``). The final answer is the last comma-separated field.

The reward parses the completion strictly: the text before the first EOS may contain only digits,
commas and minus signs, EOS must be present (a completion cut at the length limit earns 0), and
the final field must equal the answer exactly. ``graded=True`` adds partial credit for a
well-formed final field of the right length: 0.5 * (fraction of correct characters); exact
answers earn 1. Both are computed by ``reward`` in JAX (so rollout, reward and update run in one
jitted step) and by ``reference_reward`` in plain Python; the tests check that they agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.tasks import base, builders
from rlpost.tokenizer import EOS, CharTokenizer


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
  """Problem distribution: digits uniform in [min_digits, max_digits], ``terms`` operands."""

  min_digits: int = 1
  max_digits: int = 4
  terms: int = 2
  allow_minus: bool = False

  def __post_init__(self):
    if not 1 <= self.min_digits <= self.max_digits:
      raise ValueError(f"need 1 <= min_digits <= max_digits, got {self.min_digits}, {self.max_digits}")
    if self.terms < 2:
      raise ValueError(f"terms must be >= 2, got {self.terms}")


def generate(spec: ArithmeticSpec, n: int, seed: int) -> list[dict]:
  """n problems as dicts {prompt, answer, demo, difficulty}; deterministic in (spec, n, seed)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    d = int(rng.integers(spec.min_digits, spec.max_digits + 1))
    lo = 0 if d == 1 else 10 ** (d - 1)
    nums = [int(x) for x in rng.integers(lo, 10 ** d, size=spec.terms)]
    ops = ["+"] * (spec.terms - 1)
    if spec.allow_minus:
      ops = [str(o) for o in rng.choice(["+", "-"], size=spec.terms - 1)]
    prompt = str(nums[0]) + "".join(o + str(x) for o, x in zip(ops, nums[1:])) + "="
    acc, steps = nums[0], []
    for o, x in zip(ops, nums[1:]):
      acc = acc + x if o == "+" else acc - x
      steps.append(str(acc))
    out.append({"prompt": prompt, "answer": steps[-1], "demo": ",".join(steps), "difficulty": d})
  return out


def reference_reward(completion: str, finished: bool, answer: str, *, graded: bool = False) -> float:
  """Plain-Python reward of a decoded completion (text before EOS; ``finished`` = EOS seen)."""
  if not finished or completion == "" or any(c not in "0123456789,-" for c in completion):
    return 0.0
  final = completion.split(",")[-1]
  if final == answer:
    return 1.0
  if graded and len(final) == len(answer):
    return 0.5 * sum(a == b for a, b in zip(final, answer)) / len(answer)
  return 0.0


def encode_answers(answers: list[str], tok: CharTokenizer, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Answers as [B, length] int32 ids (PAD-filled) and [B] int32 lengths."""
  ids, mask = tok.encode_batch(answers, length, side="right")
  return ids, mask.sum(axis=1).astype(np.int32)


def reward(tokens: jax.Array, mask: jax.Array, answer: jax.Array, answer_len: jax.Array,
           tok: CharTokenizer, *, graded: bool = False) -> tuple[jax.Array, jax.Array]:
  """Rewards of sampled completions, in JAX.

  tokens: [B, N] int32 completions; mask: [B, N] bool (generated tokens);
  answer: [B, A] int32 answer ids (PAD after the end); answer_len: [B] int32.
  Returns (reward [B] float32, correct [B] bool).
  """
  b, n = tokens.shape
  a = answer.shape[1]
  pos = jnp.arange(n)
  is_eos = (tokens == EOS) & mask
  finished = jnp.any(is_eos, axis=1)
  eos_idx = jnp.where(finished, jnp.argmax(is_eos, axis=1), n)
  body = pos[None, :] < eos_idx[:, None]
  zero, nine = tok.token_id("0"), tok.token_id("9")
  comma, minus = tok.token_id(","), tok.token_id("-")
  digit = (tokens >= zero) & (tokens <= nine)
  is_comma = tokens == comma
  allowed = digit | is_comma | (tokens == minus)
  well_formed = finished & (eos_idx > 0) & jnp.all(allowed | ~body, axis=1)
  start = jnp.max(jnp.where(is_comma & body, pos[None, :], -1), axis=1) + 1
  seg_len = eos_idx - start
  idx = jnp.clip(start[:, None] + jnp.arange(a)[None, :], 0, n - 1)
  seg = jnp.take_along_axis(tokens, idx, axis=1)
  in_answer = jnp.arange(a)[None, :] < answer_len[:, None]
  same_len = well_formed & (seg_len == answer_len)
  hits = (seg == answer) & in_answer
  correct = same_len & (jnp.sum(hits, axis=1) == answer_len)
  r = correct.astype(jnp.float32)
  if graded:
    partial = jnp.sum(hits, axis=1) / jnp.maximum(answer_len, 1)
    r = jnp.where(correct, 1.0, jnp.where(same_len, 0.5 * partial, 0.0)).astype(jnp.float32)
  return r, correct



@base.register_task
class ArithmeticTask(builders.SyntheticTask):
  """Multi-step arithmetic, scored in JAX on character ids (on the host for other tokenizers);
  ``graded_reward`` gives partial credit for right digits of a right-length answer."""

  name = "arithmetic"
  has_graded_reward = True
  spec_class = ArithmeticSpec
  generate = staticmethod(generate)

  def score(self, completion: str, finished: bool, record: dict) -> float:
    return reference_reward(completion, finished, record["answer"],
                            graded=self.cfg.graded_reward)

  def answer_arrays(self, records, tok):
    answers = [r["answer"] for r in records]
    return encode_answers(answers, tok, max(len(a) for a in answers))

  def jax_reward(self, tokens, mask, answer, answer_len, tok):
    return reward(tokens, mask, answer, answer_len, tok, graded=self.cfg.graded_reward)
