"""LoRA: low-rank adapters on the model's projections, trained with the base weights frozen.

An adapted projection computes ``y = x W (+ bias) + scale * (x A) B`` with ``A`` [din, r],
``B`` [r, dout] and ``scale = alpha / r`` (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models", arXiv:2106.09685; the alpha / r scaling and the initialisation are PEFT's:
``A`` uniform in +-1/sqrt(din), i.e. ``kaiming_uniform_(a=sqrt(5))``, and ``B`` zero, so a fresh
adapter changes nothing). The adapter is flax's own ``nnx.LoRA`` module (its parameters are
``nnx.LoRAParam`` variables, a subclass of ``nnx.Param``, named ``lora_a`` and ``lora_b``) with
the alpha / r scale added; ``apply`` attaches one as the attribute ``lora`` of every targeted
``nnx.Linear``, and ``rlpost.models.transformer._linear`` adds its output to the linear's.

    model = lora.apply(model, lora.LoraConfig(rank=8, alpha=16.0))
    mask = lora.trainable_mask(nnx.state(model))      # True exactly at the LoRAParam leaves
    merged = lora.merge(model)                        # W + scale * A @ B; adapters dropped

Training (``rlpost.train``): the parameters are split by ``trainable_mask`` into the adapters and
the frozen rest (``partition`` / ``combine``); gradients are taken with respect to the adapters
alone (the rest enters the loss through ``jax.lax.stop_gradient``, so XLA computes no weight
gradient for it) and the optimizer is initialised on the adapters alone, so its state holds
nothing for the base weights. The reference policy of a KL term is the adapted model at step 0,
whose zero ``B`` makes it exactly the base model.

Merging and averaging: ``merge_params`` folds every adapter into its kernel (in float32, cast
back to the kernel's dtype). Weight averages of LoRA runs are averages of the merged weights
``W + scale * A_i B_i``, never of the factors: ``A B`` is bilinear, so the product of averaged
factors is not the average of the products (``mean(A_i) mean(B_i) != mean(A_i B_i)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# The projections of ``rlpost.models.transformer`` (every model family keeps these names).
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION + MLP + ("lm_head",)
DEFAULT_TARGETS = ATTENTION + MLP
ADAPTER = "lora"  # the attribute of an adapted nnx.Linear that holds its adapter

# PEFT's A initialisation: kaiming_uniform_(a=sqrt(5)) over fan_in = din, i.e. uniform in
# [-1/sqrt(din), 1/sqrt(din)] (variance 1 / (3 din)).
A_INIT = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Attributes:
    rank: r >= 1, the adapters' inner dimension.
    alpha: > 0; the adapter output is scaled by alpha / rank.
    targets: names of the projections to adapt (a subset of ``TARGETS``), in every layer.
    seed: seed of the A initialisation.
  """

  rank: int
  alpha: float = 16.0
  targets: tuple[str, ...] = DEFAULT_TARGETS
  seed: int = 0

  def __post_init__(self):
    if isinstance(self.targets, str):
      object.__setattr__(self, "targets", parse_targets(self.targets))
    object.__setattr__(self, "targets", tuple(self.targets))
    if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
      raise ValueError(f"LoRA rank must be an int >= 1, got {self.rank!r}")
    if not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
      raise ValueError(f"LoRA alpha must be a number > 0, got {self.alpha!r}")
    if not self.targets:
      raise ValueError(f"LoRA targets must name at least one projection of {list(TARGETS)}")
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown:
      raise ValueError(f"unknown LoRA target(s) {unknown}; known projections: {list(TARGETS)}")
    if len(set(self.targets)) != len(self.targets):
      raise ValueError(f"LoRA targets repeat a projection: {list(self.targets)}")

  @property
  def scale(self) -> float:
    return float(self.alpha) / self.rank


def parse_targets(text: str) -> tuple[str, ...]:
  """"q_proj, v_proj" -> ("q_proj", "v_proj") (comma-separated, blanks ignored)."""
  return tuple(t.strip() for t in text.split(",") if t.strip())


class Adapter(nnx.LoRA):
  """flax's ``nnx.LoRA`` (``x @ lora_a @ lora_b`` in the compute dtype) times ``scale``.

  ``lora_a`` [din, r] is PEFT-initialised (``A_INIT``), ``lora_b`` [r, dout] zero, both
  ``nnx.LoRAParam`` in ``param_dtype``.
  """

  def __init__(self, din: int, rank: int, dout: int, *, scale: float, dtype, param_dtype,
               rngs: nnx.Rngs):
    super().__init__(din, rank, dout, dtype=dtype, param_dtype=param_dtype, a_initializer=A_INIT,
                     rngs=rngs)
    self.scale = float(scale)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = super().__call__(x)
    return y * jnp.asarray(self.scale, y.dtype)


def _targeted(model: nnx.Module, targets) -> list[tuple[tuple, nnx.Linear]]:
  """(path, layer) of every nnx.Linear whose attribute name is in ``targets``, in graph order."""
  return [(path, m) for path, m in nnx.iter_graph(model)
          if isinstance(m, nnx.Linear) and path and path[-1] in targets]


def apply(model: nnx.Module, cfg: LoraConfig) -> nnx.Module:
  """Attach a fresh adapter (B = 0: the model's outputs are unchanged) to every targeted
  ``nnx.Linear`` of ``model``, in place; returns ``model``.

  Every layer gets the same adapters, so the layers keep one graph structure (the scan of
  ``Transformer.hidden(remat=True)`` needs that); layers stored stacked get the same adapters
  stacked ([L, din, r] and [L, r, dout]). Raises ValueError if a target matches no linear
  (``lm_head`` of a model with tied embeddings) or the model already has adapters.
  """
  found = _targeted(model, cfg.targets)
  missing = sorted(set(cfg.targets) - {path[-1] for path, _ in found})
  if missing:
    raise ValueError(f"LoRA target(s) {missing} match no nnx.Linear of the model (an lm_head "
                     "tied to the embedding has none)")
  for path, layer in found:
    if getattr(layer, ADAPTER, None) is not None:
      raise ValueError(f"{'/'.join(map(str, path))} already has a LoRA adapter")

  def make(layer: nnx.Linear, rngs: nnx.Rngs) -> Adapter:
    return Adapter(layer.in_features, cfg.rank, layer.out_features, scale=cfg.scale,
                   dtype=layer.dtype, param_dtype=layer.param_dtype, rngs=rngs)

  # Adapters draw from one key sequence in the order of the layers stored one by one (layer by
  # layer, each layer's projections in graph order), so layers stored stacked, whose
  # projections are one [L, ...] linear each, get exactly the same adapters, stacked.
  rngs = nnx.Rngs(cfg.seed)
  stacked = [layer for _, layer in found if layer.kernel.ndim == 3]
  for _, layer in found:
    if layer.kernel.ndim != 3:
      setattr(layer, ADAPTER, make(layer, rngs))
    elif layer is stacked[0]:
      per_layer = [[nnx.split(make(linear, rngs)) for linear in stacked]
                   for _ in range(layer.kernel.shape[0])]
      for j, linear in enumerate(stacked):
        graphdef = per_layer[0][j][0]
        setattr(linear, ADAPTER, nnx.merge(graphdef, jax.tree.map(
            lambda *xs: jnp.stack(xs), *[adapters[j][1] for adapters in per_layer])))
  return model


def _fold(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """W + scale * A @ B in float32, in W's dtype."""
  w = kernel.astype(jnp.float32) + scale * (a.astype(jnp.float32) @ b.astype(jnp.float32))
  return w.astype(kernel.dtype)


def merge(model: nnx.Module) -> nnx.Module:
  """Fold every adapter of ``model`` into its kernel and remove it, in place; returns
  ``model`` (now an ordinary model, e.g. for ``hf.save_pretrained``)."""
  for _, layer in list(nnx.iter_graph(model)):
    adapter = getattr(layer, ADAPTER, None) if isinstance(layer, nnx.Linear) else None
    if adapter is not None:
      layer.kernel[...] = _fold(layer.kernel[...], adapter.lora_a[...], adapter.lora_b[...],
                                adapter.scale)
      delattr(layer, ADAPTER)
  return model


def merge_params(params: nnx.State, *, scale: float, keep_adapters: bool = False) -> nnx.State:
  """The parameters with every adapter folded into its kernel (a pure function).

  params: the state of an adapted model (``nnx.split``), any nesting; each ``.../lora/lora_a``
    and ``.../lora/lora_b`` pair is folded into the sibling ``.../kernel`` as
    ``W + scale * A @ B``.
  scale: the adapters' alpha / rank (``LoraConfig.scale``); the state does not hold it.
  keep_adapters: False drops the adapters (the state of the base model's graph); True keeps
    them with ``B`` set to zero, so the tree keeps its structure (and its graph) and computes
    the merged weights' function exactly.
  """
  flat = dict(nnx.to_flat_state(params))
  out = {}
  for path, v in flat.items():
    if len(path) >= 2 and path[-2] == ADAPTER:
      if keep_adapters:
        out[path] = v.replace(jnp.zeros_like(v[...])) if path[-1] == "lora_b" else v
      continue
    if path[-1] == "kernel" and path[:-1] + (ADAPTER, "lora_a") in flat:
      a = flat[path[:-1] + (ADAPTER, "lora_a")][...]
      b = flat[path[:-1] + (ADAPTER, "lora_b")][...]
      v = v.replace(_fold(v[...], a, b, scale))
    out[path] = v
  return nnx.from_flat_state(out)


def trainable_mask(params: Any) -> Any:
  """A tree of bools, a prefix of ``params``: True at each ``nnx.LoRAParam`` variable."""
  return jax.tree.map(lambda v: isinstance(v, nnx.LoRAParam), params,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def partition(params: Any, mask: Any) -> tuple[Any, Any]:
  """(selected, rest): ``params`` with the subtrees where ``mask`` is False (resp. True)
  replaced by None. ``combine`` inverts it."""
  def pick(keep: bool):
    return jax.tree.map(lambda m, v: v if m == keep else None, mask, params)

  return pick(True), pick(False)


def combine(selected: Any, rest: Any) -> Any:
  """The tree of ``partition``'s two halves."""
  return jax.tree.map(lambda a, b: b if a is None else a, selected, rest,
                      is_leaf=lambda x: x is None or isinstance(x, nnx.Variable))


def count(params: Any) -> tuple[int, int]:
  """(all parameters, adapter parameters) of a parameter state."""
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
  return size(params), size(partition(params, trainable_mask(params))[0])
