"""DARS schedules against the official numeric cases, jitted and eagerly."""

import jax
import numpy as np
import pytest

from rlpost.rollouts import dars

ACC = np.array([0.0, 1 / 8, 2 / 8, 3 / 8, 4 / 8, 7 / 8], np.float32)


@pytest.mark.parametrize("wrap", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_schedules_match_official_cases(wrap):
  et = wrap(lambda a: dars.extra_rollouts(a, 8, 32, schedule="et"))(ACC)
  hw = wrap(lambda a: dars.extra_rollouts(a, 8, 64, schedule="hw"))(ACC)
  np.testing.assert_array_equal(et, [24, 11, 3, 1, 0, 0])
  np.testing.assert_array_equal(hw, [56, 24, 8, 3, 0, 0])


def test_schedule_caps_and_std_variant():
  np.testing.assert_array_equal(dars.extra_rollouts(ACC, 8, 16, schedule="et"), [8, 8, 3, 1, 0, 0])
  # With std: S = 2 sqrt(a(1-a)), P = N. a = 1/8: S = 0.6614, (8 - 8 S) / S = 4.09 -> 5.
  np.testing.assert_array_equal(dars.extra_rollouts(ACC[1:2], 8, 64, use_std=True), [5])
  with pytest.raises(ValueError, match="schedule must be"):
    dars.extra_rollouts(ACC, 8, 32, schedule="x")
  with pytest.raises(ValueError, match="n_max"):
    dars.extra_rollouts(ACC, 8, 4)

