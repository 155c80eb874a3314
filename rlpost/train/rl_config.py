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

import jax
import optax

from rlpost import objectives as obj
from rlpost.models import attention as attention_lib
from rlpost.models import lora
from rlpost.models import transformer as tfm
from rlpost.tasks import base as task_base
from rlpost.tasks import builders, math_data
from rlpost.train import tracking

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

  # task: a registered task (rlpost.tasks.base.list_tasks()) with its task_spec; the file tasks
  # gsm8k and math take {"train": path, "test": path}, and num_train / num_test cap their records
  task: str = "arithmetic"
  task_spec: dict = dataclasses.field(default_factory=dict)
  num_train: int = 10000
  num_test: int = 1000
  data_seed: int = 0
  graded_reward: bool = False
  data_dir: str = builders.DEFAULT_DATA_DIR
  # file tasks: every literal "{question}" is replaced by the question (nothing else is parsed)
  prompt_template: str = math_data.QWEN_MATH_TEMPLATE
  # prompts longer than this many tokens are dropped (logged); 0 keeps every prompt
  max_prompt_tokens: int = 0
  # policy: a local Hugging Face checkpoint directory; "" is the built-in character model
  policy: str = ""
  # policy: token strings that end a completion besides the tokenizer's eos ids
  extra_stop_tokens: tuple[str, ...] = ()
  # policy and warm start; with a policy only POLICY_MODEL_KEYS may be set in model
  model: dict = dataclasses.field(default_factory=dict)
  model_seed: int = 0
  sft_steps: int | None = None  # None: 500 for the character model, 0 with a policy or init_params
  # a pinned starting policy of the character model, <name>-<digest>.npz (rlpost.train.pinned,
  # scripts/testbed.py): loaded and checked against its digest instead of the SFT warm start
  init_params: str = ""
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
  # padding-free scoring (rlpost.models.packing): each scored call packs its rows' real tokens
  # into bins of pack_bin_rows rows, as many as the smallest of these fractions of the padded
  # slots that fits, the padded pass otherwise; () off. Values are unchanged (up to float
  # summation order).
  pack_buckets: tuple[float, ...] = ()
  pack_bin_rows: int = 2
  # compute reference log-probs every step for the confidence diagnostics (overconfident
  # errors, confidence-shift quantiles) even when the recipe does not need them
  log_confidence: bool = False
  # LoRA (rlpost.models.lora): train rank-r adapters on these projections, the base frozen
  lora_rank: int = 0  # 0: full fine-tuning
  lora_alpha: float = 16.0
  lora_targets: str = ",".join(lora.DEFAULT_TARGETS)
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
  # experiment trackers beside metrics.jsonl (rlpost.train.tracking): comma-separated kinds
  logger: str = "tensorboard"
  # silent-failure guards (rlpost.train.guards): "warn", "stop" (save and end the run) or "off"
  guard_action: str = "warn"
  guard_patience: int = 50
  guard_truncated: float = 0.5
  guard_logp_mismatch: float = 0.05

  def __post_init__(self):
    if self.sft_steps is None:
      object.__setattr__(self, "sft_steps",
                         0 if self.policy or self.init_params else DEFAULT_SFT_STEPS)

  def validate(self) -> None:
    def need(cond, key, msg):
      if not cond:
        raise ValueError(f"config key {key!r}: {msg} (got {getattr(self, key)!r})")

    tasks = list(task_base.list_tasks())
    need(self.task in tasks, "task", f"must be one of {tasks}")
    task = task_base.get_task(self.task)
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
    need(not self.graded_reward or task.has_graded_reward, "graded_reward",
         f"task {self.task!r} has no graded reward")
    task.validate(self)
    if self.recipe not in obj.list_recipes():
      raise ValueError(f"config key 'recipe': unknown recipe {self.recipe!r}; "
                       f"known: {list(obj.list_recipes())}")
    # The recipe's arguments, checked now (building it is cheap) rather than after the data
    # and the SFT warm start; lengths not known yet stand in as max_new_tokens or 16.
    recipe = build_recipe(self, self.max_new_tokens or 16)
    # One rollout per group (DARS can merge extra rollouts into a group, so it may have more):
    # a group-relative baseline makes every advantage 0 and the run would learn nothing.
    singletons = self.group_size == 1 and not self.dars_schedule
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

  @property
  def resolved_dars_budget(self) -> int:
    if not self.dars_schedule:
      return 0
    return self.dars_budget or self.num_prompts * (self.dars_n_max - self.group_size)


# One line per key for ``scripts/train.py --help`` (types and defaults come from the dataclass;
# tests/train/test_config_help.py fails when a key is missing here or a name here is not a key).
HELP = {
    "task": "registered task: arithmetic, countdown, gsm8k, math (rlpost.tasks.base.list_tasks)",
    "task_spec": "the task's options, e.g. digits for arithmetic; {'train': path, 'test': path} "
                 "for the file tasks",
    "num_train": "training records generated (synthetic tasks) or the cap on records read",
    "num_test": "test records generated or the cap on records read",
    "data_seed": "seed of the synthetic data sets",
    "graded_reward": "partial credit instead of 0/1 where the task has it",
    "data_dir": "where generated data sets are cached (tfds array_record)",
    "prompt_template": "file tasks: the prompt, with {question} replaced; @FILE on the command "
                       "line reads it from a file",
    "max_prompt_tokens": "prompts longer than this many tokens are dropped (0: keep all)",
    "policy": "a local Hugging Face checkpoint directory; '' is the built-in character model",
    "extra_stop_tokens": "with a policy: token strings that end a completion besides its eos ids",
    "model": "TransformerConfig fields of the character model; with a policy only dtype, "
             "param_dtype, max_seq_len, attention ('xla' | 'blockwise' | 'cudnn') and "
             "stacked_layers (layers as one [L, ...] tensor each, scanned: full-size runs)",
    "model_seed": "seed of the character model's initialisation",
    "sft_steps": "SFT warm-start steps of the character model (unset: 500; 0 with a policy)",
    "sft_batch_size": "SFT warm-start batch size",
    "sft_lr": "SFT warm-start learning rate",
    "init_params": "a pinned start of the character model, <name>-<digest>.npz (scripts/"
                   "testbed.py build), checked against its digest; replaces the SFT warm start",
    "cache_dir": "where SFT warm-start policies are cached (keyed by their config)",
    "recipe": "the objective: grpo, dr_grpo, dapo, gspo, gmpo, pnpo, rloo, mc_grpo, ace, dars, "
              "... (rlpost.objectives.list_recipes)",
    "recipe_args": "the recipe's own arguments, e.g. {'alpha': 0.5} for ace",
    "num_prompts": "prompts per RL step",
    "group_size": "rollouts per prompt (G)",
    "max_new_tokens": "completion length; 0: longest demonstration + 2 (character model only)",
    "temperature": "sampling temperature of the rollouts",
    "top_p": "nucleus sampling threshold of the rollouts",
    "dynamic_sampling_factor": "DAPO dynamic sampling: draw k * P groups, keep P with mixed "
                               "outcomes (1: off)",
    "dars_schedule": "DARS stage-2 schedule: '' (off), 'et' (equal treatment), 'hw' (hardness "
                     "weighted)",
    "dars_n_max": "DARS: the largest merged group (stage 1 + stage 2)",
    "dars_budget": "DARS: stage-2 rows per step (0: P * (n_max - G), never truncates)",
    "lr": "RL learning rate (Adam)",
    "lr_schedule": "'constant' or 'cosine' (to 0 at the last optimizer update)",
    "lr_warmup_steps": "linear warm-up from 0 over this many optimizer updates",
    "b1": "Adam beta1",
    "b2": "Adam beta2",
    "weight_decay": "decoupled weight decay (AdamW)",
    "grad_clip": "global gradient-norm clip",
    "num_iterations": "epochs over each step's rollouts (PPO-style reuse)",
    "num_minibatches": "optimizer updates per epoch",
    "grad_accum": "micro-batches per mini-batch (memory; the update is unchanged)",
    "remat": "recompute each layer in the backward pass (memory)",
    "logits_chunk": "LM head over this many completion positions at a time (memory; 0: all)",
    "pack_buckets": "padding-free scoring: pack the rows' real tokens into the smallest of "
                    "these fractions of the padded slots that fits, e.g. [0.5, 0.75] (speed; "
                    "[] off)",
    "pack_bin_rows": "padding-free scoring: each packed row holds this many padded rows' slots",
    "log_confidence": "log the confidence-shift diagnostics (one reference pass per step) even "
                      "when the recipe needs no reference log-probs",
    "lora_rank": "LoRA: rank of the adapters trained with the base weights frozen (0: full "
                 "fine-tuning); exports merge them",
    "lora_alpha": "LoRA: the adapters' output is scaled by lora_alpha / lora_rank",
    "lora_targets": "LoRA: comma-separated projections to adapt in every layer: q_proj, k_proj, "
                    "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head",
    "rollout_chunk": "sample this many rows at a time (bounds the KV cache; 0: all)",
    "steps": "RL steps",
    "seed": "seed of the RL run (sampling, advantages, mini-batches)",
    "eval_every": "evaluate every this many steps (and at the last)",
    "eval_problems": "test problems per evaluation (0: the whole test split)",
    "eval_samples": "samples per test problem (pass@k up to this k)",
    "eval_batch": "rows per evaluation sampling call",
    "averaging": "weight averages evaluated beside the raw policy, e.g. "
                 "'lawa:k=5,every=50;ema:decay=0.99'",
    "mesh_fsdp": "size of the mesh's fsdp axis (the rest is data parallel)",
    "param_sharding": "'replicate' or 'fsdp' (parameters and optimizer state sharded)",
    "run_dir": "run directory (default runs/<config>-<recipe>-s<seed>); rerunning resumes",
    "checkpoint_every": "save a checkpoint every this many steps (and at the last)",
    "keep_checkpoints": "checkpoints kept on disk",
    "resume_fallback": "resume from the previous checkpoint if the latest is corrupt",
    "logger": "experiment trackers beside metrics.jsonl: tensorboard, wandb or none; "
              "comma-separated for several",
    "guard_action": "silent-failure guards: 'warn', 'stop' (save and end the run) or 'off'",
    "guard_patience": "steps a guard's condition must hold before it fires",
    "guard_truncated": "share of truncated completions above which the truncation guard counts",
    "guard_logp_mismatch": "sampler-trainer log-prob gap per token above which the guard fires",
}


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


def build_recipe(cfg: RLConfig, max_len: int) -> obj.Recipe:
  """The configured recipe, with this run's facts (max completion length ``max_len``, group
  size) as its context; it must need nothing the trainer does not compute (``PROVIDED``)."""
  context = obj.RecipeContext(max_length=max_len, group_size=cfg.group_size)
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
