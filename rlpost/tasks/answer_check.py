"""Checking a completion's final answer against a reference: the project's parser or math-verify.

    check(checker, completions, references) -> list[float]   1.0 where the answer is right

* ``parser`` (``rlpost.tasks.math_data.score_math``): the last ``\\boxed{}``, else the text after
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
import select
import subprocess
import sys
import time
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
    from rlpost.tasks import math_data

    return [math_data.score_math(c, r) for c, r in zip(completions, references)]
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
