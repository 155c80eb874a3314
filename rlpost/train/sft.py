"""Supervised warm start on task demonstrations.

Each example is ``BOS prompt demo EOS`` (right-padded to L); the loss is next-token cross-entropy
on the demonstration and its EOS only. The result is the policy every RL run starts from; it is
cached on disk under a key derived from everything that determines it, so experiments reuse it.
Training shows a progress bar with ETA (``rlpost.progress``) unless ``progress=False``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlpost import progress as progress_lib
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from rlpost.tokenizer import CharTokenizer
from rlpost.train import checkpoint


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 250
  batch_size: int = 256
  lr: float = 1e-3
  warmup: int = 20
  weight_decay: float = 0.0
  seed: int = 0
  # weight averages evaluated beside the raw weights on held-out demonstrations,
  # e.g. "lawa:k=5,every=20;ema:decay=0.99" (see rlpost.averaging.parse_specs)
  averaging: str = ""


def make_examples(records: Sequence[dict], tok: CharTokenizer, length: int | None = None):
  """[N, L] int32 tokens and [N, L] bool loss mask (True where the *target* is demo or EOS).

  The mask is aligned with the targets: entry t says whether token t is supervised, so the
  prediction made at position t-1 is scored.
  """
  seqs, masks = [], []
  for i, r in enumerate(records):
    try:
      p = tok.encode(r["prompt"], bos=True)
      d = tok.encode(r["demo"], eos=True)
    except (KeyError, ValueError) as e:
      raise ValueError(f"SFT example {i}: {e}") from None
    seqs.append(p + d)
    masks.append([False] * len(p) + [True] * len(d))
  longest = max(len(s) for s in seqs)
  length = length or longest
  if longest > length:
    raise ValueError(f"an SFT example has {longest} tokens, more than the length {length}")
  tokens = np.zeros((len(seqs), length), np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, (s, m) in enumerate(zip(seqs, masks)):
    tokens[i, :len(s)] = s
    mask[i, :len(m)] = m
  return tokens, mask


def sft_loss(model: tfm.Transformer, tokens: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy over supervised targets. tokens, loss_mask: [B, L]."""
  valid = tokens != 0
  valid = valid.at[:, 0].set(True)
  logits = scoring.forward(model, tokens, valid)[:, :-1]
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)[..., 0]
  m = loss_mask[:, 1:]
  return -jnp.sum(jnp.where(m, logp, 0.0)) / jnp.maximum(jnp.sum(m), 1)


def train_sft(model: tfm.Transformer, records: Sequence[dict], tok: CharTokenizer, cfg: SFTConfig,
              *, log_every: int = 50, log=print, eval_records: Sequence[dict] | None = None,
              progress: bool = True) -> tuple[nnx.State, list]:
  """Train ``model`` in place on demonstrations; returns (params, history).

  history holds the training loss at each log step, or, with ``eval_records``, dicts with the
  held-out loss of the raw weights and of each average named in ``cfg.averaging``. Those are
  logged above a progress bar over the steps (``progress``).
  """
  tokens, mask = make_examples(records, tok)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  n = tokens.shape[0]
  bs = min(cfg.batch_size, n)
  sched = optax.warmup_constant_schedule(0.0, cfg.lr, max(cfg.warmup, 1))
  opt = optax.chain(optax.clip_by_global_norm(1.0),
                    optax.adamw(sched, weight_decay=cfg.weight_decay))
  graphdef, params = nnx.split(model)
  opt_state = opt.init(params)
  key = jax.random.key(cfg.seed)

  @jax.jit
  def step(params, opt_state, i):
    epoch, pos = (i * bs) // n, (i * bs) % n
    perm = jax.random.permutation(jax.random.fold_in(key, epoch), n)
    idx = jax.lax.dynamic_slice(jnp.concatenate([perm, perm]), (pos,), (bs,))

    def loss_fn(p):
      return sft_loss(nnx.merge(graphdef, p), tokens[idx], mask[idx])

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  tracker = None
  if cfg.averaging:
    from rlpost import averaging

    tracker = averaging.Tracker(cfg.averaging, params)
  if eval_records is not None:
    ev_tokens, ev_mask = (jnp.asarray(x) for x in make_examples(eval_records, tok))
    eval_loss = jax.jit(lambda p: sft_loss(nnx.merge(graphdef, p), ev_tokens, ev_mask))
  history = []
  with progress_lib.bar(total=cfg.steps, desc="sft", unit="step", disable=not progress) as bar:
    for i in range(cfg.steps):
      params, opt_state, loss = step(params, opt_state, jnp.int32(i))
      if tracker is not None:
        tracker.update(params)
      if progress:  # the bar's rate and ETA follow the computation, not the dispatch
        loss.block_until_ready()
      bar.update(1)
      if (i + 1) % log_every == 0 or i == cfg.steps - 1:
        loss = float(loss)
        if not np.isfinite(loss):
          raise FloatingPointError(f"SFT loss became {loss} at step {i + 1}")
        bar.set_postfix(loss=f"{loss:.4f}")
        if eval_records is None:
          history.append(loss)
          rec = {"loss": loss}
        else:
          rec = {"step": i + 1, "train_loss": loss, "eval_loss": float(eval_loss(params))}
          if tracker is not None:
            rec.update(tracker.evaluate(lambda p: {"eval_loss": float(eval_loss(p))}, params))
          history.append(rec)
        progress_lib.message(bar, log, f"sft step {i + 1}/{cfg.steps}: " + ", ".join(
            f"{k} {v:.4f}" for k, v in rec.items() if k != "step"))
  nnx.update(model, params)
  return params, history


def cache_key(*parts) -> str:
  """Stable hash of JSON-able parts (configs, dataset identity)."""
  blob = json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts],
                    sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_sft(model: tfm.Transformer, records: Sequence[dict], tok: CharTokenizer, cfg: SFTConfig,
               cache_dir: str, key: str, *, log=print, progress: bool = True) -> nnx.State:
  """Load the SFT policy from ``cache_dir/key`` if present, else train and save it there."""
  path = os.path.join(cache_dir, f"sft-{key}")
  like = nnx.state(model)
  if os.path.isdir(path):
    params = checkpoint.load_params(path, like)
    nnx.update(model, params)
    log(f"reusing cached SFT policy {path}")
    return params
  params, _ = train_sft(model, records, tok, cfg, log=log, progress=progress)
  os.makedirs(cache_dir, exist_ok=True)
  checkpoint.save_params(path, params)
  log(f"saved SFT policy to {path}")
  return params
