"""Cross-check against an independent reference written in torch.

The reference below is a straightforward per-group / per-sequence / per-token Python loop that
follows the formulas of verl (``verl/trainer/ppo/core_algos.py``):

* ``compute_grpo_outcome_advantage``: unbiased std, ``(r - mean) / (std + eps)``;
* ``compute_policy_loss_vanilla``: clip low/high, dual clip ``clip_ratio_c``, log-ratio clamp
  [-20, 20];
* ``compute_policy_loss_gspo``: ``log s_{i,t} = logp - sg[logp] + sg[mean_t(logp - old)]``,
  clamped at 10;
* ``kl_penalty`` (0.9.1): ``kl`` (k1), ``mse`` (k2), ``low_var_kl`` (k3, clamped to [-10, 10]),
  ``abs``, and the straight-through ``k1+`` / ``k3+`` (the value with k2's gradient);
* ``compute_policy_loss_geo_mean`` (GMPO): the geometric mean of log-space-clipped token ratios;
* ``agg_loss``: ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum-norm`` with a
  constant length (TRL's ``dr_grpo`` normalisation).

It shares no code with rlpost, uses torch autograd (float64) for gradients, and downloads no
fixtures: all inputs are generated here from fixed seeds.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlpost.objectives as O
from objectives_testutil import make_batch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.oracle

F64 = torch.float64


# Reference implementation (torch, loops) ---------------------------------------------------------


def ref_grpo_advantages(rewards, group_id, valid, eps):
  by_group = {}
  for i in range(len(rewards)):
    if valid[i]:
      by_group.setdefault(int(group_id[i]), []).append(i)
  out = torch.zeros(len(rewards), dtype=F64)
  for members in by_group.values():
    scores = torch.tensor([float(rewards[i]) for i in members], dtype=F64)
    mean, std = torch.mean(scores), torch.std(scores)  # unbiased, as verl
    for j, i in enumerate(members):
      out[i] = (scores[j] - mean) / (std + eps)
  return out


def ref_kl(logp, ref, kind):
  base = kind[:-1] if kind.endswith("+") else kind
  if base == "k1":
    value = logp - ref
  elif base == "abs":
    value = (logp - ref).abs()
  elif base == "k2":
    value = 0.5 * (logp - ref) ** 2
  else:
    kl = torch.clamp(ref - logp, -20.0, 20.0)
    value = torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
  if not kind.endswith("+") or base == "k2":
    return value
  k2 = 0.5 * (logp - ref) ** 2  # verl 0.9.1: k2's gradient, the estimator's value
  return k2 - k2.detach() + value.detach()


def ref_geo_mean_rows(logp, old, adv, mask, *, eps_low, eps_high):
  """GMPO (verl ``compute_policy_loss_geo_mean``): one loss per sequence, in a list each."""
  out = []
  for i in range(logp.shape[0]):
    toks = [t for t in range(logp.shape[1]) if mask[i, t]]
    s = torch.sign(adv[i])
    m = []
    for t in toks:
      d = logp[i, t] - old[i, t]
      m.append(s * torch.minimum(s * d, s * torch.clamp(d, -eps_low, eps_high)))
    ratio = torch.exp(sum(m) / len(toks))
    out.append([-adv[i] * ratio])
  return out


def ref_token_losses(logp, old, adv, mask, *, ratio_kind, eps_low, eps_high, clip_c):
  """Per-sequence lists of per-token losses (python loops over sequences and tokens)."""
  out = []
  for i in range(logp.shape[0]):
    toks = [t for t in range(logp.shape[1]) if mask[i, t]]
    seq_kl = sum((logp[i, t] - old[i, t] for t in toks), torch.tensor(0.0, dtype=F64)) / max(
        len(toks), 1
    )
    row = []
    for t in toks:
      if ratio_kind == "token":
        log_r = torch.clamp(logp[i, t] - old[i, t], -20.0, 20.0)
      else:  # GSPO token form
        log_r = torch.clamp(logp[i, t] - logp[i, t].detach() + seq_kl.detach(), max=10.0)
      r = torch.exp(log_r)
      l1 = -adv[i] * r
      l2 = -adv[i] * torch.clamp(r, 1 - eps_low, 1 + eps_high)
      loss_t = torch.maximum(l1, l2)
      if clip_c is not None and adv[i] < 0:
        loss_t = torch.minimum(loss_t, -adv[i] * clip_c)
      row.append(loss_t)
    out.append(row)
  return out


def ref_aggregate(rows, mode, max_length=None):
  if mode == "token_mean":
    n = sum(len(r) for r in rows)
    return sum(sum(r) for r in rows) / n
  if mode == "seq_mean_token_mean":
    return sum(sum(r) / max(len(r), 1) for r in rows) / len(rows)
  return sum(sum(r) for r in rows) / (len(rows) * max_length)


def ref_loss(
    logp_np,
    old_np,
    ref_np,
    adv_np,
    mask_np,
    *,
    ratio_kind,
    eps_low,
    eps_high,
    clip_c,
    mode,
    max_length=None,
    kl_coef=0.0,
    kl_kind="k3",
):
  logp = torch.tensor(logp_np, dtype=F64, requires_grad=True)
  old = torch.tensor(old_np, dtype=F64)
  ref = torch.tensor(ref_np, dtype=F64)
  adv = torch.tensor(adv_np, dtype=F64)
  if ratio_kind == "geo_mean":
    rows = ref_geo_mean_rows(logp, old, adv, mask_np, eps_low=eps_low, eps_high=eps_high)
  else:
    rows = ref_token_losses(
        logp,
        old,
        adv,
        mask_np,
        ratio_kind=ratio_kind,
        eps_low=eps_low,
        eps_high=eps_high,
        clip_c=clip_c,
    )
  loss = ref_aggregate(rows, mode, max_length)
  if kl_coef:
    kl_rows = [
        [ref_kl(logp[i, t], ref[i, t], kl_kind) for t in range(logp.shape[1]) if mask_np[i, t]]
        for i in range(logp.shape[0])
    ]
    loss = loss + kl_coef * ref_aggregate(kl_rows, mode, max_length)
  loss.backward()
  return float(loss.detach()), logp.grad.numpy()


# Inputs ------------------------------------------------------------------------------------------


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  groups = [[1, 0, 0.5], [0, 0, 1, 1, 0.5], [1, 1, 1, 1], [0.5, 0]]
  b = make_batch(groups, 5, seq_len=5, seed=seed)
  valid = np.asarray(b.valid)
  # Keep only real rollouts for the loss cross-check (the reference has no padding rows).
  idx = np.flatnonzero(valid)
  logp = np.asarray(b.current_logp)[idx] + 0.4 * rng.normal(size=(len(idx), 5)).astype(np.float32)
  return b, idx, logp.astype(np.float32)


@pytest.mark.parametrize("eps", [1e-6, 1e-4])
def test_grpo_advantages_match_reference(eps):
  b, _, _ = _inputs()
  adv, _ = jax.jit(
      lambda x: O.compute_advantages(
          O.chain(O.center_by_group_mean(), O.scale_by_group_std(ddof=1, eps=eps)), x
      )
  )(b)
  want = ref_grpo_advantages(
      np.asarray(b.rewards), np.asarray(b.group_id), np.asarray(b.valid), eps
  )
  np.testing.assert_allclose(
      np.asarray(adv.values)[np.asarray(b.valid)],
      want.numpy()[np.asarray(b.valid)],
      rtol=1e-5,
      atol=1e-6,
  )


LOSS_CASES = {
    # name: (PolicyLossConfig, reference kwargs)
    "ppo_vanilla_seq_mean": (
        O.PolicyLossConfig(
            eps_low=0.2, eps_high=0.2, dual_clip=3.0, aggregation="seq_mean_token_mean"
        ),
        dict(ratio_kind="token", eps_low=0.2, eps_high=0.2, clip_c=3.0, mode="seq_mean_token_mean"),
    ),
    "dapo_token_mean": (
        O.PolicyLossConfig(eps_low=0.2, eps_high=0.28, dual_clip=3.0, aggregation="token_mean"),
        dict(ratio_kind="token", eps_low=0.2, eps_high=0.28, clip_c=3.0, mode="token_mean"),
    ),
    "dr_grpo_const_len": (
        O.PolicyLossConfig(aggregation="seq_sum_const_len", max_length=7),
        dict(
            ratio_kind="token",
            eps_low=0.2,
            eps_high=0.2,
            clip_c=None,
            mode="seq_sum_const_len",
            max_length=7,
        ),
    ),
    "gspo_token": (
        O.PolicyLossConfig(ratio="sequence_token", eps_low=3e-4, eps_high=4e-4),
        dict(
            ratio_kind="gspo", eps_low=3e-4, eps_high=4e-4, clip_c=None, mode="seq_mean_token_mean"
        ),
    ),
    "gspo_sequence": (
        O.PolicyLossConfig(ratio="sequence", eps_low=0.04, eps_high=0.03),
        dict(
            ratio_kind="gspo", eps_low=0.04, eps_high=0.03, clip_c=None, mode="seq_mean_token_mean"
        ),
    ),
    "grpo_k1": (
        O.PolicyLossConfig(kl_coef=0.1, kl_estimator="k1"),
        dict(
            ratio_kind="token",
            eps_low=0.2,
            eps_high=0.2,
            clip_c=None,
            mode="seq_mean_token_mean",
            kl_coef=0.1,
            kl_kind="k1",
        ),
    ),
    "grpo_k2_token_mean": (
        O.PolicyLossConfig(kl_coef=0.1, kl_estimator="k2", aggregation="token_mean"),
        dict(
            ratio_kind="token",
            eps_low=0.2,
            eps_high=0.2,
            clip_c=None,
            mode="token_mean",
            kl_coef=0.1,
            kl_kind="k2",
        ),
    ),
    "gmpo": (
        O.get_recipe("gmpo").loss_config,
        dict(ratio_kind="geo_mean", eps_low=0.4, eps_high=0.4, clip_c=None,
             mode="seq_mean_token_mean"),
    ),
    **{
        f"grpo_{kind}": (
            O.PolicyLossConfig(kl_coef=0.1, kl_estimator=kind),
            dict(ratio_kind="token", eps_low=0.2, eps_high=0.2, clip_c=None,
                 mode="seq_mean_token_mean", kl_coef=0.1, kl_kind=kind),
        )
        for kind in ("abs", "k1+", "k3+")
    },
    "grpo_k3": (
        O.PolicyLossConfig(kl_coef=0.04, kl_estimator="k3"),
        dict(
            ratio_kind="token",
            eps_low=0.2,
            eps_high=0.2,
            clip_c=None,
            mode="seq_mean_token_mean",
            kl_coef=0.04,
            kl_kind="k3",
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(LOSS_CASES))
def test_policy_losses_match_reference(name):
  cfg, ref_kwargs = LOSS_CASES[name]
  b, idx, logp = _inputs(seed=1)
  sub = jax.tree.map(lambda x: x[idx], b)
  adv = np.random.default_rng(5).normal(size=len(idx)).astype(np.float32)
  adv[0] = -2.5  # exercise the dual clip with a large ratio below
  logp = logp.copy()
  mask = np.asarray(sub.token_mask)
  logp[0, 0] = np.asarray(sub.current_logp)[0, 0] + 1.5  # ratio ~4.5 > c = 3

  def f(lp):
    parts, _ = O.policy_loss(lp, sub, jnp.asarray(adv), jnp.ones(len(idx)), config=cfg)
    return O.finalize(parts)

  value, grad = jax.jit(jax.value_and_grad(f))(jnp.asarray(logp))
  want_v, want_g = ref_loss(
      logp, np.asarray(sub.current_logp), np.asarray(sub.ref_logp), adv, mask, **ref_kwargs
  )
  np.testing.assert_allclose(value, want_v, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(np.where(mask, grad, 0), want_g, rtol=2e-4, atol=1e-6)
