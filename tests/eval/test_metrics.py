"""Evaluation metrics against brute-force enumeration and values worked out by hand.

pass@k is checked against the definition it estimates (the share of k-subsets of the n samples
holding at least one correct sample), maj@k and the per-difficulty summary against small cases
whose answers are written out below, and the bootstrap intervals against resampling
distributions small enough to list.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from rlpost.eval import metrics


def brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
  """Share of all k-subsets of n samples (the first c correct) holding a correct sample."""
  subsets = list(itertools.combinations(range(n), k))
  return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


CASES = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]


def test_pass_at_k_matches_enumeration_of_k_subsets():
  """Every (n, c, k) with n <= 8: c = 0, c = n, k = n and n - c < k are all in the grid."""
  assert {(1, 0, 1), (8, 8, 8), (8, 0, 8), (5, 3, 3)} <= set(CASES)
  for n, c, k in CASES:
    got = metrics.pass_at_k(n, c, k)
    assert got.shape == () and got.dtype == np.float64
    assert float(got) == pytest.approx(float(brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_edge_values():
  assert float(metrics.pass_at_k(10, 0, 5)) == 0.0  # nothing correct
  assert float(metrics.pass_at_k(10, 10, 1)) == 1.0  # everything correct
  assert float(metrics.pass_at_k(10, 6, 5)) == 1.0  # n - c = 4 < k: every 5-subset has a hit
  assert float(metrics.pass_at_k(10, 3, 1)) == pytest.approx(0.3)  # pass@1 is c / n
  assert float(metrics.pass_at_k(4, 1, 4)) == 1.0  # k = n: any correct sample counts
  assert float(metrics.pass_at_k(4, 1, 2)) == pytest.approx(0.5)  # 1 - C(3, 2) / C(4, 2)


def test_pass_at_k_vectorised_shapes():
  c = np.array([[0, 1, 2], [3, 4, 8]])
  got = metrics.pass_at_k(8, c, 3)
  assert got.shape == (2, 3)
  want = [[float(brute_pass_at_k(8, int(ci), 3)) for ci in row] for row in c]
  np.testing.assert_allclose(got, want, atol=1e-12)
  # n and c of the same shape, per problem.
  n = np.array([4, 6, 8, 8])
  c = np.array([1, 0, 8, 5])
  np.testing.assert_allclose(metrics.pass_at_k(n, c, 4),
                             [float(brute_pass_at_k(int(a), int(b), 4)) for a, b in zip(n, c)],
                             atol=1e-12)
  # Broadcasting: n over rows, c over columns.
  n = np.array([[5], [7]])
  c = np.array([[0, 2, 5]])
  got = metrics.pass_at_k(n, c, 2)
  assert got.shape == (2, 3)
  for i, j in itertools.product(range(2), range(3)):
    assert got[i, j] == pytest.approx(float(brute_pass_at_k(int(n[i, 0]), int(c[0, j]), 2)))
  assert metrics.pass_at_k(8, np.zeros((0,), int), 2).shape == (0,)


@pytest.mark.parametrize("n,c,k,match", [
    (4, 1, 0, "k >= 1"),
    (4, 1, -2, "k >= 1"),
    (3, 1, 4, "at least 4 samples per problem, got n=3"),
    (np.array([8, 2]), np.array([1, 1]), 3, "got n=2"),
    (4, -1, 2, r"correct counts must lie in \[0, n\]"),
    (4, 5, 2, r"correct counts must lie in \[0, n\]"),
    (np.array([4, 4]), np.array([4, 5]), 1, r"in \[0, n\]"),
])
def test_pass_at_k_rejects_bad_arguments(n, c, k, match):
  with pytest.raises(ValueError, match=match):
    metrics.pass_at_k(n, c, k)


def test_ks_up_to_by_hand():
  assert metrics.ks_up_to(1) == [1]
  assert metrics.ks_up_to(2) == [1, 2]
  assert metrics.ks_up_to(3) == [1, 2, 3]
  assert metrics.ks_up_to(4) == [1, 2, 4]
  assert metrics.ks_up_to(6) == [1, 2, 4, 6]
  assert metrics.ks_up_to(8) == [1, 2, 4, 8]
  assert metrics.ks_up_to(9) == [1, 2, 4, 8, 9]
  assert metrics.ks_up_to(64) == [1, 2, 4, 8, 16, 32, 64]
  with pytest.raises(ValueError, match="n >= 1"):
    metrics.ks_up_to(0)


def test_majority_at_k_hand_cases():
  maj = metrics.majority_at_k
  assert maj([["1", "2", "2"]], ["2"], 3) == 1.0  # plain majority
  assert maj([["1", "2", "2"]], ["1"], 3) == 0.0
  # Only the first k samples vote.
  assert maj([["1", "1", "2", "2", "2"]], ["1"], 2) == 1.0
  assert maj([["1", "1", "2", "2", "2"]], ["2"], 5) == 1.0
  # Ties go to the answer seen first, whichever order the tied answers appear in.
  assert maj([["3", "4", "4", "3"]], ["3"], 4) == 1.0
  assert maj([["4", "3", "3", "4"]], ["4"], 4) == 1.0
  assert maj([["3", "4", "4", "3"]], ["4"], 4) == 0.0
  # None never votes: two unparseable samples do not outvote one answer.
  assert maj([[None, None, "5"]], ["5"], 3) == 1.0
  assert maj([[None, "6", None, "5", "5"]], ["5"], 5) == 1.0
  # A problem without a single parsed answer scores 0, even against a None reference.
  assert maj([[None, None]], [None], 2) == 0.0
  assert maj([[]], ["1"], 2) == 0.0
  # k larger than the samples available: all of them vote.
  assert maj([["1", "2", "2"]], ["2"], 10) == 1.0
  # The mean over problems: right, wrong (tie to "8"), right, no vote.
  answers = [["7", "7", "1"], ["8", "9"], ["2", None, "2"], [None]]
  assert maj(answers, ["7", "9", "2", "0"], 3) == pytest.approx(2 / 4)
  # Answers may be any hashable, compared with ==.
  assert maj([(1, 2, 2)], [2], 3) == 1.0


def test_majority_at_k_empty_and_bad_arguments():
  # No problems: the fraction of nothing is undefined.
  assert np.isnan(metrics.majority_at_k([], [], 4))
  with pytest.raises(ValueError, match="k >= 1"):
    metrics.majority_at_k([["1"]], ["1"], 0)
  with pytest.raises(ValueError, match="2 problems of answers but 1 reference"):
    metrics.majority_at_k([["1"], ["2"]], ["1"], 1)


def test_summarize_passk_by_hand():
  """Four problems of four samples, two per difficulty level, listed interleaved.

  level 1: c = 2 (pass@2 = 1 - C(2,2)/C(4,2) = 5/6) and c = 0 (all wrong);
  level 2: c = 4 and c = 1 (pass@2 = 1 - C(3,2)/C(4,2) = 1/2).
  """
  correct = np.array([[1, 1, 1, 1],   # level 2, c = 4
                      [1, 0, 1, 0],   # level 1, c = 2
                      [0, 0, 1, 0],   # level 2, c = 1
                      [0, 0, 0, 0]])  # level 1, c = 0
  difficulty = np.array([2, 1, 2, 1])
  got = metrics.summarize_passk(correct, difficulty, [1, 2, 4])
  want = {
      "pass@1": (1 + 0.5 + 0.25 + 0) / 4,
      "pass@2": (1 + 5 / 6 + 0.5 + 0) / 4,
      "pass@4": 3 / 4,
      "accuracy": 7 / 16,
      "pass@1/d1": (0.5 + 0) / 2, "pass@2/d1": (5 / 6 + 0) / 2, "pass@4/d1": 1 / 2,
      "all_wrong/d1": 1 / 2,
      "pass@1/d2": (1 + 0.25) / 2, "pass@2/d2": (1 + 0.5) / 2, "pass@4/d2": 1.0,
      "all_wrong/d2": 0.0,
  }
  assert set(got) == set(want)
  for key, value in want.items():
    assert got[key] == pytest.approx(value, abs=1e-12), key
  # A list of levels is read as an array; a length mismatch is an error, not a silent subset.
  assert metrics.summarize_passk(correct, [2, 1, 2, 1], [2]) == {
      k: v for k, v in got.items() if k.startswith(("pass@2", "accuracy", "all_wrong"))}
  with pytest.raises(ValueError, match="one entry per problem"):
    metrics.summarize_passk(correct, difficulty[:3], [1])
