"""Evaluation metrics: unbiased pass@k, maj@k, per-difficulty summaries (seed statistics live in
``rlpost.eval.stats``).

pass@k (Chen et al. 2021): for a problem with n samples of which c are correct,
pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{j = n-c+1}^{n} (1 - k / j), and 1 when n - c < k.
It is the probability that at least one of k samples drawn without replacement from the n is
correct: never "max over n samples" for k < n.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

import numpy as np


def pass_at_k(n: int | np.ndarray, c: int | np.ndarray, k: int) -> np.ndarray:
  """Unbiased pass@k per problem. n, c: int arrays of equal shape (n >= k > 0); float64 out."""
  n = np.asarray(n, np.int64)
  c = np.asarray(c, np.int64)
  if k < 1:
    raise ValueError(f"pass@k needs k >= 1, got k={k}")
  if np.any(n < k):
    raise ValueError(f"pass@{k} needs at least {k} samples per problem, got n={int(n.min())}")
  if np.any((c < 0) | (c > n)):
    raise ValueError("correct counts must lie in [0, n]")
  out = np.ones(np.broadcast(n, c).shape, np.float64)
  flat_n, flat_c, flat_o = np.broadcast_to(n, out.shape).ravel(), np.broadcast_to(c, out.shape).ravel(), out.ravel()
  for i, (ni, ci) in enumerate(zip(flat_n, flat_c)):
    if ni - ci >= k:
      j = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
      flat_o[i] = 1.0 - np.prod(1.0 - k / j)
  return flat_o.reshape(out.shape)


def ks_up_to(n: int) -> list[int]:
  """k = 1, 2, 4, ... up to n (and n itself); n >= 1 samples per problem."""
  if n < 1:
    raise ValueError(f"ks_up_to needs n >= 1 samples, got n={n}")
  ks, k = [], 1
  while k <= n:
    ks.append(k)
    k *= 2
  if ks[-1] != n:
    ks.append(n)
  return ks


def majority_at_k(answers: Sequence[Sequence[Hashable]], correct_answers: Sequence[Hashable],
                  k: int) -> float:
  """maj@k: fraction of problems whose most frequent answer among the first k samples is right.

  answers: per problem, the extracted final answers of its samples (None = unparseable, never
  counted as a vote); a problem with fewer than k samples votes with all of them. Ties are
  broken by first occurrence; a problem without a single vote scores 0. answers and
  correct_answers must have one entry per problem; with no problems the fraction is undefined
  and the result is nan (as the mean of the empty per-problem pass@k in ``summarize_passk``).
  """
  if k < 1:
    raise ValueError(f"maj@k needs k >= 1, got k={k}")
  if len(answers) != len(correct_answers):
    raise ValueError(f"maj@{k}: {len(answers)} problems of answers but {len(correct_answers)} "
                     "reference answers")
  hits = []
  for ans, ref in zip(answers, correct_answers):
    voters = [a for a in list(ans)[:k] if a is not None]
    if not voters:
      hits.append(0.0)
      continue
    votes = Counter(voters)
    best = max(votes.values())
    winner = next(a for a in voters if votes[a] == best)
    hits.append(float(winner == ref))
  return float(np.mean(hits)) if hits else float("nan")


def summarize_passk(correct: np.ndarray, difficulty: np.ndarray, ks: Sequence[int]) -> dict:
  """pass@k overall and per difficulty from a [problems, n] bool matrix of sample verdicts."""
  correct = np.asarray(correct, bool)
  difficulty = np.asarray(difficulty)
  if difficulty.shape != correct.shape[:1]:
    raise ValueError(f"difficulty needs one entry per problem: shape {difficulty.shape} for "
                     f"{correct.shape[0]} problems")
  n = correct.shape[1]
  c = correct.sum(axis=1)
  out = {f"pass@{k}": float(pass_at_k(n, c, k).mean()) for k in ks}
  out["accuracy"] = float(correct.mean())
  for d in np.unique(difficulty):
    sel = difficulty == d
    for k in ks:
      out[f"pass@{k}/d{int(d)}"] = float(pass_at_k(n, c[sel], k).mean())
    out[f"all_wrong/d{int(d)}"] = float((c[sel] == 0).mean())
  return out
