"""The averaging experiments' language and model: an order-2 Markov language and a small decoder.

Shape legend: V vocabulary (64), T sequence length (64), B batch, E hidden size, F MLP width,
H heads, R runs trained side by side (vmapped).

Language: x_0, x_1 uniform, then x_t ~ P(. | x_{t-2}, x_{t-1}) with each of the V^2 rows of the
[V, V, V] table drawn from Dirichlet(alpha). Its entropy floor is the entropy rate
H = sum_{a,b} pi(a, b) H(P(. | a, b)) under the stationary distribution pi of the pair chain.
Evaluation uses the exact excess loss: the mean over held-out positions t >= 2 of
KL(P(. | x_{t-2}, x_{t-1}) || model(. | x_{<t})), which is the cross-entropy minus the floor
without the sampling noise of the targets, and the expected next-token accuracy, the mean of
P(argmax of the model | x_{t-2}, x_{t-1}), likewise exact.

Model: pre-norm decoder with learned positions and a token-shift path (the embedding of the
previous token is added at each position, as in RWKV), so the two tokens that determine the next
one meet at the same position from step one; without it a 2-layer d=64 decoder sat at the
uniform loss for hundreds of steps on this language. Parameters are a plain dict (vmappable).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Language(NamedTuple):
  table: np.ndarray  # [V, V, V] float64, P(next | a, b)
  entropy_floor: float  # nats per token at positions t >= 2 (stationary)


def make_language(vocab: int = 64, *, scale: float = 2.0, interaction: float = 0.5,
                  seed: int = 0) -> Language:
  """P(. | a, b) = softmax(scale * (G[a] + H[b] + interaction * I[a, b])), G, H, I ~ N(0, 1)."""
  rng = np.random.default_rng(seed)
  g, h = rng.normal(size=(vocab, 1, vocab)), rng.normal(size=(1, vocab, vocab))
  logits = scale * (g + h + interaction * rng.normal(size=(vocab, vocab, vocab)))
  table = np.exp(logits - logits.max(-1, keepdims=True))
  table /= table.sum(-1, keepdims=True)
  # Stationary distribution of the pair chain (a, b) -> (b, c) by power iteration.
  pi = np.full((vocab, vocab), 1.0 / vocab ** 2)
  for _ in range(500):
    new = np.einsum("ab,abc->bc", pi, table)
    if np.abs(new - pi).sum() < 1e-13:
      pi = new
      break
    pi = new
  ent = -(table * np.log(table)).sum(-1)
  return Language(table, float((pi * ent).sum()))


def sample(lang: Language, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
  """[n, length] int32 sequences."""
  v = lang.table.shape[0]
  cdf = np.cumsum(lang.table, -1)
  x = np.zeros((n, length), np.int32)
  x[:, :2] = rng.integers(0, v, size=(n, 2))
  for t in range(2, length):
    u = rng.random(n)[:, None]
    x[:, t] = np.minimum((u > cdf[x[:, t - 2], x[:, t - 1]]).sum(-1), v - 1)
  return x


class ModelConfig(NamedTuple):
  vocab: int = 64
  seq_len: int = 64
  hidden: int = 64
  heads: int = 4
  layers: int = 2
  mlp: int = 128
  token_shift: bool = True


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
  e, f, v = cfg.hidden, cfg.mlp, cfg.vocab
  ks = iter(jax.random.split(key, 4 + 4 * cfg.layers))
  normal = lambda k, shape, std: std * jax.random.normal(k, shape, jnp.float32)
  p = {"emb": normal(next(ks), (v, e), 0.02),
       "pos": normal(next(ks), (cfg.seq_len, e), 0.01),
       "head": normal(next(ks), (e, v), 1.0 / math.sqrt(e)),
       "norm_f": jnp.ones((e,))}
  if cfg.token_shift:
    p["emb_prev"] = normal(next(ks), (v, e), 0.02)
  for i in range(cfg.layers):
    p[f"layer{i}"] = {
        "norm1": jnp.ones((e,)), "norm2": jnp.ones((e,)),
        "qkv": normal(next(ks), (e, 3 * e), 1.0 / math.sqrt(e)),
        "out": normal(next(ks), (e, e), 1.0 / math.sqrt(e) / math.sqrt(2 * cfg.layers)),
        "up": normal(next(ks), (e, f), 1.0 / math.sqrt(e)),
        "down": normal(next(ks), (f, e), 1.0 / math.sqrt(f) / math.sqrt(2 * cfg.layers)),
    }
  return p


def _rms(x, scale):
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def logits_fn(cfg: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
  """x [B, T] int -> logits [B, T, V] (position t predicts x_{t+1})."""
  b, t = x.shape
  h = p["emb"][x] + p["pos"][:t]
  if cfg.token_shift:
    prev = jnp.pad(x[:, :-1], ((0, 0), (1, 0)))
    h = h + p["emb_prev"][prev] * (jnp.arange(t) > 0)[None, :, None]
  hd = cfg.hidden // cfg.heads
  causal = jnp.tril(jnp.ones((t, t), bool))
  for i in range(cfg.layers):
    lp = p[f"layer{i}"]
    q, k, v = jnp.split(_rms(h, lp["norm1"]) @ lp["qkv"], 3, axis=-1)
    q, k, v = (z.reshape(b, t, cfg.heads, hd) for z in (q, k, v))
    att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
    att = jax.nn.softmax(jnp.where(causal, att, -1e9), -1)
    h = h + jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, cfg.hidden) @ lp["out"]
    h = h + jax.nn.gelu(_rms(h, lp["norm2"]) @ lp["up"]) @ lp["down"]
  return _rms(h, p["norm_f"]) @ p["head"]


def train_loss(cfg: ModelConfig, p: dict, x: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy over positions t >= 2 (where the language is order 2)."""
  logp = jax.nn.log_softmax(logits_fn(cfg, p, x[:, :-1]), -1)
  nll = -jnp.take_along_axis(logp, x[:, 1:, None], -1)[..., 0]
  return jnp.mean(nll[:, 1:])


def excess_loss(cfg: ModelConfig, p: dict, x: jax.Array, true_next: jax.Array) -> jax.Array:
  """Mean KL(P_true || model) in nats over positions t >= 2. true_next: [B, T-2, V] P(x_t | .)."""
  logp = jax.nn.log_softmax(logits_fn(cfg, p, x[:, :-1]), -1)[:, 1:]
  kl = jnp.sum(true_next * (jnp.log(jnp.maximum(true_next, 1e-30)) - logp), -1)
  return jnp.mean(kl)


def expected_accuracy(cfg: ModelConfig, p: dict, x: jax.Array,
                      true_next: jax.Array) -> jax.Array:
  """Mean over positions t >= 2 of P_true(argmax of the model's next-token distribution): the
  next-token accuracy in expectation over the targets (exact, like ``excess_loss``)."""
  guess = jnp.argmax(logits_fn(cfg, p, x[:, :-1])[:, 1:], -1)
  return jnp.mean(jnp.take_along_axis(true_next, guess[..., None], -1)[..., 0])


def bayes_accuracy(true_next: np.ndarray) -> float:
  """The ceiling of ``expected_accuracy``: the mean over positions of max P_true."""
  return float(np.mean(np.max(true_next, -1)))


def true_next_probs(lang: Language, x: np.ndarray) -> np.ndarray:
  """[B, T-2, V] float32 P(x_t | x_{t-2}, x_{t-1}) for t = 2..T-1."""
  return lang.table[x[:, :-2], x[:, 1:-1]].astype(np.float32)


def num_params(p: dict) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(p)))
