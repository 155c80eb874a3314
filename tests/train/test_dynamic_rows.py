"""Rows a dynamic allocation did not sample (``Allocation.live``): the update orders the live
rows first, splits them evenly over the mini-batches, and runs no model pass for micro-batches
without a valid row (DARS's chunked stage 2 through the trainer: tests/train/test_rl.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from rl_testutil import max_update_gap

from rlpost import objectives as obj
from rlpost.models.packing import Buckets
from rlpost.train.update import make_update, row_chunks
from rlpost.types import RolloutBatch

B, T, V = 16, 3, 5


def run_update(valid: np.ndarray, live: np.ndarray | None, *, minibatches: int, accum: int,
               packing=None):
  """One epoch of the DARS recipe's update of a unigram policy over V tokens on B rows in
  groups of 4 (rewards mixed in every group; rows off ``valid`` invalid). Returns (start,
  params, stats, rows of each forward pass that ran)."""
  calls = []

  def policy_logp(params, prompts, pmask, tokens, tmask, *, entropy=False, num_bins=None):
    jax.debug.callback(lambda: calls.append(tokens.shape[0]))
    lp = jax.nn.log_softmax(params["w"])
    ent = jnp.broadcast_to(-jnp.sum(jnp.exp(lp) * lp), tokens.shape) if entropy else None
    return lp[tokens], ent

  r = np.arange(B)
  tokens = jnp.asarray((r[:, None] + np.arange(T)) % V, jnp.int32)
  batch = RolloutBatch(
      group_id=jnp.asarray(r // 4, jnp.int32), valid=jnp.asarray(valid), tokens=tokens,
      token_mask=jnp.ones((B, T), bool), rewards=jnp.asarray(r % 2, jnp.float32),
      behaviour_logp=jax.nn.log_softmax(jnp.linspace(-1, 1, V))[tokens],
      correct=jnp.asarray(r % 2 == 1))
  recipe = obj.get_recipe("dars", max_length=T)
  adv, _ = obj.compute_advantages(recipe.advantage, batch, recipe.advantage.init(),
                                  key=jax.random.key(0))
  opt = optax.sgd(0.5)
  upd = make_update(recipe=recipe, optimizer=opt, policy_logp=policy_logp, num_iterations=1,
                    num_minibatches=minibatches, grad_accum=accum, packing=packing)
  p0 = {"w": jnp.linspace(-1, 1, V)}
  z = jnp.zeros((B, 1), jnp.int32)
  params, _, stats = jax.jit(upd)(p0, opt.init(p0), batch, z, z > 0, adv._replace(metrics=None),
                                  jax.random.key(1), None if live is None else jnp.asarray(live))
  jax.effects_barrier()
  return p0, params, jax.device_get(stats), calls


def test_micro_batches_without_a_valid_row_run_no_model_pass():
  live = np.arange(B) < 8  # the last 8 rows were not sampled (so are invalid)
  p0, ref, s_ref, dense = run_update(live, None, minibatches=1, accum=4)
  _, got, s_got, skipped = run_update(live, live, minibatches=1, accum=4)
  assert dense == [4] * 4 and skipped == [4] * 2  # 2 of the 4 micro-batches hold live rows
  # The same batch: another program (other micro-batch contents), so a tolerance.
  gap, moved = max_update_gap(got, ref, p0)
  assert moved > 1e-3 and gap <= 1e-6, (gap, moved)
  np.testing.assert_allclose(s_got["loss"], s_ref["loss"], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(s_got["grad_norm"], s_ref["grad_norm"], rtol=1e-6)


def test_skipped_micro_batches_count_no_computed_slots():
  """With the padding-free update's metrics, a micro-batch that ran no pass adds no computed
  slot and no real token: half the micro-batches run, half the slots are counted."""
  live = np.arange(B) < 8
  _, _, dense, _ = run_update(live, None, minibatches=1, accum=4, packing=Buckets((0.5,)))
  _, _, skipped, calls = run_update(live, live, minibatches=1, accum=4, packing=Buckets((0.5,)))
  assert len(calls) == 2 and dense["packed_slots"] > 0 and dense["real_tokens"] > 0
  np.testing.assert_allclose(skipped["packed_slots"], dense["packed_slots"] / 2, rtol=1e-6)
  np.testing.assert_allclose(skipped["real_tokens"], dense["real_tokens"] / 2, rtol=1e-6)
  np.testing.assert_allclose(skipped["loss"], dense["loss"], rtol=1e-6, atol=1e-7)


def test_live_rows_split_evenly_over_the_mini_batches():
  # 6 live rows, 2 mini-batches of 4 micro-batches of 2 rows: 3 live rows lead each
  # mini-batch, so 2 micro-batches run in each (4 in all; 6 + 0 would run 3).
  live = np.arange(B) < 6
  _, params, stats, calls = run_update(live, live, minibatches=2, accum=4)
  assert calls == [2] * 4, calls
  assert np.all(np.isfinite(params["w"])) and stats["grad_norm"] > 0


def test_row_chunks_skip_chunks_without_a_live_row():
  runs = []

  def fn(r):
    jax.debug.callback(lambda: runs.append(1))
    return r.astype(jnp.float32) + 1

  live = jnp.arange(8) < 3
  out = jax.jit(lambda lv: row_chunks(fn, 8, 2, lv))(live)
  jax.effects_barrier()
  np.testing.assert_array_equal(out, [1, 2, 3, 4, 0, 0, 0, 0])
  assert len(runs) == 2
