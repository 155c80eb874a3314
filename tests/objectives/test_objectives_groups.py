"""Masked segment statistics against numpy on random ragged groups (one compilation)."""

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.objectives import groups


def test_group_statistics_match_numpy_on_ragged_groups():
  rng = np.random.default_rng(0)
  sizes = [1, 2, 3, 4, 5, 6, 0]
  gmax = 6
  gid = np.repeat(np.arange(len(sizes)), gmax).astype(np.int32)
  valid = np.tile(np.arange(gmax), len(sizes)) < np.repeat(sizes, gmax)
  # Shuffle rows: statistics must depend only on the group ids, not on the layout.
  perm = rng.permutation(gid.size)
  gid, valid = gid[perm], valid[perm]
  vals = rng.integers(0, 4, size=gid.size).astype(np.float32)  # many ties
  vals[~valid] = np.nan  # padding may hold anything

  @jax.jit
  def stats(v, g, m):
    std, defined = groups.group_std(v, g, m, ddof=1)
    return dict(
        n=groups.group_count(g, m),
        mean=groups.group_mean(v, g, m),
        std=std,
        defined=defined,
        lo=groups.group_median(v, g, m, even="lower"),
        mid=groups.group_median(v, g, m, even="mean"),
        mx=groups.group_max(v, g, m),
        mn=groups.group_min(v, g, m),
        first=groups.group_first(v >= 2, g, m),
    )

  out = jax.tree.map(np.asarray, stats(jnp.asarray(vals), jnp.asarray(gid), jnp.asarray(valid)))
  for b in np.flatnonzero(valid):
    members = np.flatnonzero((gid == gid[b]) & valid)
    x = vals[members]
    s = np.sort(x)
    assert out["n"][b] == len(x)
    np.testing.assert_allclose(out["mean"][b], x.mean(), rtol=1e-6)
    np.testing.assert_allclose(out["lo"][b], s[(len(x) - 1) // 2])
    np.testing.assert_allclose(out["mid"][b], np.median(x))
    assert out["mx"][b] == x.max() and out["mn"][b] == x.min()
    assert out["defined"][b] == (len(x) > 1)
    if len(x) > 1:
      np.testing.assert_allclose(out["std"][b], x.std(ddof=1), rtol=1e-5, atol=1e-6)
    cand = members[x >= 2]
    assert out["first"][b] == (len(cand) > 0 and b == cand.min())
  assert not out["first"][~valid].any()
