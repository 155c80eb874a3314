"""GRPO-family RL training as pure, jitted functions (in the style of purejaxrl).

``make_train(config)`` does the host-side setup once (data, tokenizer, policy, recipe, optimizer)
and returns a ``Trainer`` whose ``step(state) -> (state, metrics)`` is one jitted program: pick
prompts by the data cursor, sample G rollouts per prompt with the KV-cache sampler, score them
(in JAX for the arithmetic task; through one batched host callback otherwise),
compute advantages with the recipe's chain, then ``num_iterations`` epochs over
``num_minibatches`` mini-batches of optax updates. The reference policy is a frozen copy of the
starting parameters, used for KL terms and ACE's confidence shift.

Two kinds of policy: the built-in character-level decoder, freshly initialised and warm-started
by a cached SFT run on the synthetic tasks' demonstrations (``policy=""``); or a local Hugging
Face checkpoint (``policy=/path``: config.json, safetensors, tokenizer.json), trained as loaded
with its own tokenizer, eos ids as stop tokens and its pad id. The real-data tasks ``gsm8k`` and
``math`` read local files (``task_spec={"train": path, "test": path}``), format each question
with ``prompt_template`` and score completions on the host (``rlpost.tasks.math_data``).

Shape legend: P prompts per step, G rollouts per prompt (sampled), B = P * G rows, Tp prompt
buffer, N max new tokens, V vocabulary.

A run is a function of (config, seed): the state carries the PRNG key, the step and the data
cursor, and every random draw of step s derives from ``fold_in(key, s)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rlpost import objectives as obj
from rlpost import sampling, sharding
from rlpost.eval import metrics as evm
from rlpost.models import transformer as tfm
from rlpost.rollouts import dars
from rlpost.tasks import arithmetic, builders, countdown, math_data
from rlpost.tasks.tokenizer import EOS, PAD, CharTokenizer
from rlpost.train import sft
from rlpost.types import LOGP_FIELDS, RolloutBatch

DEFAULT_MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                     intermediate_size=512, max_seq_len=64)
# The ``model`` keys that still apply with a Hugging Face policy (its config.json fixes the rest).
POLICY_MODEL_KEYS = ("dtype", "param_dtype", "max_seq_len")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Everything that determines a run. See ``validate`` for the allowed values."""

  # task: a synthetic one (builders.BUILDERS) or a file task (math_data.FILE_TASKS) whose
  # task_spec is {"train": path, "test": path}; num_train / num_test cap a file task's records
  task: str = "arithmetic"
  task_spec: dict = dataclasses.field(default_factory=dict)
  num_train: int = 10000
  num_test: int = 1000
  data_seed: int = 0
  graded_reward: bool = False
  data_dir: str = builders.DEFAULT_DATA_DIR
  # file tasks: every literal "{question}" is replaced by the question (nothing else is parsed)
  prompt_template: str = math_data.QWEN_MATH_TEMPLATE
  # policy prompts longer than this many tokens are dropped (logged); 0 keeps every prompt
  max_prompt_tokens: int = 0
  # policy: a local Hugging Face checkpoint directory; "" is the built-in character model
  policy: str = ""
  # policy: token strings that end a completion besides the tokenizer's eos ids
  extra_stop_tokens: tuple[str, ...] = ()
  # policy and warm start; with a policy only POLICY_MODEL_KEYS may be set in model
  model: dict = dataclasses.field(default_factory=dict)
  model_seed: int = 0
  sft_steps: int = 500
  sft_batch_size: int = 256
  sft_lr: float = 1e-3
  cache_dir: str = builders.DEFAULT_DATA_DIR.replace("tfds", "policies")
  # rollouts
  recipe: str = "grpo"
  recipe_args: dict = dataclasses.field(default_factory=dict)
  num_prompts: int = 16
  group_size: int = 8
  max_new_tokens: int = 0  # 0: longest demonstration + 2
  temperature: float = 1.0
  top_p: float = 1.0
  dynamic_sampling_factor: int = 1  # DAPO: sample k*P groups, keep P with mixed outcomes
  dars_schedule: str = ""  # "", "et" (equal treatment) or "hw" (hardness weighted)
  dars_n_max: int = 32  # largest merged group (stage 1 + stage 2)
  dars_budget: int = 0  # stage-2 rows per step (static); 0: P * (n_max - G) (never truncates)
  # optimisation
  lr: float = 1e-4
  lr_schedule: str = "constant"  # or "cosine" (to 0 at the last optimizer update)
  lr_warmup_steps: int = 0  # linear warmup from 0 over this many optimizer updates
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  num_iterations: int = 1
  num_minibatches: int = 1
  # memory: each optimizer mini-batch in grad_accum sequential micro-batches (gradients summed,
  # the loss exactly the mini-batch's); per-layer rematerialisation; the LM head over chunks of
  # logits_chunk completion positions (0: all at once). Values are unchanged by all three.
  grad_accum: int = 1
  remat: bool = False
  logits_chunk: int = 0
  # rollouts sampled in sequential chunks of this many rows (0: all at once): bounds the KV cache
  rollout_chunk: int = 0
  steps: int = 500
  seed: int = 0
  # evaluation
  eval_every: int = 100
  eval_problems: int = 500
  eval_samples: int = 16
  eval_batch: int = 1024
  # weight averages evaluated beside the raw policy, e.g. "lawa:k=5,every=50;ema:decay=0.99"
  averaging: str = ""
  # devices: the rollout batch is split over a (data, fsdp) mesh of all devices
  mesh_fsdp: int = 1
  param_sharding: str = "replicate"  # or "fsdp"
  # run directory
  run_dir: str = ""
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  resume_fallback: bool = False  # resume from the previous checkpoint if the latest is corrupt
  # silent-failure guards (rlpost.train.guards): "warn", "stop" (save and end the run) or "off"
  guard_action: str = "warn"
  guard_patience: int = 50
  guard_truncated: float = 0.5
  guard_logp_mismatch: float = 0.05

  def validate(self) -> None:
    def need(cond, key, msg):
      if not cond:
        raise ValueError(f"config key {key!r}: {msg} (got {getattr(self, key)!r})")

    tasks = sorted(builders.BUILDERS) + list(math_data.FILE_TASKS)
    need(self.task in tasks, "task", f"must be one of {tasks}")
    if self.task in math_data.FILE_TASKS:
      need(bool(self.policy), "task", "needs a Hugging Face policy (config key 'policy'): real "
           "text is outside the character tokenizer's alphabet")
      need(set(self.task_spec) == set(math_data.SPLITS), "task_spec",
           "must name local files: {'train': path, 'test': path}")
      need(not self.graded_reward, "graded_reward", "only the arithmetic task has a graded reward")
      need("{question}" in self.prompt_template, "prompt_template", "must contain '{question}'")
    if self.policy:
      need(self.task != "arithmetic", "task", "arithmetic is scored on character-tokenizer ids; "
           f"with a policy use one of {['countdown', *math_data.FILE_TASKS]}")
      need(self.sft_steps == 0, "sft_steps", "must be 0 with a policy: the checkpoint is the "
           "starting policy (the SFT warm start is for the built-in character model)")
      need(self.max_new_tokens >= 1, "max_new_tokens", "must be set (>= 1) with a policy")
      fixed = sorted(set(self.model) - set(POLICY_MODEL_KEYS))
      if fixed:
        raise ValueError(f"config key 'model': {fixed} cannot be set when 'policy' is set (the "
                         f"architecture comes from {os.path.join(self.policy, 'config.json')}); "
                         f"only {list(POLICY_MODEL_KEYS)} apply")
      for key in ("dtype", "param_dtype"):
        if key in self.model and self.model[key] not in ("float32", "bfloat16", "float16"):
          raise ValueError(f"config key 'model': {key} must be 'float32', 'bfloat16' or "
                           f"'float16' (got {self.model[key]!r})")
      seq = self.model.get("max_seq_len", 1)
      if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"config key 'model': max_seq_len must be a positive int (got {seq!r})")
    for key in ("lr", "sft_lr", "b1", "b2", "weight_decay", "grad_clip", "temperature", "top_p",
                "guard_truncated", "guard_logp_mismatch"):
      need(math.isfinite(getattr(self, key)), key, "must be a finite number")
    need(self.sft_steps >= 0, "sft_steps", "must be >= 0 (0: no SFT warm start)")
    need(self.sft_batch_size >= 1, "sft_batch_size", "must be >= 1")
    need(self.sft_lr > 0, "sft_lr", "must be > 0")
    need(0 <= self.b1 < 1, "b1", "must be in [0, 1)")
    need(0 <= self.b2 < 1, "b2", "must be in [0, 1)")
    need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
    need(self.grad_clip > 0, "grad_clip", "must be > 0")
    need(self.num_train >= 1, "num_train", "must be >= 1")
    need(self.num_test >= 1, "num_test", "must be >= 1")
    need(self.eval_problems >= 0, "eval_problems", "must be >= 0 (0: the whole test split)")
    if self.task not in math_data.FILE_TASKS:
      need(self.eval_problems <= self.num_test, "eval_problems",
           f"exceeds the {self.num_test} problems of the test split (num_test); use "
           "eval_problems=0 for all of them")
    need(self.eval_batch >= 1, "eval_batch", "must be >= 1")
    need(self.max_prompt_tokens >= 0, "max_prompt_tokens", "must be >= 0")
    need(self.policy or not self.extra_stop_tokens, "extra_stop_tokens",
         "needs a policy (the character model stops at its EOS only)")
    need(self.lr_schedule in ("constant", "cosine"), "lr_schedule",
         "must be 'constant' or 'cosine'")
    need(self.lr_warmup_steps >= 0, "lr_warmup_steps", "must be >= 0")
    need(self.group_size >= 1, "group_size", "G must be >= 1")
    need(self.num_prompts >= 1, "num_prompts", "must be >= 1")
    need(self.steps >= 0, "steps", "must be >= 0")
    need(self.lr > 0, "lr", "must be > 0")
    need(self.temperature > 0, "temperature", "RL sampling needs temperature > 0")
    need(0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
    need(self.num_iterations >= 1, "num_iterations", "must be >= 1")
    need(self.num_minibatches >= 1, "num_minibatches", "must be >= 1")
    need(self.grad_accum >= 1, "grad_accum", "must be >= 1")
    need(self.logits_chunk >= 0, "logits_chunk", "must be >= 0")
    need(self.eval_samples >= 1, "eval_samples", "must be >= 1")
    if self.averaging:
      from rlpost import averaging

      try:
        averaging.parse_specs(self.averaging)
      except ValueError as e:
        raise ValueError(f"config key 'averaging': {e}") from None
    need(self.dynamic_sampling_factor >= 1, "dynamic_sampling_factor", "must be >= 1")
    need(self.dars_schedule in ("", "et", "hw"), "dars_schedule", "must be '', 'et' or 'hw'")
    need(not (self.dars_schedule and self.dynamic_sampling_factor > 1), "dars_schedule",
         "DARS and DAPO dynamic sampling are exclusive")
    need(not self.dars_schedule or self.dars_n_max >= self.group_size, "dars_n_max",
         "must be >= group_size")
    need(self.dars_budget >= 0, "dars_budget", "must be >= 0")
    need(self.eval_every >= 1, "eval_every", "must be >= 1")
    need(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
    need(self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
    need(self.guard_action in ("warn", "stop", "off"), "guard_action",
         "must be 'warn', 'stop' or 'off'")
    need(self.guard_patience >= 1, "guard_patience", "must be >= 1")
    need(0 <= self.guard_truncated <= 1, "guard_truncated", "must be in [0, 1]")
    need(self.guard_logp_mismatch > 0, "guard_logp_mismatch", "must be > 0")
    need(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
    need(self.param_sharding in ("replicate", "fsdp"), "param_sharding",
         "must be 'replicate' or 'fsdp'")
    n_dev = len(jax.devices())
    need(self.mesh_fsdp >= 1 and n_dev % self.mesh_fsdp == 0, "mesh_fsdp",
         f"must divide the number of devices ({n_dev})")
    rows = self.num_prompts * self.group_size + self.resolved_dars_budget
    need(rows % self.num_minibatches == 0, "num_minibatches",
         f"must divide the rollout batch of {rows} rows")
    need((rows // self.num_minibatches) % n_dev == 0,
         "num_prompts", f"the mini-batch of {rows // self.num_minibatches} rollouts must be "
         f"divisible by the {n_dev} devices of the mesh")
    if self.rollout_chunk:
      calls = [self.num_prompts * self.group_size * self.dynamic_sampling_factor]
      if self.dars_schedule:
        calls.append(self.resolved_dars_budget)
      need(self.rollout_chunk % n_dev == 0 and all(c % self.rollout_chunk == 0 for c in calls),
           "rollout_chunk", f"must divide every sampling call's rows {calls} and be divisible "
           f"by the {n_dev} devices of the mesh")
    mb = rows // self.num_minibatches
    need(mb % self.grad_accum == 0 and (mb // self.grad_accum) % n_dev == 0, "grad_accum",
         f"must split the mini-batch of {mb} rollouts into micro-batches divisible by the "
         f"{n_dev} devices of the mesh")
    if self.recipe not in obj.list_recipes():
      raise ValueError(f"config key 'recipe': unknown recipe {self.recipe!r}; "
                       f"known: {list(obj.list_recipes())}")
    # The recipe's arguments, checked now (building it is cheap) rather than after the data
    # and the SFT warm start; lengths not known yet stand in as max_new_tokens or 16.
    _recipe(self, self.max_new_tokens or 16)
    unknown = set(self.model) - {f.name for f in dataclasses.fields(tfm.TransformerConfig)}
    if unknown:
      raise ValueError(f"config key 'model': unknown TransformerConfig field(s) {sorted(unknown)}")


  @property
  def resolved_dars_budget(self) -> int:
    if not self.dars_schedule:
      return 0
    return self.dars_budget or self.num_prompts * (self.dars_n_max - self.group_size)


class RLState(NamedTuple):
  """The carry of training: everything a checkpoint must hold to resume bit for bit."""

  params: Any
  opt_state: Any
  key: jax.Array  # raw uint32 key data (typed keys are not checkpointable as is)
  step: jax.Array  # int32 []
  cursor: jax.Array  # int32 [], prompts consumed so far


class Rollouts(NamedTuple):
  """Sampled and scored rows: prompt ids [R], prompts [R, Tp], completions [R, N], log-probs
  under the sampling policy [R, N], finish reasons, rewards [R] and correctness [R]."""

  idx: jax.Array
  prompts: jax.Array
  pmask: jax.Array
  tokens: jax.Array
  mask: jax.Array
  logp: jax.Array
  finish: jax.Array
  rewards: jax.Array
  correct: jax.Array


class TaskArrays(NamedTuple):
  """A split on device: prompts left-padded [N, Tp], answers right-padded [N, A]."""

  prompt_tokens: jax.Array
  prompt_mask: jax.Array
  answer: jax.Array
  answer_len: jax.Array
  difficulty: jax.Array


def _task_arrays(rows, tok: CharTokenizer) -> TaskArrays:
  prompts = [r["prompt"] for r in rows]
  tp = max(len(p) for p in prompts) + 1
  pt, pm = tok.encode_batch(prompts, tp, bos=True, side="left")
  ans, ans_len = arithmetic.encode_answers([r["answer"] for r in rows], tok,
                                           max(len(r["answer"]) for r in rows))
  return TaskArrays(jnp.asarray(pt), jnp.asarray(pm), jnp.asarray(ans), jnp.asarray(ans_len),
                    jnp.asarray([r["difficulty"] for r in rows], jnp.int32))


def _policy_task_arrays(rows, ids: list[list[int]], tok, length: int) -> TaskArrays:
  """Prompt ids left-padded with the tokenizer's pad id to [N, length]; the answer arrays are
  empty ([N, 1] zeros: these tasks are scored on the host from decoded text)."""
  pt, pm = tok.pad(ids, length=length, side="left")
  n = len(rows)
  return TaskArrays(jnp.asarray(pt), jnp.asarray(pm), jnp.zeros((n, 1), jnp.int32),
                    jnp.zeros((n,), jnp.int32),
                    jnp.asarray([r["difficulty"] for r in rows], jnp.int32))


def learning_rate(*, lr: float, schedule: str, warmup_steps: int, total_steps: int):
  """The optimizer's learning rate: a float, or an optax schedule of the update count.

  Linear warmup from 0 over ``min(warmup_steps, total_steps)`` updates (lr * n / warmup at
  update n), then ``schedule``: "constant" (lr) or "cosine" (lr * (1 + cos(pi * m / M)) / 2 at
  the m-th of the M = total - warmup remaining updates, reaching 0 at the end). Without warmup
  a constant schedule is the plain float ``lr``.
  """
  if schedule not in ("constant", "cosine"):
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected 'constant' or "
                     "'cosine'")
  if schedule == "constant" and warmup_steps == 0:
    return lr
  warm = min(warmup_steps, total_steps)
  after = (optax.constant_schedule(lr) if schedule == "constant"
           else optax.cosine_decay_schedule(lr, max(total_steps - warm, 1)))
  if warm == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), after], [warm])


def _recipe(cfg: RLConfig, max_len: int) -> obj.Recipe:
  """The configured recipe; length-dependent arguments default to this run's max_new_tokens."""
  args = dict(cfg.recipe_args)
  params = inspect.signature(obj.recipes._REGISTRY[cfg.recipe]).parameters
  if "max_length" in params and "max_length" not in args:
    args["max_length"] = max_len
  if "overlong_buffer" in params and "overlong_buffer" not in args:
    # The DAPO paper's ratio: a 4096-token buffer for 20480-token completions.
    args["overlong_buffer"] = max(1, args.get("max_length", max_len) // 5)
  try:
    return obj.get_recipe(cfg.recipe, **args)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config key 'recipe_args': {e}") from None


def _unpack_key(data: jax.Array) -> jax.Array:
  return jax.random.wrap_key_data(data)


class Trainer:
  """Host-side setup plus the pure, jitted step and evaluation functions of one run."""

  def __init__(self, cfg: RLConfig, *, log: Callable[[str], None] = print):
    self.cfg = cfg
    self.log = log
    model = self._init_policy(cfg) if cfg.policy else self._init_char_policy(cfg)
    self.mesh = sharding.make_mesh(fsdp=cfg.mesh_fsdp)
    self.graphdef, ref_params = nnx.split(model)
    del model
    self.ref_params = sharding.shard_params(ref_params, self.mesh, mode=cfg.param_sharding)
    self.recipe = _recipe(cfg, self.max_new_tokens)
    self.needs_ref = "ref_logp" in self.recipe.requires
    self.needs_entropy = "entropy" in self.recipe.requires
    updates = cfg.steps * cfg.num_iterations * cfg.num_minibatches
    self.optimizer = optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(learning_rate(lr=cfg.lr, schedule=cfg.lr_schedule,
                                  warmup_steps=cfg.lr_warmup_steps, total_steps=updates),
                    b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))
    self.sampling_cfg = sampling.SamplingConfig(
        max_new_tokens=self.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        stop_tokens=self.stop_tokens, pad_id=self.pad_id)
    self.dars_budget = cfg.resolved_dars_budget
    self.num_traces = 0
    self._jit_step = None
    self._eval_fns = {}

  # ---------------------------------------------------------------------------------- policy
  def _init_char_policy(self, cfg: RLConfig) -> tfm.Transformer:
    """The built-in character-level decoder on a synthetic task, SFT warm-started (cached)."""
    self.tok = CharTokenizer()
    self.stop_tokens, self.pad_id = (EOS,), PAD
    data = builders.build(cfg.task, spec=cfg.task_spec, num_train=cfg.num_train,
                          num_test=cfg.num_test, seed=cfg.data_seed, data_dir=cfg.data_dir)
    self.rows = data
    self.train_data = _task_arrays(data["train"], self.tok)
    self.test_data = _task_arrays(data["test"], self.tok)
    longest_demo = max(len(r["demo"]) for r in data["train"] + data["test"])
    self.max_new_tokens = cfg.max_new_tokens or longest_demo + 2
    tp = max(self.train_data.prompt_tokens.shape[1], self.test_data.prompt_tokens.shape[1])
    model_kw = dict(DEFAULT_MODEL, **cfg.model)
    model_kw.setdefault("vocab_size", self.tok.vocab_size)
    model_kw["max_seq_len"] = max(model_kw["max_seq_len"], tp + longest_demo + 2,
                                  tp + self.max_new_tokens)
    self.model_cfg = tfm.TransformerConfig(**model_kw)
    self.model = tfm.init_model(self.model_cfg, seed=cfg.model_seed)
    sft_cfg = sft.SFTConfig(steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
                            seed=cfg.model_seed)
    key = sft.cache_key(self.model_cfg, sft_cfg, cfg.task, cfg.task_spec, cfg.num_train,
                        cfg.num_test, cfg.data_seed, cfg.model_seed)
    if cfg.sft_steps > 0:
      sft.cached_sft(self.model, data["train"], self.tok, sft_cfg, cfg.cache_dir, key,
                     log=self.log)
    return self.model

  def _init_policy(self, cfg: RLConfig) -> tfm.Transformer:
    """A Hugging Face checkpoint and its tokenizer on a host-scored task (no SFT)."""
    from rlpost.models import hf

    path = cfg.policy
    if not os.path.isdir(path):
      raise FileNotFoundError(f"config key 'policy': {path} is not a directory (expected a Hugging "
                              "Face checkpoint: config.json, *.safetensors, tokenizer.json)")
    try:
      tok = hf.load_tokenizer(path)
      model = hf.load_pretrained(path, dtype=cfg.model.get("dtype", "float32"),
                                 param_dtype=cfg.model.get("param_dtype"))
    except (FileNotFoundError, ValueError) as e:
      raise type(e)(f"config key 'policy' ({path}): {e}") from None
    if not tok.eos_ids:
      raise ValueError(f"config key 'policy' ({path}): the tokenizer has no eos token id "
                       "(tokenizer_config.json eos_token, or eos_token_id in "
                       "generation_config.json / config.json); generation could never stop")
    if tok.vocab_size > model.cfg.vocab_size:
      raise ValueError(f"config key 'policy' ({path}): the tokenizer has {tok.vocab_size} tokens "
                       f"but the model's vocab_size is {model.cfg.vocab_size}")
    if "max_seq_len" in cfg.model:
      model.cfg = model.cfg.replace(max_seq_len=int(cfg.model["max_seq_len"]))
    extra = []
    for s in cfg.extra_stop_tokens:
      tid = tok.token_to_id(s)
      if tid is None:
        raise ValueError(f"config key 'extra_stop_tokens': {s!r} is not a token of {path}")
      extra.append(tid)
    self.tok = tok
    self.stop_tokens = tuple(dict.fromkeys([*tok.eos_ids, *extra]))
    self.pad_id = tok.pad_id
    if cfg.task in math_data.FILE_TASKS:
      data = math_data.load_task(cfg.task, cfg.task_spec)
      caps = {"train": cfg.num_train, "test": cfg.num_test}
      for split, rows in data.items():
        if len(rows) > caps[split]:
          self.log(f"{cfg.task} {split}: using the first {caps[split]} of {len(rows)} records "
                   f"(num_{split})")
          data[split] = rows[:caps[split]]
      template = cfg.prompt_template
    else:
      data = builders.build(cfg.task, spec=cfg.task_spec, num_train=cfg.num_train,
                            num_test=cfg.num_test, seed=cfg.data_seed, data_dir=cfg.data_dir)
      template = "{question}"  # synthetic prompts are used as they are
    ids = {}
    for split, rows in data.items():
      enc = tok.encode_batch([math_data.format_prompt(template, r["prompt"]) for r in rows])
      empty = [i for i, e in enumerate(enc) if not e]
      if empty:
        raise ValueError(f"{cfg.task} {split}: prompt of record {empty[0]} encodes to no tokens")
      if cfg.max_prompt_tokens:
        keep = [i for i, e in enumerate(enc) if len(e) <= cfg.max_prompt_tokens]
        if len(keep) < len(enc):
          self.log(f"{cfg.task} {split}: dropped {len(enc) - len(keep)} of {len(enc)} prompts "
                   f"longer than max_prompt_tokens={cfg.max_prompt_tokens}")
        if not keep:
          raise ValueError(f"{cfg.task} {split}: every prompt is longer than max_prompt_tokens="
                           f"{cfg.max_prompt_tokens}")
        rows, enc = [rows[i] for i in keep], [enc[i] for i in keep]
      data[split], ids[split] = rows, enc
    self.rows = data
    if cfg.eval_problems > len(data["test"]):
      self.log(f"eval_problems={cfg.eval_problems} exceeds the {len(data['test'])} {cfg.task} "
               f"test problems: evaluating all {len(data['test'])}")
    tp = max(len(e) for split in ids.values() for e in split)
    self.train_data = _policy_task_arrays(data["train"], ids["train"], tok, tp)
    self.test_data = _policy_task_arrays(data["test"], ids["test"], tok, tp)
    self.max_new_tokens = cfg.max_new_tokens
    if tp + self.max_new_tokens > model.cfg.max_seq_len:
      raise ValueError(
          f"prompts of up to {tp} tokens + max_new_tokens {self.max_new_tokens} exceed the "
          f"policy's max_seq_len {model.cfg.max_seq_len} ({path}/config.json "
          "max_position_embeddings); lower 'max_prompt_tokens' or 'max_new_tokens', or set "
          "model={'max_seq_len': ...}")
    self.model_cfg = model.cfg
    self.log(f"policy {path}: {model.cfg.num_params() / 1e6:.1f}M parameters, "
             f"{tok.vocab_size} tokens, stop ids {list(self.stop_tokens)}, pad id {self.pad_id}; "
             f"{len(data['train'])} train / {len(data['test'])} test prompts of <= {tp} tokens; "
             "no SFT warm start")
    return model

  # ---------------------------------------------------------------------------------- state
  def init_state(self) -> RLState:
    """The state at step 0: parameters placed by the sharding rule, the rest replicated."""
    params = self.ref_params
    replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
    rest = [sharding.put(x, replicated) for x in
            (jax.random.key_data(jax.random.key(self.cfg.seed)), jnp.int32(0), jnp.int32(0))]
    opt_state = jax.jit(self.optimizer.init)(params)  # moments follow the parameters' sharding
    # Placed explicitly (committed), as the step's outputs are: jit keys its cache on
    # committed-ness, so uncommitted moments would compile the step a second time at step 2.
    opt_state = jax.tree.map(
        lambda x: sharding.put(x, x.sharding if len(x.sharding.device_set) == len(
            self.mesh.devices.flat) else replicated), opt_state)
    return RLState(params, opt_state, *rest)

  def step(self, state: RLState):
    """One RL step: ``(state) -> (state, metrics)``, jitted; the output state keeps the input
    state's shardings, so one compilation serves the whole run (and resumed runs)."""
    if self._jit_step is None:
      shardings = jax.tree.map(lambda x: x.sharding, state)
      self._jit_step = jax.jit(self._step, out_shardings=(shardings, None))
    return self._jit_step(state)

  # ---------------------------------------------------------------------------------- reward
  def _reward(self, tokens, mask, idx, data: TaskArrays):
    """Rewards [B] float32 and correctness [B] bool for completions of prompts ``idx`` [B]."""
    if self.cfg.task == "arithmetic":
      return arithmetic.reward(tokens, mask, data.answer[idx], data.answer_len[idx], self.tok,
                               graded=self.cfg.graded_reward)
    return host_reward(self._score_host, tokens, mask, idx, split_id=int(data is self.test_data))

  def _score_host(self, tokens: np.ndarray, mask: np.ndarray, idx: np.ndarray, split: int):
    rows = self.rows["test" if split else "train"]
    out = np.zeros(len(idx), np.float32)
    file_task = self.cfg.task in math_data.FILE_TASKS
    for b, (t, m, i) in enumerate(zip(tokens, mask, idx)):
      text = self.tok.decode(t[m])
      if file_task:
        out[b] = math_data.score_math(text, rows[int(i)]["answer"])
      else:
        finished = bool(np.any(np.isin(t, self.stop_tokens) & m))
        out[b] = countdown.score(text, finished, rows[int(i)]["prompt"])
    return out

  def _final_answer(self, text: str):
    """The answer a completion votes for in maj@k (None: no answer)."""
    if self.cfg.task in math_data.FILE_TASKS:
      return math_data.canonical_answer(math_data.extract_answer(text))
    return text.split(",")[-1] or None

  # ---------------------------------------------------------------------------------- step
  def _prompt_indices(self, cursor, n_items, key):
    """Indices of the next ``n_items`` prompts of an epoch-wise shuffled stream at ``cursor``."""
    n = self.train_data.prompt_tokens.shape[0]
    pos = cursor + jnp.arange(n_items)
    epoch = pos // n
    e0 = cursor // n
    p0 = jax.random.permutation(jax.random.fold_in(key, e0), n)
    p1 = jax.random.permutation(jax.random.fold_in(key, e0 + 1), n)
    return jnp.where(epoch == e0, p0[pos % n], p1[pos % n])

  def _rows(self, x):
    """Constrain x's leading (rollout) dimension to be split over the mesh."""
    spec = sharding.batch_spec(x.ndim)
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(self.mesh, spec))

  def _policy_logp(self, params, prompts, pmask, tokens, tmask, *, entropy: bool = False):
    """logp [R, N] of completions under ``params`` and, with ``entropy``, the token entropy."""
    model = nnx.merge(self.graphdef, params)
    return tfm.completion_scores(model, prompts, pmask, tokens, tmask, entropy=entropy,
                                 logits_chunk=self.cfg.logits_chunk, remat=self.cfg.remat)

  def _sample_rows(self, params, idx, key):
    """Sample and score one completion per row for prompts ``idx`` [R] (rows split over the mesh)."""
    data = self.train_data
    idx = self._rows(idx)
    prompts, pmask = self._rows(data.prompt_tokens[idx]), self._rows(data.prompt_mask[idx])
    r, c = idx.shape[0], self.cfg.rollout_chunk
    # One key per row: a row's completion depends on its own key only, so sampling in chunks
    # (rollout_chunk) draws the same rows as sampling all at once.
    keys = self._rows(jax.random.split(key, r))
    if c <= 0 or c >= r:
      out = sampling.sample(self.graphdef, params, prompts, pmask, keys, cfg=self.sampling_cfg)
    else:
      # Sequential chunks of c rows: one KV cache of c rows at a time.
      def chunk(args):
        p, m, k = args
        return sampling.sample(self.graphdef, params, self._rows(p), self._rows(m), self._rows(k),
                               cfg=self.sampling_cfg)

      out = jax.lax.map(chunk, (prompts.reshape(r // c, c, -1), pmask.reshape(r // c, c, -1),
                                keys.reshape(r // c, c)))
      out = jax.tree.map(lambda x: self._rows(x.reshape(r, *x.shape[2:])) if x.ndim >= 2
                         else jnp.max(x), out)  # per-chunk scalars (num_steps): the longest
    rewards, correct = self._reward(out.tokens, out.mask, idx, data)
    return Rollouts(idx, prompts, pmask, out.tokens, out.mask, out.policy_logprobs,
                    out.finish_reason, rewards, correct)

  def _collect(self, params, cursor, key, data_key):
    """Rollouts for one step, with static shapes whatever the allocation rule.

    Returns (rollouts [R rows], group_id [R], valid [R], prompts consumed, extra metrics).
    Plain: R = P*G. DAPO dynamic sampling (factor k): P*k groups are sampled, the first P with
    mixed outcomes are kept (rows of missing groups are invalid). DARS: P*N stage-1 rows plus a
    fixed budget of stage-2 rows assigned to prompts by the schedule; groups whose merged
    accuracy is 0 or 1 are dropped.
    """
    cfg = self.cfg
    p, g = cfg.num_prompts, cfg.group_size
    k1, k2 = jax.random.split(key)
    if cfg.dars_schedule:
      pidx = self._prompt_indices(cursor, p, data_key)
      r1 = self._sample_rows(params, jnp.repeat(pidx, g), k1)
      acc = r1.rewards.reshape(p, g).mean(axis=1)
      extra = dars.extra_rollouts(acc, g, cfg.dars_n_max, schedule=cfg.dars_schedule)
      budget = self.dars_budget
      cum = jnp.cumsum(extra)
      owner = jnp.searchsorted(cum, jnp.arange(budget), side="right")  # [R2]
      valid2 = jnp.arange(budget) < cum[-1]
      owner = jnp.minimum(owner, p - 1)
      r2 = self._sample_rows(params, pidx[owner], k2)
      ro = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), r1, r2)
      group = jnp.concatenate([jnp.repeat(jnp.arange(p), g), owner]).astype(jnp.int32)
      valid = jnp.concatenate([jnp.ones((p * g,), bool), valid2])
      n_valid = jax.ops.segment_sum(valid.astype(jnp.int32), group, p)
      n_right = jax.ops.segment_sum((valid & ro.correct).astype(jnp.int32), group, p)
      mixed = (n_right > 0) & (n_right < n_valid)
      stage2_right = jax.ops.segment_sum((valid2 & r2.correct).astype(jnp.int32), owner, p)
      metrics = dict(
          dars_extra_rollouts=jnp.sum(jnp.minimum(cum[-1], budget)).astype(jnp.float32),
          dars_budget_used=jnp.minimum(cum[-1], budget) / max(budget, 1),
          dars_all_wrong_stage1=jnp.sum(acc == 0).astype(jnp.float32),
          dars_rescued=jnp.sum((acc == 0) & (stage2_right > 0)).astype(jnp.float32),
          kept_groups=jnp.mean(mixed.astype(jnp.float32)))
      return ro, group, valid & mixed[group], p, metrics
    k = cfg.dynamic_sampling_factor
    pidx = self._prompt_indices(cursor, p * k, data_key)
    ro = self._sample_rows(params, jnp.repeat(pidx, g), k1)
    if k == 1:
      group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
      return ro, group, jnp.ones((p * g,), bool), p, {}
    right = ro.correct.reshape(p * k, g).sum(axis=1)
    mixed = (right > 0) & (right < g)
    chosen = jnp.argsort(~mixed, stable=True)[:p]  # mixed groups first, in sampling order
    rows = (chosen[:, None] * g + jnp.arange(g)[None, :]).reshape(-1)
    ro = jax.tree.map(lambda x: self._rows(x[rows]), ro)
    group = jnp.repeat(jnp.arange(p, dtype=jnp.int32), g)
    valid = jnp.repeat(mixed[chosen], g)
    metrics = dict(kept_groups=jnp.mean(mixed[chosen].astype(jnp.float32)),
                   mixed_fraction_sampled=jnp.mean(mixed.astype(jnp.float32)))
    return ro, group, valid, p * k, metrics

  def _step(self, state: RLState):
    self.num_traces += 1  # trace-time side effect: counts compilations
    step_root, data_root = jax.random.split(_unpack_key(state.key))
    key = jax.random.fold_in(step_root, state.step)
    k_sample, k_adv, k_mb = jax.random.split(key, 3)
    # Rollout rows are split over every device of the mesh; everything downstream (sampling,
    # reward, log-probs, loss) follows that split, and the compiler sums the gradients.
    collected = self._collect(state.params, state.cursor, k_sample, data_root)
    return self._update(state, collected, k_adv, k_mb)

  def _update(self, state: RLState, collected, k_adv, k_mb):
    """Reference log-probs, advantages and the optimizer epochs on collected rollouts."""
    cfg = self.cfg
    ro, group, valid, consumed, extra_metrics = collected
    b = ro.rewards.shape[0]
    ref_logp = None
    if self.needs_ref:
      # In the update's micro-batch size (one call when the update takes all rows at once).
      chunk = b // (cfg.num_minibatches * cfg.grad_accum)

      def ref_rows(r):
        r = self._rows(r)
        return self._policy_logp(self.ref_params, ro.prompts[r], ro.pmask[r], ro.tokens[r],
                                 ro.mask[r])[0]

      if chunk == b:
        ref_logp = ref_rows(jnp.arange(b))
      else:
        ref_logp = jax.lax.map(ref_rows, jnp.arange(b).reshape(-1, chunk))
        ref_logp = ref_logp.reshape(b, -1)
      ref_logp = jax.lax.stop_gradient(ref_logp)
    batch = RolloutBatch(group_id=group, valid=valid, tokens=ro.tokens, token_mask=ro.mask,
                         rewards=ro.rewards, behaviour_logp=ro.logp, ref_logp=ref_logp,
                         correct=ro.correct)
    finite = obj.check_finite(batch)
    adv, _ = obj.compute_advantages(self.recipe.advantage, batch, key=k_adv)

    mb = b // cfg.num_minibatches

    def loss_parts(params, rows):
      """The recipe's (sum, denominator) loss over rollout rows ``rows``, its metrics (also
      pairs) and the sampler-vs-trainer log-prob gap as a pair; pairs of disjoint row sets add
      up (``obj.combine``), which is what makes micro-batching exact."""
      rows = self._rows(rows)
      sub = jax.tree.map(lambda x: x[rows], batch)
      logp, ent = self._policy_logp(params, ro.prompts[rows], ro.pmask[rows], sub.tokens,
                                    sub.token_mask, entropy=self.needs_entropy)
      parts, metrics = self.recipe.loss_fn(logp, sub, adv.values[rows], adv.weights[rows],
                                           entropy=ent)
      # Sampler vs trainer log-probs of the same tokens; only the first mini-batch of the
      # first epoch sees the sampling parameters, so only that value is reported.
      tok = sub.token_mask & sub.valid[:, None]
      gap = jnp.abs(jax.lax.stop_gradient(logp) - sub.behaviour_logp)
      mismatch = obj.LossParts(jnp.sum(jnp.where(tok, gap, 0.0)),
                               jnp.sum(tok).astype(jnp.float32))
      return parts, (metrics, mismatch)

    def minibatch_grads(params, rows):
      """(loss, metrics, mismatch, grads) of one mini-batch, over grad_accum micro-batches."""
      if cfg.grad_accum == 1:
        def loss_fn(params):
          parts, aux = loss_parts(params, rows)
          return obj.finalize(parts), aux

        (loss, (metrics, mismatch)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return loss, metrics, obj.finalize(mismatch), grads

      def micro(acc, r):
        # d(sum)/d(params) per micro-batch; the denominators (token or row counts) do not
        # depend on the parameters, so the mini-batch gradient is the summed one over the
        # summed denominator, as for the loss.
        def sum_fn(params):
          parts, aux = loss_parts(params, r)
          return parts.sum, (parts, aux)

        (_, out), g = jax.value_and_grad(sum_fn, has_aux=True)(params)
        return jax.tree.map(jnp.add, acc, (g, out)), None

      micro_rows = rows.reshape(cfg.grad_accum, -1)
      shapes = jax.eval_shape(lambda p, r: (jax.grad(lambda q: loss_parts(q, r)[0].sum)(p),
                                            loss_parts(p, r)), params, micro_rows[0])
      zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
      (g_sum, (parts, (metrics, mismatch))), _ = jax.lax.scan(micro, zeros, micro_rows)
      grads = jax.tree.map(lambda g: obj.safe_divide(g, parts.denominator), g_sum)
      return obj.finalize(parts), metrics, obj.finalize(mismatch), grads

    def minibatch_update(carry, rows):
      params, opt_state = carry
      loss, metrics, mismatch, grads = minibatch_grads(params, rows)
      updates, opt_state = self.optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      stats = {k: obj.finalize(v) for k, v in metrics.items()}
      stats["logp_mismatch"] = mismatch
      stats["loss"] = loss
      stats["grad_norm"] = optax.tree.norm(grads)
      return (params, opt_state), stats

    def epoch(carry, i):
      perm = jax.random.permutation(jax.random.fold_in(k_mb, i), b).reshape(cfg.num_minibatches, mb)
      return jax.lax.scan(minibatch_update, carry, perm)

    (params, opt_state), stats = jax.lax.scan(epoch, (state.params, state.opt_state),
                                              jnp.arange(cfg.num_iterations))
    first_mismatch = stats.pop("logp_mismatch")[0, 0]
    stats = jax.tree.map(jnp.mean, stats)
    stats["logp_mismatch"] = first_mismatch
    vf = valid.astype(jnp.float32)
    n_valid = jnp.maximum(jnp.sum(vf), 1.0)
    metrics = dict(
        stats,
        **extra_metrics,
        reward=jnp.sum(ro.rewards * vf) / n_valid,
        accuracy=jnp.sum(ro.correct * vf) / n_valid,
        zero_variance_groups=obj.zero_variance_fraction(batch.rewards, batch.group_id, batch.valid),
        response_length=jnp.sum(jnp.sum(ro.mask, axis=1) * vf) / n_valid,
        truncated=jnp.sum((ro.finish == sampling.FINISH_LENGTH) * vf) / n_valid,
        adv_abs=jnp.sum(jnp.abs(adv.values) * adv.weights) / jnp.maximum(jnp.sum(adv.weights), 1),
        nonfinite_batch=(~finite.ok).astype(jnp.int32),
        **self._confidence_metrics(batch),
        nonfinite_index=finite.first_bad_index,
        nonfinite_field=finite.field,
        nonfinite_prompt=ro.idx[jnp.maximum(finite.first_bad_index, 0)],
        nonfinite_group=group[jnp.maximum(finite.first_bad_index, 0)],
        nonfinite_params=(~_all_finite(params)).astype(jnp.int32),
    )
    new_state = RLState(params=params, opt_state=opt_state, key=state.key, step=state.step + 1,
                        cursor=state.cursor + consumed)
    return new_state, metrics

  def _confidence_metrics(self, batch: RolloutBatch) -> dict:
    """ACE's diagnostics where reference log-probs exist: the share of overconfident errors
    (wrong rollouts the policy made more likely than the reference did) and the mean
    confidence shift c_i = sum_t (logp - ref_logp) under the sampling policy."""
    if batch.ref_logp is None:
      return {}
    shift = obj.confidence_shift(batch.behaviour_logp, batch.ref_logp, batch.token_mask)
    vf = batch.valid.astype(jnp.float32)
    return dict(
        overconfident_errors=obj.overconfident_error_fraction(shift, batch.correct, batch.valid),
        confidence_shift=jnp.sum(shift * vf) / jnp.maximum(jnp.sum(vf), 1.0))

  # ---------------------------------------------------------------------------------- eval
  def evaluate(self, params, *, num_problems: int | None = None, num_samples: int | None = None,
               seed: int = 1234) -> dict:
    """pass@k (k = 1, 2, 4, ... n), accuracy, greedy pass@1, maj@k and token entropy on the
    test split, overall and per difficulty. Sampling at the training temperature."""
    cfg = self.cfg
    data = self.test_data
    n_test = data.prompt_tokens.shape[0]
    n_prob = min(num_problems or cfg.eval_problems or n_test, n_test)
    n = num_samples or cfg.eval_samples
    rows = max(1, cfg.eval_batch // n) * n  # rows per call: whole problems
    per_call = rows // n
    fn = self._eval_fn(rows)
    greedy_fn = self._eval_fn(per_call, greedy=True)
    correct, answers, surprisal, tokens_count, greedy = [], [], 0.0, 0, []
    for start in range(0, n_prob, per_call):
      prob = np.arange(start, start + per_call) % data.prompt_tokens.shape[0]
      idx = jnp.asarray(np.repeat(prob, n), jnp.int32)
      key = jax.random.fold_in(jax.random.key(seed), start)
      out, r_ok = fn(params, idx, key)
      keep = min(per_call, n_prob - start)
      ok = np.asarray(r_ok).reshape(per_call, n)[:keep]
      correct.append(ok)
      toks = np.asarray(out.tokens).reshape(per_call, n, -1)[:keep]
      msk = np.asarray(out.mask).reshape(per_call, n, -1)[:keep]
      for pt, pm in zip(toks, msk):
        answers.append([self._final_answer(self.tok.decode(t[m])) for t, m in zip(pt, pm)])
      lp = np.asarray(out.policy_logprobs).reshape(per_call, n, -1)[:keep]
      surprisal += float(-(lp * msk).sum())
      tokens_count += int(msk.sum())
      _, g_ok = greedy_fn(params, jnp.asarray(prob, jnp.int32), key)
      greedy.append(np.asarray(g_ok)[:keep])
    correct = np.concatenate(correct)
    diff = np.asarray(data.difficulty)[:n_prob]
    res = evm.summarize_passk(correct, diff, evm.ks_up_to(n))
    res["greedy_pass@1"] = float(np.concatenate(greedy).mean())
    refs = [r["answer"] for r in self.rows["test"][:n_prob]]
    if self.cfg.task in math_data.FILE_TASKS:
      refs = [math_data.canonical_answer(r) for r in refs]
    for k in [k for k in evm.ks_up_to(n) if k > 1][:3]:
      res[f"maj@{k}"] = evm.majority_at_k(answers, refs, k)
    res["token_entropy"] = surprisal / max(tokens_count, 1)
    return res

  def _eval_fn(self, rows: int, greedy: bool = False):
    if (rows, greedy) not in self._eval_fns:
      scfg = dataclasses.replace(self.sampling_cfg, temperature=0.0) if greedy else self.sampling_cfg
      data = self.test_data

      def fn(params, idx, key):
        out = sampling.sample(self.graphdef, params, data.prompt_tokens[idx],
                              data.prompt_mask[idx], key, cfg=scfg)
        _, ok = self._reward(out.tokens, out.mask, idx, data)
        return out, ok

      self._eval_fns[(rows, greedy)] = jax.jit(fn)
    return self._eval_fns[(rows, greedy)]


def host_reward(fn, tokens, mask, idx, *, split_id: int):
  """Score completions on the host through one batched callback (the only host boundary).

  fn(tokens [B, N] np.int32, mask [B, N] np.bool_, idx [B] np.int32, split) -> [B] float32.
  Returns (rewards [B] float32, correct [B] bool = reward >= 1).
  """
  shape = jax.ShapeDtypeStruct(idx.shape, jnp.float32)

  def checked(t, m, i):
    try:
      r = np.asarray(fn(t, m, i, split_id), np.float32)
    except Exception as e:  # noqa: BLE001 - re-raised with the batch context
      raise RuntimeError(f"reward function failed on a batch of {len(i)} rollouts "
                         f"(prompts {int(i.min())}..{int(i.max())}): {e!r}") from e
    if r.shape != i.shape:
      raise ValueError(f"reward function returned shape {r.shape}, expected {i.shape}")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
      raise ValueError(f"reward function returned {r[bad[0]]} for rollout {int(bad[0])} "
                       f"(prompt {int(i[bad[0]])})")
    return r

  r = jax.pure_callback(checked, shape, tokens, mask, idx, vmap_method="sequential")
  return r, r >= 1.0


def make_train(config: RLConfig | dict, **kw) -> Trainer:
  """Host-side setup of a run; see ``Trainer``."""
  from rlpost.train.config import from_dict

  cfg = config if isinstance(config, RLConfig) else from_dict(RLConfig, config)
  if isinstance(config, RLConfig):
    cfg.validate()
  return Trainer(cfg, **kw)


def _all_finite(tree) -> jax.Array:
  """[] bool: every floating-point value of ``tree`` is finite (one reduction per leaf)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


_FINITE_FIELDS = ("reward", *(f.replace("_logp", " log-prob") for f in LOGP_FIELDS))


def raise_if_bad(metrics: dict, step: int) -> None:
  """Host-side checks after a step: non-finite rollouts, loss or parameters stop the run with
  the rollout, its prompt and group, or the likely cause named."""
  if int(metrics["nonfinite_batch"]):
    field = int(metrics.get("nonfinite_field", -1))
    what = _FINITE_FIELDS[field] if 0 <= field < len(_FINITE_FIELDS) else "reward or log-prob"
    raise FloatingPointError(
        f"step {step}: non-finite {what} at rollout index {int(metrics['nonfinite_index'])} "
        f"(train prompt {int(metrics['nonfinite_prompt'])}, group "
        f"{int(metrics['nonfinite_group'])} of the step)")
  if int(metrics.get("nonfinite_params", 0)):
    raise FloatingPointError(
        f"step {step}: the update made the policy parameters non-finite (gradient norm "
        f"{float(metrics['grad_norm']):.3g}); check lr, grad_clip and the recipe's coefficients")
  loss = float(metrics["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"step {step}: loss became {loss}")
