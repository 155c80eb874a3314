"""Packed (padding-free) scoring equals the padded pass: placement, values, gradients, buckets."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlpost.models import packing
from rlpost.models import transformer as tfm
from rlpost.models import scoring


def _rows(r=6, tp=7, n=9, seed=0, vocab=40, prompt_lens=None, comp_lens=None):
  """Prompts padded on the left (even rows) or right (odd rows), prefix completion masks."""
  rng = np.random.default_rng(seed)
  pl = rng.integers(1, tp + 1, r) if prompt_lens is None else np.asarray(prompt_lens)
  cl = rng.integers(0, n + 1, r) if comp_lens is None else np.asarray(comp_lens)
  cols = np.arange(tp)[None, :]
  left = cols >= tp - pl[:, None]
  right = cols < pl[:, None]
  pmask = np.where((np.arange(r) % 2 == 0)[:, None], left, right)
  prompts = np.where(pmask, rng.integers(3, vocab, (r, tp)), 0)
  cmask = np.arange(n)[None, :] < cl[:, None]
  comp = np.where(cmask, rng.integers(3, vocab, (r, n)), 0)
  return tuple(jnp.asarray(x) for x in (prompts.astype(np.int32), pmask, comp.astype(np.int32),
                                        cmask))


def test_plan_places_rows_without_overlap_first_fit_decreasing():
  lengths = jnp.asarray([5, 9, 3, 4, 10, 1], jnp.int32)
  p = packing.plan(lengths, width=10)
  bins, offs = np.asarray(p.bin), np.asarray(p.offset)
  # Decreasing order 10, 9, 5, 4, 3, 1: 10 -> bin 0; 9 -> bin 1; 5 -> bin 2; 4 -> bin 2 at 5;
  # 3 -> bin 3 (bins 0-2 have 0, 1, 1 slots left); 1 -> bin 1 at 9.
  np.testing.assert_array_equal(bins, [2, 1, 3, 2, 0, 1])
  np.testing.assert_array_equal(offs, [0, 0, 0, 5, 0, 9])
  assert int(p.bins_used) == 4
  occupied = np.zeros((6, 10), int)
  for b, o, n in zip(bins, offs, np.asarray(lengths)):
    occupied[b, o:o + n] += 1
  assert occupied.max() == 1 and occupied.sum() == int(lengths.sum())


def test_pack_layout_matches_rows():
  prompts, pmask, comp, cmask = _rows()
  p = packing.plan(packing.row_lengths(pmask, cmask), 16)
  out = packing.pack(prompts, pmask, comp, cmask, int(p.bins_used), p)
  tok, seg, pos = (np.asarray(x).reshape(-1) for x in (out.tokens, out.segments, out.positions))
  for i in range(6):
    real = np.concatenate([np.asarray(prompts[i])[np.asarray(pmask[i])],
                           np.asarray(comp[i])[np.asarray(cmask[i])]])
    np.testing.assert_array_equal(tok[seg == i + 1], real)
    np.testing.assert_array_equal(pos[seg == i + 1], np.arange(real.size))
    # completion token j is predicted by the slot holding the token before it
    sel = np.asarray(out.select[i])[np.asarray(cmask[i])]
    np.testing.assert_array_equal(tok[sel + 1], np.asarray(comp[i])[np.asarray(cmask[i])])
    np.testing.assert_array_equal(seg[sel], i + 1)
  assert (seg == 0).sum() == tok.size - int(packing.row_lengths(pmask, cmask).sum())


CONFIGS = {
    "plain": dict(num_kv_heads=4),
    "gqa-windows-remat": dict(num_kv_heads=2, sliding_window=5,
                              layer_types=("sliding", "full", "sliding"), local_rope_theta=50.0,
                              qk_norm=True),
}
CASES = [("plain", "xla", 1), ("plain", "blockwise", 2), ("gqa-windows-remat", "xla", 2),
         ("gqa-windows-remat", "blockwise", 2)]


@pytest.mark.parametrize("name,impl,bin_rows", CASES)
def test_packed_scores_and_gradients_equal_padded(name, impl, bin_rows):
  """Log-probs, entropies and parameter gradients of the packed pass equal the padded pass's
  (3 layers; left and right prompt padding; empty and full completions), both for a bucket the
  rows fit (the packed branch runs) and one bin short of it (the padded fallback runs)."""
  cfg = tfm.TransformerConfig(vocab_size=40, hidden_size=32, num_layers=3, num_heads=4,
                              intermediate_size=48, max_seq_len=64, attention=impl,
                              **CONFIGS[name])
  remat = name != "plain"
  prompts, pmask, comp, cmask = _rows(r=8, comp_lens=[9, 0, 4, 2, 6, 1, 3, 5])
  weights = jnp.asarray(np.random.default_rng(1).standard_normal((8, 9)), jnp.float32)
  graphdef, params = nnx.split(tfm.init_model(cfg, seed=3))
  used = int(packing.plan(packing.row_lengths(pmask, cmask), bin_rows * 16).bins_used)
  assert 2 <= used and used * bin_rows < 8, used  # packing saves slots; one bin fewer cannot

  def loss(p, fn):
    logp, ent = fn(nnx.merge(graphdef, p))
    return jnp.sum(logp * weights) + 0.1 * jnp.sum(jnp.where(cmask, ent, 0.0)), (logp, ent)

  @jax.jit
  def padded(p):
    return jax.value_and_grad(loss, has_aux=True)(p, lambda m: scoring.completion_scores(
        m, prompts, pmask, comp, cmask, entropy=True, remat=remat))

  (_, (want_lp, want_ent)), want_g = padded(params)
  assert float(optax.tree.norm(want_g)) > 0 and np.abs(want_lp).sum() > 0
  c = np.asarray(cmask)
  # A bucket the rows fit (the packed branch runs), one bin short of it (the padded branch).
  for bins, ran in ((used, 0), (used - 1, 1)):
    buckets = packing.Buckets((bins * bin_rows / 8,), bin_rows)
    assert buckets.bins(8) == (bins,) and int(buckets.index(pmask, cmask)) == ran

    @jax.jit
    def switched(p, buckets=buckets):
      def branch(num_bins):
        def scores(m):
          if num_bins is None:
            return scoring.completion_scores(m, prompts, pmask, comp, cmask, entropy=True,
                                             remat=remat, logits_chunk=4)
          return packing.completion_scores(m, prompts, pmask, comp, cmask, num_bins=num_bins,
                                           bin_rows=bin_rows, entropy=True, remat=remat,
                                           logits_chunk=4)
        return jax.value_and_grad(loss, has_aux=True)(p, scores)
      return buckets.run(branch, pmask, cmask)

    (_, (got_lp, got_ent)), got_g = switched(params)
    got_lp, got_ent = np.asarray(got_lp), np.asarray(got_ent)
    np.testing.assert_allclose(got_lp, np.asarray(want_lp), atol=2e-5)
    np.testing.assert_array_equal(got_lp[~c], 0.0)
    np.testing.assert_allclose(got_ent[c], np.asarray(want_ent)[c], atol=2e-5)
    for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=3e-5)


def test_metrics_report_the_bucket_run():
  prompts, pmask, comp, cmask = _rows(r=8, comp_lens=[9, 0, 4, 2, 6, 1, 3, 5])
  real = float(packing.row_lengths(pmask, cmask).sum()) / (8 * 16)
  for bin_rows in (1, 2):
    used = int(packing.plan(packing.row_lengths(pmask, cmask), bin_rows * 16).bins_used)
    fits, short = used * bin_rows / 8, (used - 1) * bin_rows / 8
    for buckets, slots in (((fits,), fits), ((short,), 1.0), ((short, fits), fits),
                           ((0.125, 0.9999), fits if used * bin_rows == 1 else 1.0)):
      m = packing.metrics(pmask, cmask, buckets=buckets, bin_rows=bin_rows)
      got = float(m["packed_slots"].sum / m["packed_slots"].denominator)
      if buckets == (0.125, 0.9999):  # 0.9999 has as many slots as the padded layout
        assert got == 1.0
        continue
      assert got == slots, (bin_rows, buckets, got)
      np.testing.assert_allclose(float(m["real_tokens"].sum / m["real_tokens"].denominator),
                                 real)


def test_buckets_are_validated():
  with pytest.raises(ValueError, match=r"fractions in \(0, 1\)"):
    packing.Buckets((0.5, 1.0))
  with pytest.raises(ValueError, match="bin_rows must be an int >= 1"):
    packing.Buckets((0.5,), 0)


def test_bucket_rows():
  assert packing.bucket_rows(8, (0.75, 0.25, 0.3)) == (2, 3, 6)
  assert packing.bucket_rows(8, (1.0,)) == ()
  assert packing.bucket_rows(8, (0.25, 0.5, 0.75), bin_rows=2) == (1, 2, 3)
  assert packing.bucket_rows(8, (0.9,), bin_rows=2) == ()  # 4 bins of 2 rows: the padded size
