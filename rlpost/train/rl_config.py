"""The RL run config (``RLConfig``), its validation, the learning rate and the recipe it names.

``RLConfig.validate`` checks every key before any expensive work and raises one ValueError that
names the key; task-specific checks come from the task (``rlpost.tasks.base.Task.validate``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import warnings
from typing import Any

import jax
import optax

from rlpost import objectives as obj
from rlpost.models import attention as attention_lib
from rlpost.models import lora
from rlpost.models import transformer as tfm
from rlpost.rollouts import allocate
from rlpost.tasks import answer_check, builders, catalog, math_data
from rlpost.train import config as config_lib
from rlpost.train import tracking
from rlpost.train.config import key

DEFAULT_SFT_STEPS = 500
DEFAULT_MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                     intermediate_size=512, max_seq_len=64)
# The ``model`` keys that still apply with a Hugging Face policy (its config.json fixes the rest).
POLICY_MODEL_KEYS = ("dtype", "param_dtype", "max_seq_len", "attention", "stacked_layers")
# The optional recipe inputs the trainer computes: sampler log-probs, its own log-probs of the
# sampling parameters, the reference policy's, per-token entropy (for the chain and the loss)
# and a PRNG key for the chain.
PROVIDED = ("behaviour_logp", "current_logp", "ref_logp", "entropy", "key")


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """Everything that determines a run. See ``validate`` for the allowed values."""

  # task: a registered task (rlpost.tasks.catalog.list_tasks()) with its task_spec; the file tasks
  # gsm8k and math take {"train": path, "test": path}, and num_train / num_test cap their records
  task: str = key("arithmetic", group="task",
      help="registered task: arithmetic, countdown, gsm8k, math (rlpost.tasks.catalog.list_tasks)")
  task_spec: dict = key(group="task", factory=dict, run_local=True,
      help="the task's options, e.g. digits for arithmetic; {'train': path, 'test': path} for the "
           "file tasks")
  num_train: int = key(10000, group="task",
      help="training records generated (synthetic tasks) or the cap on records read")
  num_test: int = key(1000, group="task",
      help="test records generated or the cap on records read")
  data_seed: int = key(0, group="task",
      help="seed of the synthetic data sets")
  graded_reward: bool = key(False, group="task",
      help="partial credit instead of 0/1 where the task has it")
  data_dir: str = key(builders.DEFAULT_DATA_DIR, group="task", run_local=True,
      help="where generated data sets are cached (tfds array_record)")
  # file tasks: every literal "{question}" is replaced by the question (nothing else is parsed)
  prompt_template: str = key(math_data.QWEN_MATH_TEMPLATE, group="task",
      help="file tasks: the prompt, with {question} replaced; @FILE on the command line reads it "
           "from a file")
  answer_check: str = key("parser", group="task",
      help="file tasks: 'parser' (boxed / #### / last number) or 'math_verify' (as verl)")
  # prompts longer than this many tokens are dropped (logged); 0 keeps every prompt
  max_prompt_tokens: int = key(0, group="task",
      help="prompts longer than this many tokens are dropped (0: keep all)")
  # policy: a local Hugging Face checkpoint directory; "" is the built-in character model
  policy: str = key("", group="policy", run_local=True,
      help="a local Hugging Face checkpoint directory; '' is the built-in character model")
  # policy: token strings that end a completion besides the tokenizer's eos ids
  extra_stop_tokens: tuple[str, ...] = key((), group="policy",
      help="with a policy: token strings that end a completion besides its eos ids")
  # policy and warm start; with a policy only POLICY_MODEL_KEYS may be set in model
  model: dict = key(group="policy", factory=dict, run_local=True,
      help="TransformerConfig fields of the character model; with a policy only dtype, "
           "param_dtype, max_seq_len, attention ('xla' | 'blockwise' | 'cudnn') and stacked_layers"
           " (layers as one [L, ...] tensor each, scanned: full-size runs)")
  model_seed: int = key(0, group="policy",
      help="seed of the character model's initialisation")
  # None: 500 for the character model, 0 with a policy or init_params
  sft_steps: int | None = key(None, group="policy",
      help="SFT warm-start steps of the character model (unset: 500; 0 with a policy)")
  # a pinned starting policy of the character model, <name>-<digest>.npz (rlpost.train.pinned,
  # scripts/testbed.py): loaded and checked against its digest instead of the SFT warm start
  init_params: str = key("", group="policy",
      help="a pinned start of the character model, <name>-<digest>.npz (scripts/testbed.py build),"
           " checked against its digest; replaces the SFT warm start")
  sft_batch_size: int = key(256, group="policy",
      help="SFT warm-start batch size")
  sft_lr: float = key(1e-3, group="policy",
      help="SFT warm-start learning rate")
  cache_dir: str = key(
      builders.DEFAULT_DATA_DIR.replace("tfds", "policies"), group="policy", run_local=True,
      help="where SFT warm-start policies are cached (keyed by their config)")
  # rollouts
  recipe: str = key("grpo", group="rollouts",
      help="the objective: grpo, dr_grpo, dapo, gspo, gmpo, pnpo, rloo, mc_grpo, ace, dars, ... "
           "(rlpost.objectives.list_recipes)")
  recipe_args: dict = key(group="rollouts", factory=dict,
      help="the recipe's own arguments, e.g. {'alpha': 0.5} for ace")
  num_prompts: int = key(16, group="rollouts",
      help="prompts per RL step")
  group_size: int = key(8, group="rollouts",
      help="rollouts per prompt (G)")
  # 0: longest demonstration + 2
  max_new_tokens: int = key(0, group="rollouts",
      help="completion length; 0: longest demonstration + 2 (character model only)")
  temperature: float = key(1.0, group="rollouts",
      help="sampling temperature of the rollouts")
  top_p: float = key(1.0, group="rollouts",
      help="nucleus sampling threshold of the rollouts")
  # which prompts get how many rollouts: a registered rule (rlpost.rollouts.allocate:
  # plain, dynamic_sampling, dars, dars_b, or a fork's) and its arguments; "" is plain unless the
  # recipe declares the allocations its paper runs it with, which must then be named
  allocation: str = key("", group="rollouts",
      help="which prompts get how many rollouts: plain, dynamic_sampling (DAPO), dars, dars_b or a"
           " registered rule (rlpost.rollouts.allocate.list_allocations); '' is plain unless the "
           "recipe names its own")
  allocation_args: dict = key(group="rollouts", factory=dict,
      help="the rule's arguments, e.g. {'factor': 3} for dynamic_sampling, {'schedule': 'et', "
           "'n_max': 32, 'budget': 0} for dars")
  # optimisation
  lr: float = key(1e-4, group="optimisation",
      help="RL learning rate (Adam)")
  # or "cosine" (to 0 at the last optimizer update)
  lr_schedule: str = key("constant", group="optimisation",
      help="'constant' or 'cosine' (to 0 at the last optimizer update)")
  # linear warmup from 0 over this many optimizer updates
  lr_warmup_steps: int = key(0, group="optimisation",
      help="linear warm-up from 0 over this many optimizer updates")
  b1: float = key(0.9, group="optimisation",
      help="Adam beta1")
  b2: float = key(0.999, group="optimisation",
      help="Adam beta2")
  weight_decay: float = key(0.0, group="optimisation",
      help="decoupled weight decay (AdamW)")
  grad_clip: float = key(1.0, group="optimisation",
      help="global gradient-norm clip")
  num_iterations: int = key(1, group="optimisation",
      help="epochs over each step's rollouts (PPO-style reuse)")
  num_minibatches: int = key(1, group="optimisation",
      help="optimizer updates per epoch")
  # memory: each optimizer mini-batch in grad_accum sequential micro-batches (gradients summed,
  # the loss exactly the mini-batch's); per-layer rematerialisation; the LM head over chunks of
  # logits_chunk completion positions (0: all at once). Values are unchanged by all three.
  grad_accum: int = key(1, group="memory", run_local=True,
      help="micro-batches per mini-batch (memory; the update is unchanged)")
  remat: bool = key(False, group="memory", run_local=True,
      help="recompute each layer in the backward pass (memory)")
  logits_chunk: int = key(0, group="memory", run_local=True,
      help="LM head over this many completion positions at a time (memory; 0: all)")
  # padding-free scoring (rlpost.models.packing): each scored call packs its rows' real tokens
  # into bins of pack_bin_rows rows, as many as the smallest of these fractions of the padded
  # slots that fits, the padded pass otherwise; () off. Values are unchanged (up to float
  # summation order).
  pack_buckets: tuple[float, ...] = key((), group="memory", run_local=True,
      help="padding-free scoring: pack the rows' real tokens into the smallest of these fractions "
           "of the padded slots that fits, e.g. [0.5, 0.75] (speed; [] off)")
  pack_bin_rows: int = key(2, group="memory", run_local=True,
      help="padding-free scoring: each packed row holds this many padded rows' slots")
  # compute reference log-probs every step for the confidence diagnostics (overconfident
  # errors, confidence-shift quantiles) even when the recipe does not need them
  log_confidence: bool = key(False, group="evaluation",
      help="log the confidence-shift diagnostics (one reference pass per step) even when the "
           "recipe needs no reference log-probs")
  # LoRA (rlpost.models.lora): train rank-r adapters on these projections, the base frozen
  # 0: full fine-tuning
  lora_rank: int = key(0, group="policy",
      help="LoRA: rank of the adapters trained with the base weights frozen (0: full fine-tuning);"
           " exports merge them")
  lora_alpha: float = key(16.0, group="policy",
      help="LoRA: the adapters' output is scaled by lora_alpha / lora_rank")
  lora_targets: str = key(",".join(lora.DEFAULT_TARGETS), group="policy",
      help="LoRA: comma-separated projections to adapt in every layer: q_proj, k_proj, v_proj, "
           "o_proj, gate_proj, up_proj, down_proj, lm_head")
  # rollouts sampled in sequential chunks of this many rows (0: all at once): bounds the KV cache
  rollout_chunk: int = key(0, group="rollouts", run_local=True,
      help="sample this many rows at a time (bounds the KV cache; 0: all)")
  steps: int = key(500, group="optimisation", operational=True,
      help="RL steps")
  seed: int = key(0, group="optimisation", run_local=True,
      help="seed of the RL run (sampling, advantages, mini-batches)")
  # evaluation
  eval_every: int = key(100, group="evaluation",
      help="evaluate every this many steps (and at the last)")
  eval_problems: int = key(500, group="evaluation",
      help="test problems per evaluation (0: the whole test split)")
  eval_samples: int = key(16, group="evaluation",
      help="samples per test problem (pass@k up to this k)")
  eval_batch: int = key(1024, group="evaluation",
      help="rows per evaluation sampling call")
  # weight averages evaluated beside the raw policy, e.g. "lawa:k=5,every=50;ema:decay=0.99"
  averaging: str = key("", group="evaluation",
      help="weight averages evaluated beside the raw policy, e.g. "
           "'lawa:k=5,every=50;ema:decay=0.99'")
  # devices: the rollout batch is split over a (data, fsdp) mesh of all devices
  mesh_fsdp: int = key(1, group="devices", run_local=True,
      help="size of the mesh's fsdp axis (the rest is data parallel)")
  # or "fsdp"
  param_sharding: str = key("replicate", group="devices", run_local=True,
      help="'replicate' or 'fsdp' (parameters and optimizer state sharded)")
  # run directory
  run_dir: str = key("", group="run", run_local=True, operational=True,
      help="run directory (default runs/<config>-<recipe>-s<seed>); rerunning resumes")
  checkpoint_every: int = key(100, group="run", run_local=True,
      help="save a checkpoint every this many steps (and at the last)")
  keep_checkpoints: int = key(2, group="run", run_local=True, operational=True,
      help="checkpoints kept on disk")
  # resume from the previous checkpoint if the latest is corrupt
  resume_fallback: bool = key(False, group="run", run_local=True, operational=True,
      help="resume from the previous checkpoint if the latest is corrupt")
  # experiment trackers beside metrics.jsonl (rlpost.train.tracking): comma-separated kinds
  logger: str = key("tensorboard", group="run", run_local=True, operational=True,
      help="experiment trackers beside metrics.jsonl: tensorboard, wandb or none; comma-separated "
           "for several")
  # silent-failure guards (rlpost.train.guards): "warn", "stop" (save and end the run) or "off"
  guard_action: str = key("warn", group="guards", run_local=True, operational=True,
      help="silent-failure guards: 'warn', 'stop' (save and end the run) or 'off'")
  guard_patience: int = key(50, group="guards", run_local=True, operational=True,
      help="steps a guard's condition must hold before it fires")
  guard_truncated: float = key(0.5, group="guards", run_local=True, operational=True,
      help="share of truncated completions above which the truncation guard counts")
  guard_logp_mismatch: float = key(0.05, group="guards", run_local=True, operational=True,
      help="sampler-trainer log-prob gap per token above which the guard fires")

  def __post_init__(self):
    if self.sft_steps is None:
      object.__setattr__(self, "sft_steps",
                         0 if self.policy or self.init_params else DEFAULT_SFT_STEPS)
    # The rule's arguments with its defaults filled in, so a stored config and a resumed one
    # compare equal however many of them each spelled out (left as given when the rule or its
    # arguments are unknown here: ``validate`` reports them).
    if self.allocation in allocate.list_allocations() and isinstance(self.allocation_args, dict):
      try:
        args = allocate.get_allocation(self.allocation).parse(self.allocation_args)
      except ValueError:
        args = None
      if args is not None:
        object.__setattr__(self, "allocation_args", dataclasses.asdict(args))

  def validate(self) -> None:
    def need(cond, key, msg):
      if not cond:
        raise ValueError(f"config key {key!r}: {msg} (got {getattr(self, key)!r})")

    tasks = list(catalog.list_tasks())
    need(self.task in tasks, "task", f"must be one of {tasks}")
    task = catalog.get_task(self.task)
    need(self.answer_check in answer_check.CHECKERS, "answer_check",
         f"must be one of {list(answer_check.CHECKERS)}")
    need(self.answer_check == "parser" or self.task in math_data.FILE_TASKS, "answer_check",
         f"only the file tasks {list(math_data.FILE_TASKS)} check answers as text")
    if not task.character_alphabet:
      need(bool(self.policy), "task", "needs a Hugging Face policy (config key 'policy'): real "
           "text is outside the character tokenizer's alphabet")
    if self.policy:  # every key the policy path needs, in one message
      problems = []
      if self.sft_steps != 0:
        problems.append(f"'sft_steps' must be 0 (got {self.sft_steps}): the checkpoint is the "
                        "starting policy (the SFT warm start is for the built-in character "
                        "model); leave it unset")
      if self.max_new_tokens < 1:
        problems.append(f"'max_new_tokens' must be set (>= 1; got {self.max_new_tokens}): the "
                        "completion length of a pretrained policy cannot be read from the data")
      fixed = sorted(set(self.model) - set(POLICY_MODEL_KEYS))
      if fixed:
        problems.append(f"'model' cannot set {fixed} (the architecture comes from "
                        f"{os.path.join(self.policy, 'config.json')}); only "
                        f"{list(POLICY_MODEL_KEYS)} apply")
      if len(problems) == 1:
        raise ValueError(f"with policy={self.policy!r}, config key {problems[0]}")
      if problems:
        raise ValueError(f"with policy={self.policy!r}, {len(problems)} config keys need "
                         "changing: " + "; ".join(f"({i}) config key {p}"
                                                  for i, p in enumerate(problems, 1)))
      for key in ("dtype", "param_dtype"):
        if key in self.model and self.model[key] not in ("float32", "bfloat16", "float16"):
          raise ValueError(f"config key 'model': {key} must be 'float32', 'bfloat16' or "
                           f"'float16' (got {self.model[key]!r})")
      seq = self.model.get("max_seq_len", 1)
      if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"config key 'model': max_seq_len must be a positive int (got {seq!r})")
    impls = attention_lib.IMPLS
    if self.model.get("attention", "xla") not in impls:
      raise ValueError(f"config key 'model': attention must be one of {list(impls)} (got "
                       f"{self.model['attention']!r})")
    if not isinstance(self.model.get("stacked_layers", False), bool):
      raise ValueError("config key 'model': stacked_layers must be true or false (got "
                       f"{self.model['stacked_layers']!r})")
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
    # Seeds reach numpy (non-negative only) and JAX keys (32 bits: 2**32 would repeat seed 0).
    for key in ("data_seed", "model_seed", "seed"):
      need(0 <= getattr(self, key) < 2**32, key, "must be a non-negative integer below 2**32")
    need(self.eval_problems >= 0, "eval_problems", "must be >= 0 (0: the whole test split)")
    need(self.eval_batch >= 1, "eval_batch", "must be >= 1")
    need(self.max_prompt_tokens >= 0, "max_prompt_tokens", "must be >= 0")
    if self.init_params:
      need(not self.policy, "init_params", "is a pinned start of the character model; with a "
           "policy the checkpoint is the start: leave init_params unset")
      need(self.sft_steps == 0, "init_params", f"replaces the SFT warm start, so sft_steps must "
           f"be 0 or unset (got sft_steps {self.sft_steps})")
      from rlpost.train import pinned

      try:
        pinned.parse_name(self.init_params)
      except pinned.PinnedError as e:
        raise ValueError(f"config key 'init_params': {e}") from None
      need(os.path.isfile(self.init_params), "init_params", "no such file")
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
    need(all(isinstance(f, (int, float)) and 0 < f < 1 for f in self.pack_buckets),
         "pack_buckets", f"fractions of the padded slots must be in (0, 1), got "
         f"{list(self.pack_buckets)}")
    need(self.pack_bin_rows >= 1, "pack_bin_rows", "must be >= 1")
    need(self.eval_samples >= 1, "eval_samples", "must be >= 1")
    need(self.lora_rank >= 0, "lora_rank", "must be >= 0 (0: full fine-tuning, no adapters)")
    need(math.isfinite(self.lora_alpha) and self.lora_alpha > 0, "lora_alpha",
         "must be a finite number > 0 (the adapters' output is scaled by alpha / rank)")
    try:
      lora.LoraConfig(rank=1, targets=lora.parse_targets(self.lora_targets))
    except ValueError as e:
      raise ValueError(f"config key 'lora_targets': {e} (got {self.lora_targets!r})") from None
    if self.averaging:
      from rlpost import averaging

      try:
        averaging.parse_specs(self.averaging)
      except ValueError as e:
        raise ValueError(f"config key 'averaging': {e}") from None
    need(self.eval_every >= 1, "eval_every", "must be >= 1")
    need(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
    need(self.keep_checkpoints >= 1, "keep_checkpoints", "must be >= 1")
    need(self.guard_action in ("warn", "stop", "off"), "guard_action",
         "must be 'warn', 'stop' or 'off'")
    need(self.guard_patience >= 1, "guard_patience", "must be >= 1")
    need(0 <= self.guard_truncated <= 1, "guard_truncated", "must be in [0, 1]")
    need(self.guard_logp_mismatch > 0, "guard_logp_mismatch", "must be > 0")
    need(self.max_new_tokens >= 0, "max_new_tokens", "must be >= 0")
    if "wandb" in tracking.parse_kinds(self.logger) and importlib.util.find_spec("wandb") is None:
      raise ValueError("config key 'logger': 'wandb' needs the wandb extra: "
                       "pip install -e '.[wandb]'")
    if "\\n" in self.prompt_template:
      warnings.warn("prompt_template contains a literal backslash-n (two characters), so every "
                    "prompt will too; for a newline pass a real one, '\\n' on the command line "
                    "of scripts/train.py, or prompt_template=@FILE", UserWarning, stacklevel=3)
    need(self.param_sharding in ("replicate", "fsdp"), "param_sharding",
         "must be 'replicate' or 'fsdp'")
    n_dev = len(jax.devices())
    need(self.mesh_fsdp >= 1 and n_dev % self.mesh_fsdp == 0, "mesh_fsdp",
         f"must divide the number of devices ({n_dev})")
    plan = self.allocation_plan()
    rows = plan.rows
    need(rows % self.num_minibatches == 0, "num_minibatches",
         f"must divide the rollout batch of {rows} rows")
    need((rows // self.num_minibatches) % n_dev == 0,
         "num_prompts", f"the mini-batch of {rows // self.num_minibatches} rollouts must be "
         f"divisible by the {n_dev} devices of the mesh")
    need(all(c % n_dev == 0 for c in plan.calls), "allocation_args",
         f"allocation {self.allocation!r} samples {list(plan.calls)} rows per call; each must "
         f"be divisible by the {n_dev} devices of the mesh")
    if self.rollout_chunk:
      calls = list(plan.calls)
      need(self.rollout_chunk % n_dev == 0 and all(c % self.rollout_chunk == 0 for c in calls),
           "rollout_chunk", f"must divide every sampling call's rows {calls} and be divisible "
           f"by the {n_dev} devices of the mesh")
    mb = rows // self.num_minibatches
    need(mb % self.grad_accum == 0 and (mb // self.grad_accum) % n_dev == 0, "grad_accum",
         f"must split the mini-batch of {mb} rollouts into micro-batches divisible by the "
         f"{n_dev} devices of the mesh")
    need(not self.graded_reward or task.has_graded_reward, "graded_reward",
         f"task {self.task!r} has no graded reward")
    task.validate(self)
    if self.recipe not in obj.list_recipes():
      raise ValueError(f"config key 'recipe': unknown recipe {self.recipe!r}; "
                       f"known: {list(obj.list_recipes())}")
    # The recipe's arguments, checked now (building it is cheap) rather than after the data
    # and the SFT warm start; lengths not known yet stand in as max_new_tokens or 16.
    recipe = build_recipe(self, self.max_new_tokens or 16)
    self._check_allocation(recipe)
    # One rollout per group (a rule that samples more rows than prompts, such as DARS, can merge
    # extra rollouts into a group): a group-relative baseline makes every advantage 0 and the
    # run would learn nothing.
    singletons = self.group_size == 1 and rows <= self.num_prompts
    if singletons and not obj.recipes.learns_from_singleton_groups(recipe):
      raise ValueError(f"config key 'group_size': recipe {self.recipe!r} measures each rollout "
                       "against its group, so with one rollout per group every advantage is "
                       "exactly 0 and nothing is learned; use group_size >= 2 (got 1)")
    unknown = set(self.model) - {f.name for f in dataclasses.fields(tfm.TransformerConfig)}
    if unknown:
      raise ValueError(f"config key 'model': unknown TransformerConfig field(s) {sorted(unknown)}")
    if not self.policy:
      # The character model's config as the trainer builds it (``setup._character_config``);
      # its vocabulary and sequence length are set there, so placeholders stand in here.
      try:
        tfm.TransformerConfig(**{**DEFAULT_MODEL, "vocab_size": 1, **self.model})
      except (TypeError, ValueError) as e:
        raise ValueError(f"config key 'model' {self.model!r}: {e}") from None


  def lora_config(self) -> lora.LoraConfig | None:
    """The adapters' config (seeded by ``seed``), or None when ``lora_rank`` is 0."""
    if not self.lora_rank:
      return None
    return lora.LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha,
                           targets=lora.parse_targets(self.lora_targets), seed=self.seed)

  def allocation_rule(self) -> tuple[allocate.Rule, Any]:
    """(the allocation rule, its parsed arguments); ValueError naming ``allocation`` or
    ``allocation_args``."""
    try:
      rule = allocate.get_allocation(self.allocation or "plain")
    except ValueError as e:
      raise ValueError(f"config key 'allocation': {e}") from None
    try:
      args = rule.parse(self.allocation_args)
    except (TypeError, ValueError) as e:
      raise ValueError(f"config key 'allocation_args': {e}") from None
    return rule, args

  def allocation_plan(self) -> allocate.Plan:
    """The rows of each sampling call and of the step's batch (``allocate.Plan``), after the
    rule's own constraints on the run (``Rule.check``). A message of the rule that names a
    config key (``config key '...'``) is passed on; others are about ``allocation_args``."""
    rule, args = self.allocation_rule()

    def fail(e):
      msg = str(e)
      head = "" if msg.startswith("config key") else "config key 'allocation_args': "
      raise ValueError(f"{head}allocation {rule.name!r}: {msg}" if head else msg) from None

    if rule.check is not None:
      try:
        rule.check(args, self)
      except ValueError as e:
        fail(e)
    try:
      return rule.plan(args, self.num_prompts, self.group_size)
    except (TypeError, ValueError) as e:
      fail(e)

  def _check_allocation(self, recipe: obj.Recipe) -> None:
    """The recipe's declared allocations against the run's."""
    unknown = [a for a in recipe.allocations if a not in allocate.list_allocations()]
    if unknown:
      raise ValueError(f"config key 'recipe': recipe {self.recipe!r} declares the allocations "
                       f"{unknown}, which are not registered (registered: "
                       f"{list(allocate.list_allocations())})")
    declared = recipe.allocations
    if declared and not self.allocation:
      raise ValueError(f"config key 'allocation': recipe {self.recipe!r} runs with one of the "
                       f"allocations {list(declared)} (its paper's first); name one, e.g. "
                       f"allocation={declared[0]!r}")
    if declared and self.allocation not in declared:
      raise ValueError(f"config key 'allocation': recipe {self.recipe!r} runs with one of the "
                       f"allocations {list(declared)}, not {self.allocation!r}")

  @staticmethod
  def upgrade(values: dict) -> dict:
    """A config dict with the allocation keys of older versions (``dynamic_sampling_factor``,
    ``dars_schedule``, ``dars_n_max``, ``dars_budget``) rewritten as ``allocation`` and
    ``allocation_args``, so stored configs and run directories still load. A dict that names
    ``allocation`` and sets an old key to a non-default value raises ValueError."""
    old = {k: values[k] for k in LEGACY_ALLOCATION_KEYS if k in values}
    if not old:
      return values
    out = {k: v for k, v in values.items() if k not in LEGACY_ALLOCATION_KEYS}
    try:
      factor = old.get("dynamic_sampling_factor", 1)
      factor = 1 if factor is None else int(factor)
    except (TypeError, ValueError):
      raise ValueError("config key 'dynamic_sampling_factor' must be an int, got "
                       f"{old['dynamic_sampling_factor']!r}") from None
    schedule = old.get("dars_schedule", "") or ""
    if factor != 1 and schedule:
      raise ValueError("config keys 'dars_schedule' and 'dynamic_sampling_factor': DARS and "
                       "DAPO dynamic sampling are exclusive")
    if schedule:
      name = "dars"
      args = dict(schedule=schedule, n_max=old.get("dars_n_max", 32),
                  budget=old.get("dars_budget", 0))
    elif factor != 1:  # 0 or below: refused by the rule's arguments, as before
      name, args = "dynamic_sampling", dict(factor=factor)
    else:
      # Named explicitly only for the one built-in recipe that declares its allocations.
      name, args = ("plain" if values.get("recipe") == "dars" else ""), {}
    if values.get("allocation") or values.get("allocation_args"):
      if name not in ("", "plain"):
        raise ValueError(f"config keys {sorted(old)} (older spellings of 'allocation') conflict "
                         f"with 'allocation'; set allocation={name!r}, allocation_args={args} "
                         "alone")
      return out
    return dict(out, allocation=name, allocation_args=args)


# The allocation keys of older configs (``RLConfig.upgrade``).
LEGACY_ALLOCATION_KEYS = ("dynamic_sampling_factor", "dars_schedule", "dars_n_max", "dars_budget")


# One line per key for ``scripts/train.py --help``, from the fields' metadata.
HELP = config_lib.help_of(RLConfig)


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


def build_recipe(cfg: RLConfig, max_len: int, **facts) -> obj.Recipe:
  """The configured recipe, with this run's facts as its context: the max completion length
  ``max_len``, the group size, prompts and rows per step from ``cfg``, and ``facts`` (other
  ``RecipeContext`` fields: tokenizer, stop_tokens, pad_id, prompt_length) where known. It must
  need nothing the trainer does not compute (``PROVIDED``)."""
  context = obj.RecipeContext(max_length=max_len, group_size=cfg.group_size,
                              num_prompts=cfg.num_prompts, rows=cfg.allocation_plan().rows,
                              **facts)
  try:
    obj.recipes.check_override_types(cfg.recipe, cfg.recipe_args)
    recipe = obj.get_recipe(cfg.recipe, context, **cfg.recipe_args)
  except (TypeError, ValueError) as e:
    raise ValueError(f"config key 'recipe_args': {e}") from None
  try:
    recipe.check_provided(PROVIDED)
  except ValueError as e:
    raise ValueError(f"config key 'recipe': {e}") from None
  return recipe
