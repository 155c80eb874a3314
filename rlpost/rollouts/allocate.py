"""Rollout allocation: which prompts get how many rollouts, with static shapes.

Each rule is a pure function of a ``sample`` function, a ``prompts`` stream and a PRNG key, and
returns an ``Allocation``: the sampled rows, their group ids and validity, how many prompts of
the stream it consumed, and its metrics. Nothing here knows the model, the task or the trainer:

    sample(idx [R] int32, key) -> Rollouts of R rows (one completion per row for prompt idx[r])
    prompts(n) -> [n] int32, the indices of the next n prompts of the training stream

Rules (shape legend: P prompts per step, G group size, R rows):

* ``plain``: P prompts x G rollouts; R = P * G, every row valid.
* ``dynamic_sampling`` (DAPO): P * k groups sampled, the first P with mixed outcomes kept in
  sampling order (0 < #correct < G); if fewer than P are mixed, the remaining groups are filled
  with unmixed ones and marked invalid. R = P * G; consumes P * k prompts.
* ``dars``: P * G stage-1 rows, then stage-2 rows assigned to prompts by the schedule
  (``rlpost.rollouts.dars.extra_rollouts``) and merged into their groups; merged groups whose
  accuracy is 0 or 1 are invalid. Stage 2 is either one call of a fixed ``budget`` of rows
  (R = P * G + budget; demand past it is truncated) or, with ``chunk`` C, up to
  K = ceil(P * (n_max - G) / C) calls of C rows of which only the ceil(demand / C) the schedule
  needs run (R = P * G + K * C; never truncates; the rows of chunks not run are not ``live``).
* ``dars_b`` (DARS-B): the same rule in a breadth run; it refuses mini-batches (the paper's
  full-batch epochs).

Each rule is registered (``register_allocation``) with its arguments (a dataclass: the config's
``allocation_args``) and its ``Plan``, the rows of each sampling call and of the step's batch as
functions of P, G and the arguments. The config checks ``rollout_chunk``, the mini-batches and
the rule's own constraints on the run from them before any work, and the trainer runs the rule
through ``Rule.__call__``, which refuses rows other than the plan's. A fork adds a rule in one
file (README "Extending rlpost").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from rlpost import registry
from rlpost.rollouts import dars as dars_schedule


class Rollouts(NamedTuple):
  """Sampled and scored rows: prompt ids [R] int32, prompts [R, Tp] int32 / bool, the sampler's
  output (``rlpost.sampling.SampleOutput``: tokens, mask, policy_logprobs, finish_reason of R
  rows), rewards [R] float32 and correctness [R] bool."""

  idx: jax.Array
  prompts: jax.Array
  pmask: jax.Array
  sample: Any
  rewards: jax.Array
  correct: jax.Array

  @property
  def tokens(self) -> jax.Array:
    """[R, N] int32 completion tokens."""
    return self.sample.tokens

  @property
  def mask(self) -> jax.Array:
    """[R, N] bool, True on generated tokens."""
    return self.sample.mask

  @property
  def logp(self) -> jax.Array:
    """[R, N] float32 log-probs under the sampling policy (0 where masked)."""
    return self.sample.policy_logprobs


class Allocation(NamedTuple):
  """rollouts (R rows), group_id [R] int32 in [0, P), valid [R] bool, consumed (prompts of the
  stream used: a Python int, an int32 [] array when returned from ``jit``), metrics (dict of
  [] arrays), and ``live``: None when every row was sampled, else [R] bool, False on the rows
  of a rule whose row count is dynamic that were not sampled (never valid). The update orders
  live rows first and skips the micro-batches without a valid row (``make_update``)."""

  rollouts: Rollouts
  group_id: jax.Array
  valid: jax.Array
  consumed: int
  metrics: dict
  live: jax.Array | None = None


Sample = Callable[[jax.Array, jax.Array], Rollouts]
Prompts = Callable[[int], jax.Array]


def plain(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int,
          group_size: int) -> Allocation:
  """P prompts x G rollouts, all valid."""
  p, g = num_prompts, group_size
  k1, _ = jax.random.split(key)
  ro = sample(jnp.repeat(prompts(p), g), k1)
  group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  return Allocation(ro, group, jnp.ones((p * g,), bool), p, {})


def dynamic_sampling(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int,
                     group_size: int, factor: int,
                     constrain: Callable = lambda x: x) -> Allocation:
  """DAPO dynamic sampling: keep the first P of P * factor groups with mixed outcomes.

  ``constrain`` re-applies the rows' sharding after the selection (identity by default).
  Metrics: kept_groups (share of the kept P that are mixed), mixed_fraction_sampled.
  """
  p, g, k = num_prompts, group_size, factor
  if k == 1:
    return plain(sample, prompts, key, num_prompts=p, group_size=g)
  k1, _ = jax.random.split(key)
  ro = sample(jnp.repeat(prompts(p * k), g), k1)
  right = ro.correct.reshape(p * k, g).sum(axis=1)
  mixed = (right > 0) & (right < g)
  chosen = jnp.argsort(~mixed, stable=True)[:p]  # mixed groups first, in sampling order
  rows = (chosen[:, None] * g + jnp.arange(g)[None, :]).reshape(-1)
  ro = jax.tree.map(lambda x: constrain(x[rows]) if x.ndim >= 1 else x, ro)
  group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
  valid = jnp.repeat(mixed[chosen], g)
  metrics = dict(kept_groups=jnp.mean(mixed[chosen].astype(jnp.float32)),
                 mixed_fraction_sampled=jnp.mean(mixed.astype(jnp.float32)))
  return Allocation(ro, group, valid, p * k, metrics)


def _stage2_chunks(sample: Sample, idx: jax.Array, key: jax.Array, chunk: int,
                   needed: jax.Array, constrain: Callable) -> Rollouts:
  """``sample`` over idx [K * chunk] in K calls of ``chunk`` rows, of which only the first
  ``needed`` ([] int32) run; the rows of the others are zeros (mask False)."""
  k = idx.shape[0] // chunk
  shapes = jax.eval_shape(sample, idx[:chunk], key)
  rows_of = lambda tree: jax.tree.map(  # noqa: E731
      lambda x: constrain(x) if x.ndim >= 1 else x, tree)  # both branches split alike

  def one(i, sub_key):
    rows = jax.lax.dynamic_slice_in_dim(idx, i * chunk, chunk)
    return jax.lax.cond(
        i < needed, lambda: rows_of(sample(constrain(rows), sub_key)),
        lambda: rows_of(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)))

  out = jax.lax.map(lambda a: one(*a), (jnp.arange(k), jax.random.split(key, k)))
  return jax.tree.map(lambda x: constrain(x.reshape(k * chunk, *x.shape[2:])) if x.ndim >= 2
                      else jnp.max(x), out)  # per-call scalars (num_steps): the longest


def dars(sample: Sample, prompts: Prompts, key: jax.Array, *, num_prompts: int, group_size: int,
         n_max: int, schedule: str, budget: int, chunk: int = 0,
         constrain: Callable = lambda x: x) -> Allocation:
  """DARS: stage-1 groups of G, then stage-2 rows by ``schedule`` ("et" or "hw").

  Stage-2 rows go to prompts in order, each taking its schedule's extra rollouts. With
  ``chunk`` 0 they are one sampling call of ``budget`` rows: rows past the demand are invalid
  and demand past the budget is truncated. With ``chunk`` C > 0 the ``budget`` rows (a multiple
  of C: pass the schedule's largest demand, P * (n_max - G) rounded up, so nothing truncates)
  are sampled C at a time, and only the calls the demand needs run (``live`` marks their rows).

  Metrics: dars_demand (the stage-2 rows the schedule asks for), dars_truncated (those past
  the budget) and dars_truncated_fraction (of the demand), dars_extra_rollouts,
  dars_budget_used, dars_stage2_calls (sampling calls run in stage 2), dars_all_wrong_stage1,
  dars_rescued (all-wrong prompts with a right stage-2 rollout), kept_groups (share of merged
  groups that are mixed).
  """
  p, g = num_prompts, group_size
  if chunk and budget % chunk:
    raise ValueError(f"dars: the stage-2 budget ({budget}) must be a multiple of chunk ({chunk})")
  k1, k2 = jax.random.split(key)
  pidx = prompts(p)
  r1 = sample(jnp.repeat(pidx, g), k1)
  acc = r1.rewards.reshape(p, g).mean(axis=1)
  extra = dars_schedule.extra_rollouts(acc, g, n_max, schedule=schedule)
  cum = jnp.cumsum(extra)
  demand = cum[-1]
  owner = jnp.searchsorted(cum, jnp.arange(budget), side="right")  # [budget]
  valid2 = jnp.arange(budget) < demand
  owner = jnp.minimum(owner, p - 1)
  if chunk:
    calls = -(-demand // chunk)  # the calls the demand needs
    r2 = _stage2_chunks(sample, pidx[owner], k2, chunk, calls, constrain)
    live = jnp.concatenate([jnp.ones((p * g,), bool), valid2])
  else:
    calls, live = jnp.int32(1), None
    r2 = sample(pidx[owner], k2)
  ro = jax.tree.map(lambda a, b: jnp.concatenate([a, b]) if a.ndim >= 1 else jnp.maximum(a, b),
                    r1, r2)
  group = jnp.concatenate([jnp.repeat(jnp.arange(p), g), owner]).astype(jnp.int32)
  valid = jnp.concatenate([jnp.ones((p * g,), bool), valid2])
  n_valid = jax.ops.segment_sum(valid.astype(jnp.int32), group, p)
  n_right = jax.ops.segment_sum((valid & ro.correct).astype(jnp.int32), group, p)
  mixed = (n_right > 0) & (n_right < n_valid)
  stage2_right = jax.ops.segment_sum((valid2 & r2.correct).astype(jnp.int32), owner, p)
  used = jnp.minimum(demand, budget)
  truncated = jnp.maximum(demand - budget, 0).astype(jnp.float32)
  metrics = dict(
      dars_demand=demand.astype(jnp.float32),
      dars_truncated=truncated,
      dars_truncated_fraction=truncated / jnp.maximum(demand, 1).astype(jnp.float32),
      dars_extra_rollouts=used.astype(jnp.float32),
      dars_budget_used=used / max(budget, 1),
      dars_stage2_calls=jnp.asarray(calls, jnp.float32),
      dars_all_wrong_stage1=jnp.sum(acc == 0).astype(jnp.float32),
      dars_rescued=jnp.sum((acc == 0) & (stage2_right > 0)).astype(jnp.float32),
      kept_groups=jnp.mean(mixed.astype(jnp.float32)))
  return Allocation(ro, group, valid & mixed[group], p, metrics, live)


# Registry -----------------------------------------------------------------------------------------


class Plan(NamedTuple):
  """What a rule samples per step, known before any work: ``calls`` the rows of each sampling
  call in order, ``rows`` the rows R of the step's batch (the update's static shape)."""

  calls: tuple
  rows: int


@dataclasses.dataclass(frozen=True)
class Rule:
  """A registered allocation rule (``register_allocation``).

  Attributes:
    name: registry name (the config key ``allocation``).
    fn: ``fn(sample, prompts, key, *, <facts>, <args>) -> Allocation``. Facts are passed by
      name where ``fn`` takes them: ``num_prompts`` (P), ``group_size`` (G), ``constrain``
      (re-applies the rows' sharding to a gathered [R, ...] array; identity off a mesh), and
      from the trainer ``max_length``, ``prompt_length``, ``tokenizer``, ``stop_tokens``
      and ``pad_id`` (``rlpost.objectives.RecipeContext``; ``registry.facts_for``).
    args: a dataclass of the rule's arguments (the config key ``allocation_args``): field types
      and defaults, and a ``__post_init__`` that raises ValueError naming a bad one; None for a
      rule without arguments.
    calls: ``calls(num_prompts, group_size, args) -> tuple[int, ...]``, the rows of each
      sampling call.
    rows: ``rows(num_prompts, group_size, args) -> int``, the rows of the returned batch; None:
      every sampled row (the sum of ``calls``).
    check: ``check(args, cfg) -> None``, raising ValueError when the rest of the run config
      (read by attribute: ``num_minibatches``, ``group_size``, ...) cannot run this rule; None:
      no constraint.
  """

  name: str
  fn: Callable
  args: type | None = None
  calls: Callable = None
  rows: Callable | None = None
  check: Callable | None = None

  def parse(self, values: dict | None = None):
    """The rule's arguments from ``values`` (an instance of ``args``, or None without args).
    Raises ValueError naming an unknown or ill-typed key (``rlpost.train.config.from_dict``
    rules), or whatever ``args`` itself refuses."""
    values = dict(values or {})
    if self.args is None:
      if values:
        raise ValueError(f"allocation {self.name!r} takes no arguments (got {sorted(values)})")
      return None
    from rlpost.train.config import from_dict

    try:
      return from_dict(self.args, values, where="argument")
    except (TypeError, ValueError) as e:
      msg = str(e).removeprefix("argument: ").replace("config key", "argument")
      raise ValueError(f"allocation {self.name!r}: {msg}") from None

  def plan(self, args, num_prompts: int, group_size: int) -> Plan:
    """The rule's ``Plan`` for P = ``num_prompts``, G = ``group_size``; ValueError when a call
    or the batch would have no rows."""
    calls = tuple(int(c) for c in self.calls(num_prompts, group_size, args))
    rows = sum(calls) if self.rows is None else int(self.rows(num_prompts, group_size, args))
    if not calls or min(calls) < 1 or rows < 1:
      raise ValueError(f"its plan samples {list(calls)} rows per call into a batch of {rows}; "
                       "every call and the batch need at least one row")
    return Plan(calls, rows)

  def __call__(self, args, sample: Sample, prompts: Prompts, key: jax.Array, *,
               num_prompts: int, group_size: int, constrain: Callable = lambda x: x,
               **facts) -> Allocation:
    """Runs the rule and checks that it returned the rows its plan declares. ``facts``: other
    run facts ``fn`` may take by name (the trainer passes ``max_length``, ``prompt_length``,
    ``tokenizer``, ``stop_tokens``, ``pad_id``)."""
    facts = dict(facts, num_prompts=num_prompts, group_size=group_size, constrain=constrain)
    kw = registry.facts_for(self.fn, facts)
    kw.update({} if args is None else {f.name: getattr(args, f.name)
                                       for f in dataclasses.fields(args)})
    out = self.fn(sample, prompts, key, **kw)
    want = self.plan(args, num_prompts, group_size).rows
    got = jnp.shape(out.group_id)[0]
    if got != want or jnp.shape(out.valid) != (want,) or jnp.shape(out.rollouts.rewards) != (want,):
      raise ValueError(f"allocation {self.name!r} returned {got} rows (group_id "
                       f"{jnp.shape(out.group_id)}, valid {jnp.shape(out.valid)}, rewards "
                       f"{jnp.shape(out.rollouts.rewards)}); its plan declares {want}")
    return out


_REGISTRY: dict[str, Rule] = {}


def register_allocation(name: str, fn: Callable, *, calls: Callable, args: type | None = None,
                        rows: Callable | None = None, check: Callable | None = None) -> Rule:
  """Adds the allocation rule ``name`` (see ``Rule`` for the parts) and returns it.

  Registering a name again replaces the entry when ``fn`` is the same function by module and
  qualified name (a module re-imported, a notebook cell run again); another function under a
  registered name raises ValueError.
  """
  if args is not None and not dataclasses.is_dataclass(args):
    raise TypeError(f"allocation {name!r}: args must be a dataclass type, got {args!r}")
  if not callable(calls):
    raise TypeError(f"allocation {name!r}: calls must be a function (num_prompts, group_size, "
                    "args) -> rows of each sampling call")
  rule = Rule(name, fn, args, calls, rows, check)
  registry.add(_REGISTRY, name, rule, what="allocation", key=lambda r: r.fn)
  return rule


def list_allocations() -> tuple:
  """Registered allocation names, sorted."""
  return tuple(sorted(_REGISTRY))


def get_allocation(name: str) -> Rule:
  """The rule ``name``; ValueError naming the registered ones otherwise."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown allocation {name!r}; registered: {', '.join(list_allocations())}")
  return _REGISTRY[name]


# Built-in rules -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DynamicSamplingArgs:
  """DAPO dynamic sampling: ``factor`` k, sample k * P groups and keep P with mixed outcomes
  (DAPO's script samples 3x the training prompts)."""

  factor: int = 3

  def __post_init__(self):
    if self.factor < 1:
      raise ValueError(f"factor must be >= 1 (got {self.factor})")


@dataclasses.dataclass(frozen=True)
class DarsArgs:
  """DARS: ``schedule`` "et" (equal treatment) or "hw" (hardness weighted), ``n_max`` the
  largest merged group (stage 1 + stage 2), ``budget`` the stage-2 rows per step (static; 0:
  P * (n_max - G), the schedule's largest demand, so stage 2 never truncates), ``chunk``
  (0: one stage-2 sampling call of the whole budget; C > 0: the never-truncating budget rounded
  up to a multiple of C, sampled C rows at a time, only as many calls as the demand needs;
  ``budget`` must then be 0). The update skips only whole micro-batches without a valid row
  (sampled, in a mixed group): the rows of calls not made cost no model pass when the
  mini-batch is split into micro-batches (``grad_accum`` > 1, as the full-size plans do); with
  one micro-batch per mini-batch every pass runs over the static R rows, the unsampled ones
  masked."""

  schedule: str = "et"
  n_max: int = 32
  budget: int = 0
  chunk: int = 0

  def __post_init__(self):
    if self.schedule not in ("et", "hw"):
      raise ValueError(f"schedule must be 'et' or 'hw' (got {self.schedule!r})")
    if self.n_max < 1:
      raise ValueError(f"n_max must be >= 1 (got {self.n_max})")
    if self.budget < 0:
      raise ValueError(f"budget must be >= 0 (got {self.budget})")
    if self.chunk < 0:
      raise ValueError(f"chunk must be >= 0 (got {self.chunk})")
    if self.chunk and self.budget:
      raise ValueError(f"budget must be 0 with chunk ({self.chunk}): chunked stage 2 samples "
                       "what the demand needs, up to the schedule's largest demand")

  def stage2_rows(self, num_prompts: int, group_size: int) -> int:
    most = num_prompts * (self.n_max - group_size)
    if self.chunk:
      return -(-most // self.chunk) * self.chunk
    return self.budget or most


def _dars_rule(sample, prompts, key, *, num_prompts, group_size, schedule, n_max, budget, chunk,
               constrain):
  args = DarsArgs(schedule, n_max, budget, chunk)
  return dars(sample, prompts, key, num_prompts=num_prompts, group_size=group_size,
              n_max=n_max, schedule=schedule, budget=args.stage2_rows(num_prompts, group_size),
              chunk=chunk, constrain=constrain)


def _dars_check(args: DarsArgs, cfg) -> None:
  if args.n_max < cfg.group_size:
    raise ValueError(f"n_max ({args.n_max}) must be >= group_size ({cfg.group_size}): the "
                     "largest merged group holds the stage-1 group")
  if args.n_max == cfg.group_size:
    raise ValueError(f"n_max equals group_size ({cfg.group_size}), so the schedule never asks "
                     "for stage-2 rollouts; raise n_max")


def _dars_b_check(args: DarsArgs, cfg) -> None:
  _dars_check(args, cfg)
  if cfg.num_minibatches != 1:
    raise ValueError(f"config key 'num_minibatches': DARS-B (allocation 'dars_b') updates on the "
                     f"full batch, so it must be 1 (got {cfg.num_minibatches}); its epochs are "
                     "num_iterations")


def _dars_calls(p, g, a: DarsArgs):
  stage2 = a.stage2_rows(p, g)
  return (p * g,) + ((a.chunk,) * (stage2 // a.chunk) if a.chunk else (stage2,))


register_allocation("plain", plain, calls=lambda p, g, a: (p * g,))
register_allocation("dynamic_sampling", dynamic_sampling, args=DynamicSamplingArgs,
                    calls=lambda p, g, a: (p * g * a.factor,), rows=lambda p, g, a: p * g)
register_allocation("dars", _dars_rule, args=DarsArgs, calls=_dars_calls, check=_dars_check)
# DARS-B (DARS with large breadth): DARS's allocation in a run whose update is full-batch.
register_allocation("dars_b", _dars_rule, args=DarsArgs, calls=_dars_calls, check=_dars_b_check)
