"""Host-side setup of an RL run: the task's records, the policy and the task arrays on device.

``build(cfg, log)`` is one pass, top to bottom:

1. the task (``rlpost.tasks.catalog.get_task``) and, with ``policy=/path``, the Hugging Face module,
   its tokenizer and stop tokens (``rlpost.models.policy.load_hf``);
2. the records, every prompt encoded with that tokenizer (``Tokenizer.encode_prompt``, after
   ``prompt_template`` for tasks that take one), prompts longer than ``max_prompt_tokens``
   dropped;
3. the start: the checkpoint as loaded, or the character model sized to the prompts and
   demonstrations, initialised once and started in place from the pinned ``init_params`` or the
   SFT warm start on the train split's demonstrations (cached by content);
4. with ``lora_rank`` > 0, LoRA adapters on that module (``rlpost.models.lora.apply``, B = 0:
   the same function as before);
5. the module split once into a ``Policy``, and the task arrays.

``character_model_config(cfg, log)`` gives the character model's size alone (for export), without
a model or a warm start; ``character_start`` its starting parameters alone (for testbeds).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

from flax import nnx

from rlpost.models import lora
from rlpost.models import transformer as tfm
from rlpost.models.policy import Policy, load_hf
from rlpost.tasks import base as task_base
from rlpost.tasks import catalog
from rlpost.tasks.base import Task, TaskArrays
from rlpost.tokenizer import CharTokenizer
from rlpost.train import sft
from rlpost.train.rl_config import DEFAULT_MODEL, RLConfig


class Setup(NamedTuple):
  task: Task
  records: dict[str, list[dict]]
  policy: Policy
  train_data: TaskArrays
  test_data: TaskArrays
  max_new_tokens: int


def build(cfg: RLConfig, log: Callable[[str], None], *, progress: bool = True) -> Setup:
  """The run's task, records, policy and task arrays, in one pass: each stage takes the model
  the last one made and gives it on (one module, split into a ``Policy`` once at the end)."""
  task = catalog.get_task(cfg.task)(cfg)
  pretrained = _pretrained(cfg) if cfg.policy else None  # (module, tokenizer, stop tokens)
  tok = pretrained[1] if pretrained else CharTokenizer()
  records, ids = _encode_prompts(cfg, task, task.load(log), tok, log)
  if cfg.eval_problems > len(records["test"]):
    log(f"eval_problems={cfg.eval_problems} exceeds the {len(records['test'])} {cfg.task} "
        f"test problems: evaluating all {len(records['test'])}")
  tp = _prompt_len(ids)
  if pretrained is None:
    model_cfg, max_new = _character_config(cfg, records, tp)
    model, stops = _character_start(cfg, model_cfg, records, log, progress), None
  else:
    (model, _, stops), max_new = pretrained, cfg.max_new_tokens
    _check_pretrained(cfg, model, tok, stops, records, tp, log)
  if cfg.lora_rank:
    model = _with_adapters(model, cfg.lora_config(), log)
  policy = Policy.from_model(model, tok, stops)
  jax_reward = task.jax_reward is not None and isinstance(tok, CharTokenizer)
  arrays = {split: task_base.task_arrays(
      records[split], ids[split], pad_id=policy.pad_id, length=tp,
      answers=task.answer_arrays(records[split], tok) if jax_reward else None)
      for split in task_base.SPLITS}
  return Setup(task, records, policy, arrays["train"], arrays["test"], max_new)


def _pretrained(cfg: RLConfig):
  """(module, tokenizer, stop tokens) of the Hugging Face checkpoint ``cfg.policy``."""
  return load_hf(cfg.policy, dtype=cfg.model.get("dtype", "float32"),
                 param_dtype=cfg.model.get("param_dtype"),
                 max_seq_len=cfg.model.get("max_seq_len"),
                 attention=cfg.model.get("attention", "xla"),
                 stacked_layers=cfg.model.get("stacked_layers", False),
                 extra_stop_tokens=cfg.extra_stop_tokens)


def _check_pretrained(cfg: RLConfig, model: tfm.Transformer, tok, stops, records: dict,
                      tp: int, log) -> None:
  max_new = cfg.max_new_tokens
  if tp + max_new > model.cfg.max_seq_len:
    raise ValueError(
        f"prompts of up to {tp} tokens + max_new_tokens {max_new} exceed the policy's "
        f"max_seq_len {model.cfg.max_seq_len} ({cfg.policy}/config.json "
        "max_position_embeddings); lower 'max_prompt_tokens' or 'max_new_tokens', or set "
        "model={'max_seq_len': ...}")
  log(f"policy {cfg.policy}: {model.cfg.num_params() / 1e6:.1f}M parameters, "
      f"{tok.vocab_size} tokens, stop ids {list(dict.fromkeys(stops))}, pad id {tok.pad_id}; "
      f"{len(records['train'])} train / {len(records['test'])} test prompts of <= {tp} "
      "tokens; no SFT warm start")


def _with_adapters(model: tfm.Transformer, lora_cfg: lora.LoraConfig,
                   log: Callable[[str], None]) -> tfm.Transformer:
  try:
    model = lora.apply(model, lora_cfg)
  except ValueError as e:
    raise ValueError(f"config key 'lora_targets': {e}") from None
  total, trainable = lora.count(nnx.state(model))
  log(f"LoRA rank {lora_cfg.rank} (alpha {lora_cfg.alpha:g}) on {', '.join(lora_cfg.targets)}: "
      f"{trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.2f}%)")
  return model


def _encode_prompts(cfg: RLConfig, task: Task, records: dict, tok, log):
  """Prompt ids per split; records whose prompt exceeds max_prompt_tokens are dropped."""
  template = cfg.prompt_template if task.takes_prompt_template else "{question}"
  out_records, ids = {}, {}
  for split in task_base.SPLITS:
    split_records = records[split]
    enc = []
    for i, r in enumerate(split_records):
      try:
        enc.append(tok.encode_prompt(task_base.format_prompt(template, r["prompt"])))
      except ValueError as e:
        raise ValueError(f"{cfg.task} {split}: prompt of record {i}: {e}") from None
    empty = [i for i, e in enumerate(enc) if not e]
    if empty:
      raise ValueError(f"{cfg.task} {split}: prompt of record {empty[0]} encodes to no tokens")
    if cfg.max_prompt_tokens:
      keep = [i for i, e in enumerate(enc) if len(e) <= cfg.max_prompt_tokens]
      if len(keep) < len(enc):
        log(f"{cfg.task} {split}: dropped {len(enc) - len(keep)} of {len(enc)} prompts "
            f"longer than max_prompt_tokens={cfg.max_prompt_tokens}")
      if not keep:
        raise ValueError(f"{cfg.task} {split}: every prompt is longer than max_prompt_tokens="
                         f"{cfg.max_prompt_tokens}")
      split_records, enc = [split_records[i] for i in keep], [enc[i] for i in keep]
    out_records[split], ids[split] = split_records, enc
  return out_records, ids


def _prompt_len(ids: dict) -> int:
  """Tp: the longest encoded prompt over the splits."""
  return max(len(e) for split in ids.values() for e in split)


def _character_config(cfg: RLConfig, records: dict, tp: int) -> tuple[tfm.TransformerConfig, int]:
  """(the character model's config, max_new_tokens) for prompts of ``tp`` tokens and the
  demonstrations of ``records``."""
  tok = CharTokenizer()
  longest_demo = max(len(r["demo"]) for r in records["train"] + records["test"])
  max_new = cfg.max_new_tokens or longest_demo + 2
  model_kw = dict(DEFAULT_MODEL, **cfg.model)
  model_kw.setdefault("vocab_size", tok.vocab_size)
  model_kw["max_seq_len"] = max(model_kw["max_seq_len"], tp + longest_demo + 2, tp + max_new)
  return tfm.TransformerConfig(**model_kw), max_new


def character_model_config(cfg: RLConfig, log: Callable[[str], None]) -> tfm.TransformerConfig:
  """The character model's config as ``build`` sizes it for ``cfg`` (a run without ``policy``).

  Loads and encodes the task's records (``max_seq_len`` follows from the longest prompt and
  demonstration); builds no model and runs no warm start.
  """
  if cfg.policy:
    raise ValueError(f"the run uses the policy {cfg.policy}, not the character model")
  task = catalog.get_task(cfg.task)(cfg)
  records, ids = _encode_prompts(cfg, task, task.load(log), CharTokenizer(), log)
  return _character_config(cfg, records, _prompt_len(ids))[0]


def character_start(cfg: RLConfig, log: Callable[[str], None], *,
                    progress: bool = True) -> nnx.State:
  """The character model's starting parameters for ``cfg``, layers stored one by one: the SFT
  warm start (through ``cache_dir``) or the pinned ``init_params``, as ``build`` makes them,
  without the rest of the run (``scripts/testbed.py build``)."""
  if cfg.policy:
    raise ValueError(f"the run uses the policy {cfg.policy}, not the character model")
  cfg = dataclasses.replace(cfg, model=dict(cfg.model, stacked_layers=False))
  task = catalog.get_task(cfg.task)(cfg)
  records, ids = _encode_prompts(cfg, task, task.load(log), CharTokenizer(), log)
  model_cfg, _ = _character_config(cfg, records, _prompt_len(ids))
  return nnx.state(_character_start(cfg, model_cfg, records, log, progress))


def _character_start(cfg: RLConfig, model_cfg: tfm.TransformerConfig, records: dict, log,
                     progress: bool = True) -> tfm.Transformer:
  """The character model of ``model_cfg``, initialised and started: the pinned ``init_params``
  or the SFT warm start on the train split (cached under ``cache_dir`` by content)."""
  tok = CharTokenizer()
  # Layer storage changes how the weights are held, not the function: the model is initialised
  # and warm-started with its layers stored one by one (the same weights and SFT cache either
  # way) and restacked after.
  stacked = model_cfg.stacked_layers
  model = tfm.init_model(model_cfg.replace(stacked_layers=False), seed=cfg.model_seed)
  if cfg.init_params:
    from rlpost.train import pinned

    nnx.update(model, pinned.load(cfg.init_params, nnx.state(model)))
    log(f"starting from the pinned policy {cfg.init_params}")
  elif cfg.sft_steps:
    sft_cfg = sft.SFTConfig(steps=cfg.sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr,
                            seed=cfg.model_seed)
    # The SFT data: the task's train records, less prompts dropped by max_prompt_tokens.
    dropped = [cfg.max_prompt_tokens] if cfg.max_prompt_tokens else []
    key = sft.cache_key(model.cfg, sft_cfg, cfg.task, cfg.task_spec, cfg.num_train,
                        cfg.num_test, cfg.data_seed, cfg.model_seed, *dropped)
    sft.cached_sft(model, records["train"], tok, sft_cfg, cfg.cache_dir, key, log=log,
                   progress=progress)
  return tfm.with_layers_stacked(model, stacked)
