"""Claims as data judged by rlpost.eval.stats: directions, margins, equivalence, Holm."""

import numpy as np
import pytest

from experiments import harness
from rlpost.eval import stats

HI = [1.0, 1.1, 0.9, 1.05]
LO = [0.0, 0.1, -0.1, 0.05]


def claim(**kw):
  base = dict(id="c", text="a beats b", metric="m", arms=("a", "b"))
  return harness.Claim(**{**base, **kw})


def judge(claims, a, b):
  return harness.judge_family(claims, {"m": {"a": a, "b": b}})


def test_directional_claims():
  (v,) = judge([claim()], HI, LO)
  assert v.verdict == "reproduced"
  assert v.p == pytest.approx(stats.t_test(HI, LO, alternative="greater"))
  # 4 vs 4 seeds: the exact one-sided permutation p is 1/C(8, 4) = 1/70 (reported only).
  assert v.p_permutation == pytest.approx(1 / 70)
  diff, lo, hi = stats.diff_interval(HI, LO)
  assert (v.diff, v.lo, v.hi) == (diff, lo, hi) and v.n == (4, 4)
  assert judge([claim()], LO, HI)[0].verdict == "not reproduced"
  assert judge([claim(direction="less")], LO, HI)[0].verdict == "reproduced"
  # A margin above the whole interval: the effect is real but smaller than claimed; the test is
  # against the margin.
  (v,) = judge([claim(margin=2.0)], HI, LO)
  assert v.verdict == "not reproduced" and v.p > 0.99
  # An interval that straddles the margin: inconclusive.
  (v,) = judge([claim(margin=1.0)], HI, LO)
  assert v.lo < 1.0 < v.hi and v.verdict == "inconclusive"
  # No spread, no difference: p = 1, inconclusive.
  assert judge([claim()], [1.0, 1.0], [1.0, 1.0])[0].verdict == "inconclusive"


def test_equivalence_claims():
  a, b = [0.50, 0.51, 0.49, 0.50, 0.505], [0.50, 0.49, 0.51, 0.495, 0.50]
  (v,) = judge([claim(direction="equivalent", margin=0.05)], a, b)
  assert v.verdict == "reproduced"
  p, lo, hi = stats.tost(a, b, 0.05)
  assert (v.p, v.lo, v.hi) == (p, lo, hi)
  assert judge([claim(direction="equivalent", margin=0.05)], HI, LO)[0].verdict == "not reproduced"
  noisy = [0.4, 0.6, 0.45, 0.55]
  assert judge([claim(direction="equivalent", margin=0.05)], noisy, b[:4])[0].verdict == \
      "inconclusive"


def test_holm_within_a_family_only():
  claims = [claim(id="x", family="f"), claim(id="y", family="f"), claim(id="z", family="g")]
  v = judge(claims, HI, LO)
  p = stats.t_test(HI, LO, alternative="greater")
  np.testing.assert_allclose([x.p_holm for x in v], [2 * p, 2 * p, p])
  assert v[0].mde > 0


def test_bad_claims_and_missing_values():
  with pytest.raises(ValueError, match="direction must be one of"):
    claim(direction="up")
  with pytest.raises(ValueError, match="margin must be"):
    claim(direction="equivalent", margin=0.0)
  with pytest.raises(KeyError, match="claim 'c': no per-seed values"):
    harness.judge_family([claim(arms=("a", "nope"))], {"m": {"a": HI}})
  with pytest.raises(ValueError, match="NaN|finite"):
    judge([claim()], [1.0, np.nan, 2.0], LO)


def test_rows():
  v = judge([claim()], HI, LO)
  rows = harness.verdict_rows(v)
  assert rows[2].startswith("| a beats b | a: +1.000 [") and rows[2].endswith("| reproduced |")
  assert harness.verdict_rows([x.to_json() for x in v]) == rows
