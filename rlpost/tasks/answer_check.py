"""Checking a completion's final answer against a reference: the project's parser or math-verify.

    check(checker, completions, references) -> list[float]   1.0 where the answer is right

* ``parser`` (``score_math``, below): the last ``\\boxed{}``, else the text after
  ``####``, else the last number, compared as exact fractions where both are numbers, else as
  normalised strings. Fast, dependency-free, and the CPU tables' checker.
* ``math_verify``: the ``math-verify`` package (``pip install 'rlpost[data]'``) as verl's math
  reward calls it (``verl.utils.reward_score.math_verify``): the reference wrapped in
  ``\\boxed{}`` and parsed as LaTeX, the completion parsed as an expression and as LaTeX (every
  candidate it finds), 1.0 when any candidate is equivalent under sympy to 6 decimals, 0.0 on
  any parse failure or timeout. This is the full-size configurations' checker (the papers'
  trainers check answers with it).

math-verify bounds each parse and comparison with ``signal.alarm``, which works only in a main
thread, and sympy may take long on a pathological answer. So its checks run in worker processes
(``python -m rlpost.tasks.answer_check``, each scoring in its own main thread with math-verify's
timeouts), and a batch that outlives its deadline (``_deadline``) has its unfinished answers
scored 0.0 (``WORKERS.timeouts`` counts them) and those workers replaced: nothing waits forever.
This module imports nothing heavy at the top, so a worker starts without JAX.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import select
import subprocess
import sys
import time
from fractions import Fraction
from typing import Sequence

CHECKERS = ("parser", "math_verify")
# Per-answer seconds math-verify may spend parsing, and comparing (its own bounds, in a worker).
PARSE_SECONDS, VERIFY_SECONDS = 5, 5


def available(checker: str) -> str | None:
  """None when ``checker`` can run here, else why not (one line naming what to install)."""
  if checker not in CHECKERS:
    return f"unknown answer checker {checker!r}; known: {list(CHECKERS)}"
  if checker == "math_verify" and importlib.util.find_spec("math_verify") is None:
    return "math_verify needs the math-verify package: pip install 'rlpost[data]'"
  return None


# The parser: answer extraction and equivalence (no dependency).

def extract_gsm8k_answer(answer: str) -> str | None:
  """The number after ``####`` with thousands separators removed, or None."""
  m = re.search(r"####\s*([^\n]+)", answer)
  if not m:
    return None
  return m.group(1).strip().replace(",", "").rstrip(".")


def extract_boxed(text: str) -> str | None:
  """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced, or None."""
  starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
  if not starts:
    return None
  i = starts[-1]
  depth = 1
  j = i
  while j < len(text) and depth:
    depth += text[j] == "{"
    depth -= text[j] == "}"
    j += 1
  return text[i:j - 1].strip() if depth == 0 else None


def extract_final_number(text: str) -> str | None:
  """The last number in free text (for model outputs without a box or ####)."""
  nums = re.findall(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?", text)
  return nums[-1].replace(",", "") if nums else None


_LATEX_NOISE = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", "$", r"\displaystyle", "^\\circ",
                "^{\\circ}", r"\%", "%", r"\$", "dollars", "units"]


def normalize_answer(ans: str) -> str:
  """Canonical string form of a math answer (LaTeX noise removed, fractions unified)."""
  s = ans.strip()
  m = re.fullmatch(r"\\text\{(.*)\}", s)
  if m:
    s = m.group(1)
  for noise in _LATEX_NOISE:
    s = s.replace(noise, "")
  s = s.replace("dfrac", "frac").replace("tfrac", "frac").replace(" ", "")
  s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
  s = re.sub(r"^([a-zA-Z]\w*)=", "", s)  # "x=5" -> "5"
  s = s.rstrip(".")
  if s.startswith("0.") or re.fullmatch(r"-?\d+\.0+", s):
    s = s.rstrip("0").rstrip(".") if "." in s else s
  return s


def _as_number(s: str) -> Fraction | None:
  s = s.replace(",", "")
  m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
  try:
    if m:
      val = Fraction(int(m.group(2)), int(m.group(3)))
      return -val if m.group(1) else val
    if re.fullmatch(r"-?\d+/\d+", s):
      a, b = s.split("/")
      return Fraction(int(a), int(b))
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
      return Fraction(s)
  except (ValueError, ZeroDivisionError):
    return None
  return None


def is_equivalent(prediction: str | None, reference: str | None) -> bool:
  """Exact numeric equality when both sides parse as numbers, else normalised string equality."""
  if prediction is None or reference is None:
    return False
  p, r = normalize_answer(prediction), normalize_answer(reference)
  pn, rn = _as_number(p), _as_number(r)
  if pn is not None and rn is not None:
    return pn == rn
  return p == r and p != ""


def extract_answer(completion: str) -> str | None:
  """A model completion's final answer: the last ``\\boxed{}``, else the text after ``####``,
  else the last number; None if there is none."""
  pred = extract_boxed(completion)
  if pred is None:
    pred = extract_gsm8k_answer(completion) or extract_final_number(completion)
  return pred


def canonical_answer(ans: str | None) -> str | None:
  """A hashable key with ``canonical_answer(a) == canonical_answer(b)`` exactly when
  ``is_equivalent(a, b)``: the exact fraction of a number, else the normalised string; None for
  a missing or empty answer. Majority votes count answers by this key."""
  if ans is None:
    return None
  s = normalize_answer(ans)
  num = _as_number(s)
  if num is not None:
    return f"{num.numerator}/{num.denominator}"
  return s or None


def score_math(completion: str, reference: str) -> float:
  """1.0 if the completion's boxed (else last) answer is equivalent to the reference."""
  return float(is_equivalent(extract_answer(completion), reference))


# math-verify, in worker processes.

def math_verify_one(completion: str, reference: str) -> float:
  """verl's math-verify reward of one completion (runs in a worker's main thread)."""
  from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
  from math_verify.errors import TimeoutException

  try:
    gold = parse("\\boxed{" + reference + "}", (LatexExtractionConfig(),),
                 parsing_timeout=PARSE_SECONDS)
    if not gold:
      return 0.0
    pred = parse(completion, (ExprExtractionConfig(), LatexExtractionConfig()),
                 parsing_timeout=PARSE_SECONDS)
    return float(bool(pred) and verify(gold, pred, timeout_seconds=VERIFY_SECONDS))
  except (Exception, TimeoutException):  # noqa: BLE001 - verl scores any failure 0
    return 0.0


class _Workers:
  """Worker processes (``python -m rlpost.tasks.answer_check``), started on first use and
  replaced after a timeout. A worker reads one JSON list of [completion, reference] pairs per
  line on stdin and writes one JSON list of scores per line on stdout."""

  def __init__(self):
    self.procs: list[subprocess.Popen] = []
    self.timeouts = 0

  def size(self) -> int:
    return max(1, min(4, os.cpu_count() or 1))

  def get(self) -> list[subprocess.Popen]:
    self.procs = [p for p in self.procs if p.poll() is None]
    while len(self.procs) < self.size():
      self.procs.append(subprocess.Popen(
          [sys.executable, "-m", "rlpost.tasks.answer_check"], stdin=subprocess.PIPE,
          stdout=subprocess.PIPE, text=True, bufsize=1,
          env={**os.environ, "JAX_PLATFORMS": "cpu"}))
    return self.procs

  def kill(self, procs=None) -> None:
    for p in list(self.procs if procs is None else procs):
      p.kill()
      p.wait()
      if p in self.procs:
        self.procs.remove(p)


WORKERS = _Workers()
atexit.register(WORKERS.kill)


def _deadline(n: int, workers: int) -> float:
  """Seconds a batch of n answers may take: every answer at its bounds, plus worker start-up."""
  per_worker = -(-n // workers)
  return 60.0 + per_worker * (PARSE_SECONDS * 2 + VERIFY_SECONDS)


def check(checker: str, completions: Sequence[str], references: Sequence[str]) -> list[float]:
  """[len(completions)] scores in {0.0, 1.0}: completion i's answer against references[i]."""
  if len(completions) != len(references):
    raise ValueError(f"{len(completions)} completions but {len(references)} references")
  why = available(checker)
  if why:
    raise ValueError(why)
  if checker == "parser":
    return [score_math(c, r) for c, r in zip(completions, references)]
  pairs = [[str(c), str(r)] for c, r in zip(completions, references)]
  if not pairs:
    return []
  procs = WORKERS.get()
  chunk = -(-len(pairs) // len(procs))
  jobs = {}  # worker stdout fd -> (process, first index, count)
  for w, i in zip(procs, range(0, len(pairs), chunk)):
    w.stdin.write(json.dumps(pairs[i:i + chunk]) + "\n")
    w.stdin.flush()
    jobs[w.stdout.fileno()] = (w, i, len(pairs[i:i + chunk]))
  out = [0.0] * len(pairs)
  end = time.monotonic() + _deadline(len(pairs), len(procs))
  while jobs and time.monotonic() < end:
    ready, _, _ = select.select(list(jobs), [], [], max(0.0, end - time.monotonic()))
    for fd in ready:
      w, i, n = jobs.pop(fd)
      line = w.stdout.readline()
      if not line:
        raise RuntimeError(f"math_verify worker {w.pid} exited (status {w.wait()})")
      out[i:i + n] = json.loads(line)
  if jobs:  # past the deadline: unfinished answers score 0, their workers are replaced
    WORKERS.timeouts += sum(n for _, _, n in jobs.values())
    WORKERS.kill([w for w, _, _ in jobs.values()])
  return out


def _serve() -> None:
  import logging

  logging.getLogger("math_verify").setLevel(logging.ERROR)  # one warning per unparsed answer
  for line in sys.stdin:
    pairs = json.loads(line)
    sys.stdout.write(json.dumps([math_verify_one(c, r) for c, r in pairs]) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  _serve()
