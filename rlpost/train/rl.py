"""GRPO-family RL training as pure, jitted functions (in the style of purejaxrl).

``make_train(policy, task, recipe, allocation, optimizer, mesh, spec=...)`` makes the pure
functions of a run from explicit parts (``Parts``: a ``Policy``, a ``TaskData``, a ``Recipe``,
an allocation rule, an optax optimizer, a mesh and a ``StepSpec``), with no config and no
trainer. ``make_train(config)`` is the config path onto it: it validates the config, does the
host-side setup once (``setup.build``: the task, the policy, SFT warm-started and cached for the
character model or a local Hugging Face checkpoint, the task arrays), builds the recipe and the
optimizer, and returns a ``Trainer`` holding the parts and the functions. The functions are:

    fns.init(params, seed) -> RLState
    fns.step(state, data, ref_params) -> (state, metrics)
    fns.collect(params, cursor, key, data_key, data) -> Allocation
    fns.update(state, allocation, ref_params, k_adv, k_mb) -> (state, metrics)
    fns.sample(params, idx, key, data) -> Rollouts

Every array a step uses is an argument (``data`` is the train split's ``TaskArrays``,
``ref_params`` the frozen reference policy); the caller chooses ``jit``, ``vmap`` over seeds
(``Trainer.vmapped_step``) or anything else. One step: pick prompts by the data cursor, allocate
and sample rollouts (the allocation rule, ``rlpost.rollouts.allocate``), score
them (in JAX when the task has a JAX reward and the tokenizer is the character one; through one
batched host callback otherwise), compute advantages with the recipe's chain (its state carried
in ``RLState.adv_state`` and checkpointed), then the optimizer epochs (``rlpost.train.update``).

LoRA (``lora_rank`` > 0): the policy carries adapters (``setup.build``), only they are trained
(``make_update``'s ``trainable``: ``lora.trainable_mask``) and the optimizer state holds only
theirs; ``ref_params`` is the adapted policy at step 0, whose zero B makes it the base model.

Shape legend: P prompts per step, G rollouts per prompt, B rows, Tp prompt buffer, N max new
tokens. A run is a function of (config, seed): the state carries the PRNG key, the step and the
data cursor, and every random draw of step s derives from ``fold_in(key, s)``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlpost import objectives as obj
from rlpost import sampling, sharding
from rlpost.models import lora, packing
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from rlpost.rollouts import allocate
from rlpost.tasks import base as task_base
from rlpost.tasks.base import TaskArrays, host_reward  # noqa: F401  (re-exported)
from rlpost.tokenizer import CharTokenizer
from rlpost.train import setup
from rlpost.train.evaluate import make_evaluate
from rlpost.train.guards import all_finite, raise_if_bad  # noqa: F401  (re-exported)
from rlpost.train.rl_config import (DEFAULT_MODEL, POLICY_MODEL_KEYS,  # noqa: F401
                                    RLConfig, build_recipe, learning_rate)
from rlpost.train.update import make_update, row_chunks, split_trainable
from rlpost.types import RolloutBatch


class RLState(NamedTuple):
  """The carry of training: everything a checkpoint must hold to resume bit for bit."""

  params: Any
  opt_state: Any
  adv_state: Any  # the advantage chain's state (``recipe.advantage.init()``)
  key: jax.Array  # raw uint32 key data (typed keys are not checkpointable as is)
  step: jax.Array  # int32 []
  cursor: jax.Array  # int32 [], prompts consumed so far


class TrainFns(NamedTuple):
  """The pure functions of a run (see the module docstring)."""

  init: Callable
  step: Callable
  collect: Callable
  update: Callable
  sample: Callable


def prompt_indices(cursor, n_items: int, key, n: int) -> jax.Array:
  """[n_items] indices of the next prompts of an epoch-wise shuffled stream of n at ``cursor``."""
  pos = cursor + jnp.arange(n_items)
  e0 = cursor // n
  p0 = jax.random.permutation(jax.random.fold_in(key, e0), n)
  p1 = jax.random.permutation(jax.random.fold_in(key, e0 + 1), n)
  return jnp.where(pos // n == e0, p0[pos % n], p1[pos % n])


class StepSpec(NamedTuple):
  """What a step needs besides its parts: its sizes (P prompts, G rollouts each, N new tokens),
  sampling, and the update's epochs, mini-batches and memory options (``RLConfig`` keys of the
  same names)."""

  num_prompts: int
  group_size: int
  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  num_iterations: int = 1
  num_minibatches: int = 1
  grad_accum: int = 1
  rollout_chunk: int = 0
  logits_chunk: int = 0
  remat: bool = False
  pack_buckets: tuple = ()
  pack_bin_rows: int = 2
  log_confidence: bool = False

  @classmethod
  def of(cls, cfg: RLConfig, max_new_tokens: int) -> "StepSpec":
    """The spec of config ``cfg`` with the run's completion length."""
    return cls(**{f: getattr(cfg, f) for f in cls._fields if f != "max_new_tokens"},
               max_new_tokens=max_new_tokens)


def run_facts(policy, train: TaskArrays) -> dict:
  """The run facts of ``policy`` on a train split: tokenizer, stop and pad ids, prompt length."""
  return dict(tokenizer=policy.tokenizer, stop_tokens=tuple(policy.stop_tokens),
              pad_id=policy.pad_id, prompt_length=int(train.prompt_tokens.shape[1]))


class TaskData(NamedTuple):
  """A task with its records (``{"train": [...], "test": [...]}``) and their arrays."""

  task: task_base.Task
  records: dict
  train: TaskArrays
  test: TaskArrays


class Parts:
  """Everything the pure functions of a run are made from (``make_train``'s arguments, and
  what follows from them); no config, no setup."""

  def __init__(self, policy, task: TaskData, recipe: obj.Recipe, allocation, optimizer,
               mesh, spec: StepSpec):
    self.policy, self.task, self.recipe, self.optimizer = policy, task, recipe, optimizer
    self.mesh, self.spec = mesh, spec
    rule, args = allocation
    self.allocation = (rule, args)
    self.graphdef, self.max_new_tokens = policy.graphdef, spec.max_new_tokens
    # The parameters the optimizer trains (a mask function): the adapters when the policy has
    # LoRA adapters, else None (all of them).
    has_adapters = policy.params is not None and lora.count(policy.params)[1] > 0
    self.trainable = lora.trainable_mask if has_adapters else None
    # Padding-free scoring buckets (rlpost.models.packing), None for the padded pass.
    self.packing = (packing.Buckets(tuple(float(f) for f in spec.pack_buckets),
                                    spec.pack_bin_rows) if spec.pack_buckets else None)
    self.sampling_cfg = sampling.SamplingConfig(
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
        stop_tokens=policy.stop_tokens, pad_id=policy.pad_id)
    tok = policy.tokenizer
    self.jax_reward = task.task.jax_reward is not None and isinstance(tok, CharTokenizer)
    self.score_host = task_base.host_scorer(task.task, task.records, tok, policy.stop_tokens)
    self.reported: tuple[str, ...] = ()  # the allocation's and the chain's metric names
    self.plan = plan = rule.plan(args, spec.num_prompts, spec.group_size)
    n_dev = len(mesh.devices.flat)
    if any(n % n_dev for n in plan.calls):
      raise ValueError(f"allocation {rule.name!r} samples {list(plan.calls)} rows per call; "
                       f"each must be divisible by the {n_dev} devices")
    per_update = spec.num_minibatches * spec.grad_accum * n_dev
    if plan.rows % per_update:
      raise ValueError(f"allocation {rule.name!r} gives {plan.rows} rows, which do not split "
                       f"into {spec.num_minibatches} mini-batches x {spec.grad_accum} "
                       f"micro-batches x {n_dev} devices")
    c = spec.rollout_chunk
    if c and (c % n_dev or any(n % c for n in plan.calls)):
      raise ValueError(f"rollout_chunk {c} must divide every sampling call's rows "
                       f"{list(plan.calls)} and be divisible by the {n_dev} devices")

  def run_facts(self) -> dict:
    """Facts of this run that recipes and allocation rules may take by name, beyond the
    sizes (``rlpost.objectives.RecipeContext``)."""
    return run_facts(self.policy, self.task.train)

  def reward(self, tokens, mask, idx, data: TaskArrays, *, split_id: int = 0):
    """Rewards [B] float32 and correctness [B] bool of completions of prompts ``idx`` [B]."""
    if self.jax_reward:
      return self.task.task.jax_reward(tokens, mask, data.answer[idx], data.answer_len[idx],
                                       self.policy.tokenizer)
    return host_reward(lambda *a: self.score_host(*a), tokens, mask, idx, split_id=split_id,
                       correct_at=self.task.task.correct_at)

  def rows_constraint(self, x):
    """Constrain x's leading (rollout) dimension to be split over the mesh."""
    spec = sharding.batch_spec(x.ndim)
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(self.mesh, spec))

  def trainable_params(self, params):
    """The part of ``params`` the optimizer trains and holds state for."""
    return split_trainable(params, self.trainable)[0]


class Trainer:
  """Host-side setup of one run from its config: ``setup.build`` and the parts it gives
  (``Parts``), the pure functions made from them (``fns``, ``make_train``'s) and jitted
  conveniences."""

  def __init__(self, cfg: RLConfig, *, log: Callable[[str], None] = print,
               optimizer: optax.GradientTransformation | None = None, progress: bool = True):
    """``optimizer`` replaces the configured one (global-norm clipping and AdamW; with LoRA
    it sees the adapters alone); ``progress=False`` turns off the SFT warm start's progress
    bar."""
    self.cfg, self.log = cfg, log
    self.lora = cfg.lora_config()
    s = setup.build(cfg, log, progress=progress)
    self.task, self.records = s.task, s.records
    self.tok, self.stop_tokens = s.policy.tokenizer, s.policy.stop_tokens
    self.pad_id = s.policy.pad_id
    self.model_cfg, self.graphdef = s.policy.model_cfg, s.policy.graphdef
    self.max_new_tokens = s.max_new_tokens
    self.mesh = sharding.make_mesh(fsdp=cfg.mesh_fsdp)
    self.ref_params = sharding.shard_params(s.policy.params, self.mesh, mode=cfg.param_sharding)
    self.train_data, self.test_data = s.train_data, s.test_data
    task_data = TaskData(s.task, s.records, s.train_data, s.test_data)
    self.recipe = build_recipe(cfg, self.max_new_tokens, **run_facts(s.policy, s.train_data))
    updates = cfg.steps * cfg.num_iterations * cfg.num_minibatches
    self.optimizer = optimizer or optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(learning_rate(lr=cfg.lr, schedule=cfg.lr_schedule,
                                  warmup_steps=cfg.lr_warmup_steps, total_steps=updates),
                    b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))
    self.parts = Parts(s.policy, task_data, self.recipe, cfg.allocation_rule(), self.optimizer,
                       self.mesh, StepSpec.of(cfg, self.max_new_tokens))
    self.policy = s.policy.replace(params=None)  # the parameters live in ref_params / states
    self.trainable, self.packing = self.parts.trainable, self.parts.packing
    self.jax_reward = self.parts.jax_reward
    self.sampling_cfg = self.parts.sampling_cfg
    self.fns = _make_fns(self.parts)
    self.evaluate = make_evaluate(
        policy=self.policy, task=self.task, records=self.records["test"], data=self.test_data,
        sampling_cfg=self.sampling_cfg, eval_problems=cfg.eval_problems,
        eval_samples=cfg.eval_samples, eval_batch=cfg.eval_batch,
        reward=lambda t, m, i: self.reward(t, m, i, self.test_data, split_id=1))
    self.num_traces = 0
    self._jit_step = None
    self._merge = None

  @property
  def score_host(self) -> Callable:
    """The host scorer of the parts (``task_base.host_scorer``); assigning one replaces it in
    the rewards of functions traced after."""
    return self.parts.score_host

  @score_host.setter
  def score_host(self, fn: Callable) -> None:
    self.parts.score_host = fn

  @property
  def reported(self) -> tuple[str, ...]:
    """The metric names the allocation rule and the advantage chain report (known once the
    step has been traced)."""
    return self.parts.reported

  def run_facts(self) -> dict:
    """Facts of this run that recipes and allocation rules may take by name."""
    return self.parts.run_facts()

  def reward(self, tokens, mask, idx, data: TaskArrays, *, split_id: int = 0):
    """Rewards [B] float32 and correctness [B] bool of completions of prompts ``idx`` [B]."""
    return self.parts.reward(tokens, mask, idx, data, split_id=split_id)

  def rows_constraint(self, x):
    """Constrain x's leading (rollout) dimension to be split over the mesh."""
    return self.parts.rows_constraint(x)

  def trainable_params(self, params):
    """The part of ``params`` the optimizer trains and holds state for (with LoRA the
    adapters, the rest None; else all of ``params``)."""
    return self.parts.trainable_params(params)

  def averaging_params(self, params):
    """What weight averages (``averaging``) are taken of: ``params``, or with LoRA the merged
    weights W + s A B with B = 0 (``lora.merge_params(keep_adapters=True)``; same tree and
    graph). Averaging the factors A and B separately would not average the weights: the
    product is bilinear."""
    if self.lora is None:
      return params
    if self._merge is None:
      self._merge = jax.jit(functools.partial(lora.merge_params, scale=self.lora.scale,
                                              keep_adapters=True))
    return self._merge(params)

  def reference_model(self) -> tfm.Transformer:
    """The starting policy as a module (``nnx.merge`` of the graph and ``ref_params``)."""
    return nnx.merge(self.graphdef, self.ref_params)

  def init_state(self) -> RLState:
    """The state at step 0: parameters placed by the sharding rule, the rest replicated."""
    return self.fns.init(self.ref_params, self.cfg.seed)

  def step(self, state: RLState):
    """One RL step ``(state) -> (state, metrics)``, jitted; the output keeps the input state's
    shardings, so one compilation serves the whole run (and resumed runs)."""
    if self._jit_step is None:
      self._jit_step = jax.jit(self._counted(self.fns.step),
                               out_shardings=(jax.tree.map(lambda x: x.sharding, state), None))
    return self._jit_step(state, self.train_data, self.ref_params)

  def vmapped_step(self, states: RLState) -> Callable:
    """``fn(states) -> (states, metrics)``: the step over stacked states (seeds), jitted."""
    fn = jax.jit(jax.vmap(self._counted(self.fns.step), in_axes=(0, None, None)),
                 out_shardings=(jax.tree.map(lambda x: x.sharding, states), None))
    return lambda st: fn(st, self.train_data, self.ref_params)

  def sample(self, params, idx, key, split: str = "train") -> allocate.Rollouts:
    """Sample and score one completion per row for prompts ``idx`` [R] of ``split``."""
    data = self.train_data if split == "train" else self.test_data
    return self.fns.sample(params, idx, key, data, split_id=int(split != "train"))

  def _counted(self, fn):
    def traced(*args):
      self.num_traces += 1  # trace-time side effect: counts compilations
      return fn(*args)
    return traced


def _make_fns(parts: "Parts") -> TrainFns:
  cfg, recipe, constrain = parts.spec, parts.recipe, parts.rows_constraint
  p, g = cfg.num_prompts, cfg.group_size
  rule, rule_args = parts.allocation
  facts = parts.run_facts()
  # log_confidence: the reference pass runs for the confidence diagnostics alone when the
  # recipe does not read ref_logp (the loss is unchanged: it reads only what it requires).
  needs = set(recipe.requires) | ({"ref_logp"} if cfg.log_confidence else set())
  chain_entropy = "entropy" in recipe.advantage_requires
  policy_logp = _policy_logp(parts)
  update_epochs = make_update(recipe=recipe, optimizer=parts.optimizer, policy_logp=policy_logp,
                              num_iterations=cfg.num_iterations,
                              num_minibatches=cfg.num_minibatches, grad_accum=cfg.grad_accum,
                              constrain=constrain, trainable=parts.trainable, packing=parts.packing)

  def init(params, seed: int) -> RLState:
    replicated = jax.sharding.NamedSharding(parts.mesh, jax.sharding.PartitionSpec())
    rest = [sharding.put(x, replicated) for x in
            (jax.random.key_data(jax.random.key(seed)), jnp.int32(0), jnp.int32(0))]
    # Moments follow the parameters' sharding; with LoRA only the adapters have any.
    opt_state = jax.jit(parts.optimizer.init)(parts.trainable_params(params))
    # Placed explicitly (committed), as the step's outputs are: jit keys its cache on
    # committed-ness, so uncommitted moments would compile the step a second time at step 2.
    n_dev = len(parts.mesh.devices.flat)
    opt_state = jax.tree.map(lambda x: sharding.put(
        x, x.sharding if len(x.sharding.device_set) == n_dev else replicated), opt_state)
    # Strongly typed (a Python number in the chain's state would be weakly typed at step 1 and
    # not after, compiling the step twice).
    adv_state = jax.tree.map(lambda x: sharding.put(jnp.asarray(np.asarray(x)), replicated),
                             recipe.advantage.init())
    return RLState(params, opt_state, adv_state, rest[0], rest[1], rest[2])

  def sample(params, idx, key, data: TaskArrays, split_id: int = 0) -> allocate.Rollouts:
    idx = constrain(idx)
    prompts, pmask = constrain(data.prompt_tokens[idx]), constrain(data.prompt_mask[idx])
    r, c = idx.shape[0], cfg.rollout_chunk
    # One key per row: a row's completion depends on its own key only, so sampling in chunks
    # (rollout_chunk) draws the same rows as sampling all at once.
    keys = constrain(jax.random.split(key, r))
    if c <= 0 or c >= r:
      out = sampling.sample(parts.graphdef, params, prompts, pmask, keys, cfg=parts.sampling_cfg)
    else:  # sequential chunks of c rows: one KV cache of c rows at a time
      out = jax.lax.map(
          lambda a: sampling.sample(parts.graphdef, params, *map(constrain, a),
                                    cfg=parts.sampling_cfg),
          (prompts.reshape(r // c, c, -1), pmask.reshape(r // c, c, -1), keys.reshape(r // c, c)))
      out = jax.tree.map(lambda x: constrain(x.reshape(r, *x.shape[2:])) if x.ndim >= 2
                         else jnp.max(x), out)  # per-chunk scalars (num_steps): the longest
    rewards, correct = parts.reward(out.tokens, out.mask, idx, data, split_id=split_id)
    return allocate.Rollouts(idx, prompts, pmask, out, rewards, correct)

  def collect(params, cursor, key, data_key, data: TaskArrays) -> allocate.Allocation:
    smp = lambda idx, k: sample(params, idx, k, data)  # noqa: E731
    nxt = lambda n: prompt_indices(cursor, n, data_key, data.prompt_tokens.shape[0])  # noqa: E731
    return rule(rule_args, smp, nxt, key, num_prompts=p, group_size=g, constrain=constrain,
                max_length=parts.max_new_tokens, **facts)

  def update(state: RLState, alloc: allocate.Allocation, ref_params, k_adv, k_mb):
    ro, group, valid = alloc.rollouts, alloc.group_id, alloc.valid
    b = ro.rewards.shape[0]
    chunk = b // (cfg.num_minibatches * cfg.grad_accum)  # the update's micro-batch size

    def scores(params, entropy=False):
      def fn(r):
        r = constrain(r)
        pmask, tmask = ro.pmask[r], ro.mask[r]
        score = lambda num_bins: policy_logp(  # noqa: E731
            params, ro.prompts[r], pmask, ro.tokens[r], tmask, entropy=entropy,
            num_bins=num_bins)
        return score(None) if parts.packing is None else parts.packing.run(score, pmask, tmask)
      return jax.lax.stop_gradient(row_chunks(fn, b, chunk, alloc.live))

    ref_logp = scores(ref_params)[0] if "ref_logp" in needs else None
    current_logp = entropy = None
    if "current_logp" in needs or chain_entropy:
      current_logp, entropy = scores(state.params, entropy=chain_entropy)
      current_logp = current_logp if "current_logp" in needs else None
    batch = RolloutBatch(group_id=group, valid=valid, tokens=ro.tokens, token_mask=ro.mask,
                         rewards=ro.rewards, behaviour_logp=ro.logp, current_logp=current_logp,
                         ref_logp=ref_logp, correct=ro.correct, entropy=entropy)
    finite = obj.check_finite(batch)
    adv, adv_state = obj.compute_advantages(recipe.advantage, batch, state.adv_state, key=k_adv)
    reported = dict(adv.metrics or {})  # the chain's own metrics (``obj.report``)
    adv = adv._replace(metrics=None)
    params, opt_state, stats = update_epochs(state.params, state.opt_state, batch, ro.prompts,
                                             ro.pmask, adv, k_mb, alloc.live)
    vf = valid.astype(jnp.float32)
    n_valid = jnp.maximum(jnp.sum(vf), 1.0)
    bad = jnp.maximum(finite.first_bad_index, 0)
    metrics = dict(
        reward=jnp.sum(ro.rewards * vf) / n_valid,
        accuracy=jnp.sum(ro.correct * vf) / n_valid,
        prompt_reward=obj.per_prompt_mean(ro.rewards, group, valid),
        prompt_accuracy=obj.per_prompt_mean(ro.correct, group, valid),
        zero_variance_groups=obj.zero_variance_fraction(batch.rewards, batch.group_id, valid),
        zero_advantage_groups=obj.zero_advantage_fraction(adv.values, adv.weights, ro.mask,
                                                          group),
        response_length=jnp.sum(jnp.sum(ro.mask, axis=1) * vf) / n_valid,
        truncated=jnp.sum((ro.sample.finish_reason == sampling.FINISH_LENGTH) * vf) / n_valid,
        adv_abs=_adv_abs(adv, ro.mask),
        nonfinite_batch=(~finite.ok).astype(jnp.int32),
        **_confidence_metrics(batch),
        nonfinite_index=finite.first_bad_index, nonfinite_field=finite.field,
        nonfinite_prompt=ro.idx[bad], nonfinite_group=group[bad],
        nonfinite_params=(~all_finite(params)).astype(jnp.int32))
    metrics = _merge_metrics(trainer=metrics, loss=stats, allocation=alloc.metrics,
                             advantage=reported)
    # Trace-time record of the extensions' own metric names, for the progress bar.
    parts.reported = tuple(sorted(alloc.metrics)) + tuple(sorted(reported))
    new_state = RLState(params, opt_state, adv_state, state.key, state.step + 1,
                        state.cursor + alloc.consumed)
    return new_state, metrics

  def step(state: RLState, data: TaskArrays, ref_params):
    step_root, data_root = jax.random.split(jax.random.wrap_key_data(state.key))
    k_sample, k_adv, k_mb = jax.random.split(jax.random.fold_in(step_root, state.step), 3)
    # Rollout rows are split over every device of the mesh; everything downstream (sampling,
    # reward, log-probs, loss) follows that split, and the compiler sums the gradients.
    alloc = collect(state.params, state.cursor, k_sample, data_root, data)
    return update(state, alloc, ref_params, k_adv, k_mb)

  return TrainFns(init=init, step=step, collect=collect, update=update, sample=sample)


def _merge_metrics(**sources: dict) -> dict:
  """One dict of every source's metrics by name (the trainer's own, the loss's, the
  allocation rule's and the advantage chain's); ValueError at trace time when two sources use
  one name, or a name the run loop adds, naming both, or when a metric is not a scalar."""
  out, owner = {}, {"step_seconds": "run loop"}
  for source, metrics in sources.items():
    for k, v in metrics.items():
      if k in owner:
        raise ValueError(f"metric {k!r} is reported by both the {owner[k]} and the {source}; "
                         "rename one of them")
      if jnp.ndim(v) != 0:
        raise ValueError(f"metric {k!r} of the {source} has shape {jnp.shape(v)}; a step metric "
                         "is a scalar")
      out[k], owner[k] = v, source
  return out


def _policy_logp(parts: "Parts") -> Callable:
  cfg = parts.spec

  def fn(params, prompts, pmask, tokens, tmask, *, entropy: bool = False, num_bins=None):
    """logp [R, N] of completions under ``params`` and, with ``entropy``, the token entropy;
    over the rows packed into ``num_bins`` bins (``parts.packing``) unless None."""
    model = nnx.merge(parts.graphdef, params)
    if num_bins is not None:
      return packing.completion_scores(model, prompts, pmask, tokens, tmask, num_bins=num_bins,
                                       bin_rows=cfg.pack_bin_rows, entropy=entropy,
                                       logits_chunk=cfg.logits_chunk, remat=cfg.remat)
    return scoring.completion_scores(model, prompts, pmask, tokens, tmask, entropy=entropy,
                                     logits_chunk=cfg.logits_chunk, remat=cfg.remat)
  return fn


def _adv_abs(adv: obj.Advantages, token_mask: jax.Array) -> jax.Array:
  """Weighted mean |advantage| (token-level advantages: the mean over each row's tokens)."""
  values = jnp.abs(adv.values)
  if values.ndim == 2:
    values = obj.safe_divide(jnp.sum(jnp.where(token_mask, values, 0.0), axis=1),
                             jnp.sum(token_mask, axis=1).astype(jnp.float32))
  return jnp.sum(values * adv.weights) / jnp.maximum(jnp.sum(adv.weights), 1)


def _confidence_metrics(batch: RolloutBatch) -> dict:
  """ACE's diagnostics where reference log-probs exist: the share of overconfident errors
  (wrong rollouts the policy made more likely than the reference did), the mean confidence
  shift c_i = sum_t (logp - ref_logp) under the sampling policy, its 10/50/90% quantiles over
  the wrong rollouts and the share of their sum softplus(c) on the overconfident ones."""
  if batch.ref_logp is None:
    return {}
  shift = obj.confidence_shift(batch.behaviour_logp, batch.ref_logp, batch.token_mask)
  vf = batch.valid.astype(jnp.float32)
  # How selective a confidence penalty such as ACE's (a multiplier increasing in c on negative
  # advantages) can be: quantiles of c over the wrong rollouts (0 when there are none), and the
  # share of sum softplus(c) over wrong rollouts that falls on overconfident ones (c > 0). Both
  # ignore the advantage's size (0 in all-wrong groups).
  wrong = batch.valid & ~batch.correct
  q = jnp.nanquantile(jnp.where(wrong, shift, jnp.nan), jnp.asarray([0.1, 0.5, 0.9]))
  q = jnp.where(jnp.any(wrong), q, 0.0)
  sp = jnp.where(wrong, jax.nn.softplus(shift), 0.0)
  return dict(
      overconfident_errors=obj.overconfident_error_fraction(shift, batch.correct, batch.valid),
      confidence_shift=jnp.sum(shift * vf) / jnp.maximum(jnp.sum(vf), 1.0),
      shift_wrong_p10=q[0], shift_wrong_p50=q[1], shift_wrong_p90=q[2],
      penalty_share_overconfident=obj.safe_divide(jnp.sum(jnp.where(shift > 0, sp, 0.0)),
                                                  jnp.sum(sp)))


def make_train(config, task: TaskData | None = None, recipe: obj.Recipe | None = None,
               allocation=("plain", {}), optimizer: optax.GradientTransformation | None = None,
               mesh=None, *, spec: StepSpec | None = None, **kw):
  """The pure functions of a run, from a config or from explicit parts.

  * ``make_train(config, **kw) -> Trainer``: ``config`` an ``RLConfig`` or its dict; validated,
    then ``Trainer`` does the setup (``setup.build``) and makes its parts (``trainer.parts``)
    and functions (``trainer.fns``) with the call below. ``kw``: ``Trainer``'s (``log``,
    ``optimizer``, ``progress``).
  * ``make_train(policy, task, recipe, allocation, optimizer, mesh, spec=...) -> TrainFns``:
    a ``Policy`` (its graph, tokenizer, stop and pad ids; parameters, if any, tell whether it
    carries LoRA adapters), a ``TaskData``, a ``Recipe``, an allocation (a registered name, or
    ``(name, args dict)``), an optax optimizer, a ``jax.sharding.Mesh`` (``sharding.make_mesh``)
    and a ``StepSpec``. No config and no trainer: ``fns.init(params, seed)`` then
    ``fns.step(state, task.train, ref_params)``.
  """
  if isinstance(config, (RLConfig, dict)):
    from rlpost.train.config import from_dict

    extra = [n for n, v in (("task", task), ("recipe", recipe), ("mesh", mesh), ("spec", spec))
             if v is not None]
    if extra:
      raise TypeError(f"make_train(config, ...) takes no {extra}: the config makes them")
    cfg = config if isinstance(config, RLConfig) else from_dict(RLConfig, config)
    if isinstance(config, RLConfig):
      cfg.validate()
    return Trainer(cfg, optimizer=optimizer, **kw)
  missing = [n for n, v in (("task", task), ("recipe", recipe), ("optimizer", optimizer),
                            ("mesh", mesh), ("spec", spec)) if v is None]
  if missing or kw:
    raise TypeError(f"make_train(policy, ...) needs task, recipe, optimizer, mesh and spec "
                    f"(missing {missing}; unexpected {sorted(kw)})")
  name, args = (allocation, {}) if isinstance(allocation, str) else allocation
  rule = allocate.get_allocation(name)
  return _make_fns(Parts(config, task, recipe, (rule, rule.parse(args)), optimizer, mesh, spec))
