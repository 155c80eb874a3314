"""Post-hoc averaging: a plan (which checkpoints, which weights), a streaming pass, a sink.

Shape legend: N planned items (checkpoints, or power-EMA snapshots); ``params`` any pytree.

A ``Plan`` lists items (a step, or a ``(step, profile)`` pair for power-EMA snapshots) and one
weight per item. ``average(load, plan)`` reads the items one at a time through ``load(item)`` (for
example ``CheckpointSource.load``, which restores parameters only, onto target shardings) and folds
each into a float32 ``StreamingMean``: memory is one accumulator whatever N is.

Plans:
  ``plan_lawa``         uniform over the k latest checkpoints at spacing nu (LAWA);
  ``plan_swa``          uniform over every checkpoint from a start step (SWA / uniform soup);
  ``plan_ema``          bias-corrected EMA weights over checkpoints from a start step;
  ``plan_mwa``          metric-weighted averaging over a selection (p = 0: uniform);
  ``plan_uniform``      uniform over any explicit selection (uniform soup, log-spaced windows);
  ``plan_posthoc_ema``  EDM2 least-squares reconstruction of a power-EMA width from snapshots.
``greedy_soup`` adds checkpoints in order of their own held-out score, keeping one only if the
score of the running average improves (Wortsman et al. 2022). ``lawa_trajectory`` yields the
LAWA average at every checkpoint with an O(1) sliding window.

Sinks: evaluate the returned parameters; ``checkpoints.write_params`` (new checkpoint, atomic);
``into_train_state`` (write back into training, optionally resetting the optimizer state).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np

from rlpost import progress as progress_lib
from rlpost.averaging import weights as W
from rlpost.averaging.streaming import SlidingWindowMean, StreamingMean

Params = Any


@dataclasses.dataclass(frozen=True)
class Plan:
  """What to average. ``normalize``: divide by the sum of weights (False for least squares)."""

  method: str
  items: tuple
  weights: tuple
  normalize: bool = True
  details: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if len(self.items) != len(self.weights):
      raise ValueError(f"plan has {len(self.items)} items but {len(self.weights)} weights")
    if not self.items:
      raise ValueError(f"{self.method}: the checkpoint selection is empty; nothing to average")

  def describe(self, limit: int = 12) -> str:
    pairs = [f"{_item_str(i)}:{w:.4g}" for i, w in zip(self.items, self.weights)]
    if len(pairs) > limit:
      pairs = pairs[:limit // 2] + ["..."] + pairs[-limit // 2:]
    hp = ", ".join(f"{k}={v}" for k, v in self.details.items())
    return (f"{self.method}({hp}): {len(self.items)} checkpoints, step:weight "
            f"{' '.join(pairs)}")

  def to_json(self) -> dict:
    return {"method": self.method, "items": [_item_json(i) for i in self.items],
            "weights": [float(w) for w in self.weights], "normalize": self.normalize,
            "details": self.details}


def _item_str(item) -> str:
  return "/".join(map(str, item)) if isinstance(item, tuple) else str(item)


def _item_json(item):
  return list(item) if isinstance(item, tuple) else item


def _plan(method, items, weights, normalize=True, **details) -> Plan:
  return Plan(method, tuple(items), tuple(float(w) for w in weights), normalize, details)


def plan_lawa(available: Sequence[int], k: int, *, every: int | None = None,
              end: int | None = None) -> Plan:
  steps = W.select_latest(available, k, every=every, end=end)
  return _plan("lawa", steps, W.uniform_weights(len(steps)), k=k, every=every, end=steps[-1])


def plan_swa(available: Sequence[int], *, start: int = 0, every: int | None = None,
             end: int | None = None) -> Plan:
  steps = W.select_from(available, start, every=every, end=end)
  return _plan("swa", steps, W.uniform_weights(len(steps)), start=start, every=every)


def plan_ema(available: Sequence[int], decay: float, *, start: int = 0, per: str = "checkpoint",
             end: int | None = None) -> Plan:
  steps = W.select_from(available, start, end=end)
  return _plan("ema", steps, W.ema_weights(steps, decay, per=per), decay=decay, per=per,
               start=start)


def plan_uniform(steps: Sequence[int], *, method: str = "uniform") -> Plan:
  steps = list(steps)
  return _plan(method, steps, W.uniform_weights(len(steps)) if steps else [])


def plan_mwa(steps: Sequence[int], penalty: float, *, metric: Sequence[float] | dict | None = None,
             weight_fn: W.WeightFn | str = "loss") -> Plan:
  """MWA over ``steps``. metric: [N] values or {step: value}; for ``weight_fn="step"`` the steps
  themselves are the metric and ``metric`` may be omitted."""
  steps = list(steps)
  if not steps:
    raise ValueError("mwa: the checkpoint selection is empty; nothing to average")
  if metric is None:
    if weight_fn != "step":
      raise ValueError("mwa needs a metric per checkpoint (e.g. the training loss)")
    metric = steps
  if isinstance(metric, dict):
    missing = [s for s in steps if s not in metric]
    if missing:
      raise ValueError(f"mwa: no metric recorded for steps {missing}")
    metric = [metric[s] for s in steps]
  w = W.mwa_weights(metric, penalty, weight_fn=weight_fn, steps=steps)
  name = weight_fn if isinstance(weight_fn, str) else getattr(weight_fn, "__name__", "custom")
  return _plan("mwa", steps, w, penalty=penalty, weight_fn=name)


def plan_posthoc_ema(snapshots: Sequence[tuple[int, Hashable]], gammas: dict,
                     target_sigma_rel: float, *, target_step: int | None = None,
                     exact: bool | None = None) -> Plan:
  """Least-squares power-EMA reconstruction.

  snapshots: [M] items (step, profile), each a stored power-EMA state.
  gammas: {profile: gamma} of each tracked profile (``weights.sigma_rel_to_gamma``).
  target_step: default the last snapshot step.
  """
  snapshots = [tuple(s) for s in snapshots]
  if not snapshots:
    raise ValueError("posthoc_ema: no snapshots to reconstruct from")
  unknown = sorted({p for _, p in snapshots} - set(gammas), key=str)
  if unknown:
    raise ValueError(f"posthoc_ema: no gamma given for profiles {unknown}")
  steps = [s for s, _ in snapshots]
  target_step = max(steps) if target_step is None else target_step
  x = W.posthoc_ema_weights(steps, [gammas[p] for _, p in snapshots], target_step,
                            target_sigma_rel, exact=exact)
  return _plan("posthoc_ema", snapshots, x, normalize=False, sigma_rel=target_sigma_rel,
               target_step=target_step)


# ----------------------------------------------------------------------------------- streaming
def average(load: Callable[[Hashable], Params], plan: Plan, *, check_finite: bool = True,
            progress: bool = False, skip_zero: bool = True) -> Params:
  """sum_i w_i load(item_i) (divided by sum_i w_i when ``plan.normalize``), streamed."""
  acc = None
  pairs = [(i, w) for i, w in zip(plan.items, plan.weights) if not (skip_zero and w == 0.0)]
  if not pairs:
    raise ValueError(f"{plan.method}: every weight is zero; nothing to average")
  bar = progress_lib.bar(pairs, desc=plan.method, disable=not progress, unit="ckpt")
  for item, w in bar:
    params = load(item)
    if acc is None:
      acc = StreamingMean(params, check_finite=check_finite)
    acc.add(params, w, step=_item_str(item))
  return acc.result(normalize=plan.normalize)


def greedy_soup(load: Callable[[Hashable], Params], items: Sequence[Hashable],
                score: Callable[[Params], float], *, check_finite: bool = True,
                progress: bool = False) -> tuple[Params, list, list[dict]]:
  """Greedy soup: rank items by their own score (higher is better), then add each to the running
  uniform average only if the average's score does not decrease. Returns (params, kept items,
  history of {"item", "score", "kept"})."""
  items = list(items)
  if not items:
    raise ValueError("greedy soup: the checkpoint selection is empty; nothing to average")
  solo = []
  for item in progress_lib.bar(items, desc="soup: rank", disable=not progress):
    solo.append(float(score(load(item))))
  order = [items[i] for i in np.argsort(-np.asarray(solo), kind="stable")]
  first = load(order[0])
  acc = StreamingMean(first, check_finite=check_finite)
  acc.add(first, 1.0, step=_item_str(order[0]))
  best = max(solo)
  kept, history = [order[0]], [{"item": _item_json(order[0]), "score": best, "kept": True}]
  for item in progress_lib.bar(order[1:], desc="soup: add", disable=not progress):
    params = load(item)
    acc.add(params, 1.0, step=_item_str(item))
    s = float(score(acc.result()))
    keep = s >= best
    if keep:
      best = s
      kept.append(item)
    else:
      acc.add(params, -1.0, step=_item_str(item))
    history.append({"item": _item_json(item), "score": s, "kept": keep})
  return acc.result(), kept, history


def lawa_trajectory(load: Callable[[Hashable], Params], steps: Sequence[int], k: int, *,
                    recompute_every: int = 64) -> Iterator[tuple[int, int, Params]]:
  """Yield (step, window size, LAWA mean of the <= k latest checkpoints) for each step in order,
  with one new read and one re-read per step (``SlidingWindowMean``)."""
  window = SlidingWindowMean(k, load, recompute_every=recompute_every)
  for step in steps:
    window.push(step)
    yield step, len(window.window), window.mean()


# ---------------------------------------------------------------------------------------- sinks
def into_train_state(state: Any, params: Params, *, optimizer: Any = None,
                     params_field: str = "params", opt_field: str = "opt_state") -> Any:
  """Write averaged ``params`` back into a NamedTuple train state.

  optimizer: an ``optax.GradientTransformation``; when given, the optimizer state is reset to
  ``optimizer.init(params)`` (the LAWA papers' "restart" variant); otherwise it is kept.
  """
  import jax

  old = getattr(state, params_field)
  if jax.tree.structure(old) != jax.tree.structure(params):
    raise ValueError("averaged parameters do not have the train state's parameter structure")
  for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(params)):
    if np.shape(a) != np.shape(b):
      raise ValueError(f"averaged parameter shape {np.shape(b)} != train state's {np.shape(a)}")
  params = jax.tree.map(lambda a, b: b.astype(a.dtype), old, params)
  changes = {params_field: params}
  if optimizer is not None:
    changes[opt_field] = optimizer.init(params)
  return state._replace(**changes)
