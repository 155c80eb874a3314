"""Countdown: combine the given numbers with + - * / and parentheses to reach a target.

Prompt ``"3,5,7;56="``; a correct completion is any expression that uses every given number
exactly once and evaluates to the target, e.g. ``"(3+5)*7"``. The difficulty label is the count
of numbers. Problems are generated from a random expression tree over the numbers, so each has a
solution (its ``demo``).

The checker never evaluates text as code: ``parse`` is a bounded recursive-descent parser over
integers, the four operators and parentheses, with exact rational arithmetic (``Fraction``);
anything else, including division by zero, over-long input or nesting beyond ``MAX_DEPTH``, is
rejected (returns None), never raised. Its reward needs the host and runs through the trainer's
batched callback boundary.
"""

from __future__ import annotations

import collections
import dataclasses
from fractions import Fraction

import numpy as np

from rlpost.tasks import base, builders

MAX_CHARS = 64
MAX_DEPTH = 16


@dataclasses.dataclass(frozen=True)
class CountdownSpec:
  """Problem distribution: a count of numbers uniform in [min_numbers, max_numbers], each in
  [1, max_value], and targets in [1, max_target]."""

  min_numbers: int = 3
  max_numbers: int = 4
  max_value: int = 20
  max_target: int = 200

  def __post_init__(self):
    if not 1 <= self.min_numbers <= self.max_numbers:
      raise ValueError(f"need 1 <= min_numbers <= max_numbers, got {self.min_numbers}, "
                       f"{self.max_numbers}")
    # A target below 1 can never be reached, so generation would never end.
    for name in ("max_value", "max_target"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _random_expr(nums: list[int], rng: np.random.Generator) -> tuple[str, Fraction]:
  """A random expression using every number once, with its exact value."""
  items = [(str(x), Fraction(x)) for x in nums]
  while len(items) > 1:
    i, j = sorted(rng.choice(len(items), size=2, replace=False))
    (ea, va), (eb, vb) = items[i], items[j]
    if rng.random() < 0.5:
      (ea, va), (eb, vb) = (eb, vb), (ea, va)
    op = str(rng.choice(["+", "-", "*", "/"]))
    if op == "/" and (vb == 0 or (va / vb).denominator != 1):
      op = "+"
    val = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else va}[op]
    items = [it for k, it in enumerate(items) if k not in (i, j)] + [(f"({ea}{op}{eb})", val)]
  expr, val = items[0]
  if expr.startswith("(") and _matching_paren(expr) == len(expr) - 1:
    expr = expr[1:-1]
  return expr, val


def _matching_paren(s: str) -> int:
  depth = 0
  for k, c in enumerate(s):
    depth += c == "("
    depth -= c == ")"
    if depth == 0:
      return k
  return -1


def generate(spec: CountdownSpec, n: int, seed: int) -> list[dict]:
  """n solvable problems {prompt, answer (target), demo (a solution), difficulty (count)}."""
  rng = np.random.default_rng(seed)
  out = []
  while len(out) < n:
    k = int(rng.integers(spec.min_numbers, spec.max_numbers + 1))
    nums = [int(x) for x in rng.integers(1, spec.max_value + 1, size=k)]
    expr, val = _random_expr(nums, rng)
    if val.denominator != 1 or not 0 < val <= spec.max_target or len(expr) > MAX_CHARS:
      continue
    prompt = ",".join(map(str, nums)) + ";" + str(int(val)) + "="
    out.append({"prompt": prompt, "answer": str(int(val)), "demo": expr, "difficulty": k})
  return out


def parse(text: str) -> tuple[Fraction, list[int]] | None:
  """Value and the integer literals of an arithmetic expression, or None if malformed.

  Grammar: expr := term (('+'|'-') term)*; term := atom (('*'|'/') atom)*;
  atom := integer | '(' expr ')'. No unary minus, no whitespace.
  """
  if not isinstance(text, str) or not 0 < len(text) <= MAX_CHARS:
    return None
  pos = 0
  literals: list[int] = []

  def atom(depth):
    nonlocal pos
    if depth > MAX_DEPTH or pos >= len(text):
      return None
    if text[pos] == "(":
      pos += 1
      v = expr(depth + 1)
      if v is None or pos >= len(text) or text[pos] != ")":
        return None
      pos += 1
      return v
    start = pos
    while pos < len(text) and text[pos] in "0123456789":
      pos += 1
    if pos == start or pos - start > 6:
      return None
    literals.append(int(text[start:pos]))
    return Fraction(int(text[start:pos]))

  def term(depth):
    nonlocal pos
    v = atom(depth)
    while v is not None and pos < len(text) and text[pos] in "*/":
      op = text[pos]
      pos += 1
      w = atom(depth)
      if w is None or (op == "/" and w == 0):
        return None
      v = v * w if op == "*" else v / w
    return v

  def expr(depth):
    nonlocal pos
    v = term(depth)
    while v is not None and pos < len(text) and text[pos] in "+-":
      op = text[pos]
      pos += 1
      w = term(depth)
      if w is None:
        return None
      v = v + w if op == "+" else v - w
    return v

  value = expr(0)
  if value is None or pos != len(text):
    return None
  return value, literals


def score(completion: str, finished: bool, prompt: str) -> float:
  """1.0 if the completion uses each given number exactly once and hits the target, else 0.0."""
  if not finished:
    return 0.0
  try:
    nums_text, target_text = prompt.rstrip("=").split(";")
    nums = [int(x) for x in nums_text.split(",")]
    target = int(target_text)
  except ValueError:
    raise ValueError(f"malformed countdown prompt {prompt!r}") from None
  parsed = parse(completion)
  if parsed is None:
    return 0.0
  value, literals = parsed
  if collections.Counter(literals) != collections.Counter(nums):
    return 0.0
  return float(value == target)


@base.register_task
class CountdownTask(builders.SyntheticTask):
  """The Countdown numbers game, scored on the host (any tokenizer)."""

  name = "countdown"
  spec_class = CountdownSpec
  generate = staticmethod(generate)

  def score(self, completion: str, finished: bool, record: dict) -> float:
    return score(completion, finished, record["prompt"])
