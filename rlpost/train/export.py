"""A run's checkpoint (or a weight average of its checkpoints) as a Hugging Face directory.

    export_run("runs/x", "exports/x")                                  # the latest checkpoint
    export_run("runs/x", "exports/x", step=200)
    export_run("runs/x", "exports/x", average="lawa:k=5,every=100")    # rlpost.averaging spec

The directory holds config.json, model.safetensors, the tokenizer files and ``export.json``
(where the weights came from), so ``transformers.AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load it:

  policy run      (``policy=PATH`` in the run's config): the source checkpoint's architecture, its
                  bos / eos / pad ids (``hf.special_token_ids``) and its tokenizer files
                  (``hf.TOKENIZER_FILES``: tokenizer.json, tokenizer_config.json, ...,
                  generation_config.json) copied from PATH, which must still exist;
  character run   the built-in model as a Llama model (a Qwen2 one with ``qkv_bias``), sized as
                  the run sized it (``setup.character_model_config``, which reads the task's
                  records), with its ``CharTokenizer`` as a WordLevel tokenizer.json
                  (``hf.write_char_tokenizer``) and a generation_config.json; pad 0, bos 1, eos 2.

LoRA runs (``lora_rank`` > 0) are exported merged: each checkpoint's adapters are folded into
their kernels (``lora.merge_params``: W + alpha / r * A B) as it is read, so the directory is an
ordinary model of the base architecture, and an average is the average of the merged weights of
its checkpoints (never of the factors A and B, whose product is bilinear).

``plan_export`` checks every input before any array is read or anything is written; its errors
are one line (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError). Parameters are
read alone from the run's checkpoints (``averaging.CheckpointSource``: an orbax partial restore,
each leaf checked against its checksum) and the directory is written beside ``out`` and renamed
into place (``hf.save_pretrained``), so an interrupted export leaves nothing at ``out``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import jax
from flax import nnx

from rlpost import averaging, paths
from rlpost.averaging.checkpoints import refuse_incomplete, scan_steps
from rlpost.models import hf, lora
from rlpost.models import transformer as tfm
from rlpost.tokenizer import CharTokenizer
from rlpost.train import config as config_lib
from rlpost.train import setup
from rlpost.train.rl_config import RLConfig

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
INFO_FILE = "export.json"


@dataclasses.dataclass(frozen=True)
class ExportPlan:
  """What ``export_run`` reads and writes, every input checked.

  Attributes:
    run_dir: the run directory (absolute).
    out: the directory to write (absolute).
    config: the run's config.json (a dict).
    plan: the checkpoints read and their weights (one step with weight 1, or an average).
    average: the averaging spec, or None for one checkpoint.
    replace: ``out`` exists (empty, or ``overwrite`` was given) and is replaced.
  """

  run_dir: str
  out: str
  config: dict
  plan: averaging.Plan
  average: str | None
  replace: bool

  @property
  def checkpoints(self) -> str:
    return os.path.join(self.run_dir, CHECKPOINTS)

  @property
  def policy(self) -> str:
    """The run's Hugging Face policy directory ("" for the character model)."""
    return self.config.get("policy") or ""


def plan_export(run_dir: str, out: str, *, step: int | None = None, average: str | None = None,
                overwrite: bool = False) -> ExportPlan:
  """Check an export's inputs; reads only small JSON files and directory listings.

  Args:
    run_dir: a run directory (``rlpost.train.loop.run``): config.json and checkpoints/.
    out: the Hugging Face directory to create; an existing non-empty one only with ``overwrite``.
    step: the checkpoint to export (default: the latest step directory).
    average: an ``rlpost.averaging`` spec (``averaging.plan_from_spec``) to export the average of
      the run's checkpoints instead; excludes ``step``.
    overwrite: replace a non-empty ``out``.

  Raises ValueError / FileNotFoundError / FileExistsError / NotADirectoryError with one line
  naming the input: both ``step`` and ``average``, a ``run_dir`` that is not a run (the missing
  file), a ``step`` without a checkpoint (listing those there are), a bad spec, an ``out`` that
  is a file, is not empty, or would hold the run itself, or a policy directory that is gone; and
  ``CheckpointError`` naming the step and its directory when the checkpoint to export (by
  default the latest step directory), or one the average selects, is incomplete
  (``averaging.checkpoints.scan_steps``: no state/ or meta/ item).
  """
  if step is not None and average is not None:
    raise ValueError("--step and --average exclude each other: export one checkpoint or an "
                     "average of several")
  run_dir = os.path.abspath(run_dir)
  if not os.path.isdir(run_dir):
    what = "is a file" if os.path.exists(run_dir) else "does not exist"
    raise (NotADirectoryError if os.path.exists(run_dir) else FileNotFoundError)(
        f"run directory {run_dir} {what}")
  config = _read_run_config(run_dir)
  ckpt_dir = os.path.join(run_dir, CHECKPOINTS)
  if not os.path.isdir(ckpt_dir):
    raise FileNotFoundError(f"{run_dir} is not a run directory: it has no {CHECKPOINTS}/")
  # Every checkpoint directory takes part in the selection, incomplete ones too, so a damaged
  # latest step is refused (as a resumed run refuses it) rather than silently passed over; an
  # explicit --step, or an average whose selection leaves it out, still reads the others.
  steps, incomplete = scan_steps(ckpt_dir)
  if not steps:
    raise FileNotFoundError(f"{ckpt_dir} holds no complete checkpoint")
  if average is not None:
    plan = averaging.plan_from_spec(average, steps)
  else:
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise ValueError(f"no checkpoint at step {step} in {ckpt_dir}; available steps: "
                       f"{', '.join(map(str, steps))}")
    plan = averaging.plan_uniform([step], method="step")
  refuse_incomplete(ckpt_dir, [s for s, w in zip(plan.items, plan.weights) if w != 0], incomplete)
  policy = config.get("policy") or ""
  replace = _check_out(os.path.abspath(out), [run_dir] + ([policy] if policy else []), overwrite)
  if policy and not os.path.isfile(os.path.join(policy, hf.CONFIG_NAME)):
    raise FileNotFoundError(f"the run's policy {policy} has no {hf.CONFIG_NAME} (moved or "
                            "deleted?); the export needs its config and tokenizer files")
  return ExportPlan(run_dir, os.path.abspath(out), config, plan, average, replace)


def _read_run_config(run_dir: str) -> dict:
  path = os.path.join(run_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
  return hf.read_json(path)


def _check_out(out: str, reads: list[str], overwrite: bool) -> bool:
  """Whether ``out`` exists and is to be replaced; raises if it must not be touched: it is,
  contains or lies inside what the export reads (the run, its policy directory), lies inside a
  checkpoint directory or replaces a run (``paths.check_output``), is a file, is not empty
  without ``overwrite``, or is not writable with room (``paths.check_writable``)."""
  paths.check_output(out, "--out", reads=reads, overwrite=overwrite)
  exists = os.path.exists(out)
  if exists and not os.path.isdir(out):
    raise NotADirectoryError(f"--out {out} is a file")
  if exists and os.listdir(out) and not overwrite:
    raise FileExistsError(f"--out {out} exists and is not empty; pass --overwrite to replace it")
  paths.check_writable(out, "--out")
  return exists


def model_config(plan: ExportPlan, log: Callable[[str], None] = print
                 ) -> tuple[tfm.TransformerConfig, str]:
  """(the run's model config, its Hugging Face architecture: the source's, or for the character
  model ``hf.architecture_for`` its config).

  A policy run's model is its source config.json's, in the run's parameter dtype; the character
  model is sized as the run sized it (the task's records are read for its ``max_seq_len``).
  """
  if plan.policy:
    model = plan.config.get("model") or {}
    source = hf.read_json(os.path.join(plan.policy, hf.CONFIG_NAME))
    cfg = hf.config_from_hf(source, dtype=model.get("dtype", "float32"),
                            param_dtype=model.get("param_dtype"))
    cfg = cfg.replace(stacked_layers=bool(model.get("stacked_layers", False)))
    return cfg, hf.architecture_of(source)
  run_cfg = config_lib.from_dict(RLConfig, plan.config,
                                 where=os.path.join(plan.run_dir, CONFIG_FILE))
  cfg = setup.character_model_config(run_cfg, log)
  return cfg, hf.architecture_for(cfg)


def lora_config(plan: ExportPlan) -> lora.LoraConfig | None:
  """The run's LoRA adapters (``RLConfig.lora_config``), None for a full fine-tuning run."""
  keys = ("lora_rank", "lora_alpha", "lora_targets", "seed")
  return RLConfig(**{k: plan.config[k] for k in keys if k in plan.config}).lora_config()


def load_model(plan: ExportPlan, cfg: tfm.TransformerConfig, *,
               progress: bool = False) -> tfm.Transformer:
  """The model of ``cfg`` with the planned checkpoint's (or average's) parameters; a LoRA
  run's adapters merged into the kernels of each checkpoint before averaging.

  Reads the parameter leaves alone (the count the run loop declares in each checkpoint) and
  checks them against the model's leaves (with its adapters for a LoRA run), shape and dtype,
  naming the first that differs.
  """
  adapters = lora_config(plan)

  def build(with_adapters: bool):
    model = tfm.Transformer(cfg, rngs=nnx.Rngs(0))
    return lora.apply(model, adapters) if with_adapters else model

  graphdef, base_state = nnx.split(nnx.eval_shape(lambda: build(False)))
  run_state = nnx.split(nnx.eval_shape(lambda: build(adapters is not None)))[1]
  want, treedef = jax.tree.flatten(run_state)

  def load(step):
    values = src.load(step)
    params = jax.tree.unflatten(treedef, [values[k] for k in src.keys])
    return params if adapters is None else lora.merge_params(params, scale=adapters.scale)

  with averaging.CheckpointSource(plan.checkpoints, keys="auto") as src:
    got = src.validate([s for s, w in zip(plan.plan.items, plan.plan.weights) if w != 0])
    if len(src.keys) != len(want):
      raise ValueError(f"the checkpoints in {plan.checkpoints} hold {len(src.keys)} parameter "
                       f"arrays but the model rebuilt from the run's config has {len(want)}")
    for k, x in zip(src.keys, want):
      if got[k] != (tuple(x.shape), x.dtype):
        raise ValueError(f"checkpoint parameter {k} is {got[k][1]}{list(got[k][0])} but the "
                         f"model rebuilt from the run's config expects {x.dtype}{list(x.shape)}")
    values = averaging.average(load, plan.plan, progress=progress)
  leaves, base_treedef = jax.tree.flatten(base_state)
  return nnx.merge(graphdef, jax.tree.unflatten(
      base_treedef, [v.astype(x.dtype) for v, x in zip(jax.tree.leaves(values), leaves)]))


def export_run(run_dir: str, out: str, *, step: int | None = None, average: str | None = None,
               overwrite: bool = False, log: Callable[[str], None] = print,
               progress: bool = False) -> Path:
  """Write a run's checkpoint ``step`` (default the latest), or the ``average`` of its
  checkpoints, to ``out`` as a Hugging Face directory (see the module docstring); returns
  ``out``. Arguments as in ``plan_export``."""
  plan = plan_export(run_dir, out, step=step, average=average, overwrite=overwrite)
  cfg, arch = model_config(plan, log)
  model = load_model(plan, cfg, progress=progress)
  info = {"run_dir": plan.run_dir, "average": plan.average, "plan": plan.plan.to_json(),
          "architecture": arch, "policy": plan.policy or None}
  adapters = lora_config(plan)
  if adapters is not None:
    info["lora"] = dict(dataclasses.asdict(adapters), merged=True)
  with tempfile.TemporaryDirectory(prefix="rlpost-export-") as staging:
    files = [Path(staging) / INFO_FILE]
    with open(files[0], "w") as f:
      json.dump(info, f, indent=2, sort_keys=True)
    if plan.policy:
      hf.save_pretrained(model, plan.out, architecture=arch, source=plan.policy,
                         extra_files=files, overwrite=plan.replace)
    else:
      tok = CharTokenizer()
      files += hf.write_char_tokenizer(tok, staging, model_max_length=cfg.max_seq_len)
      ids = dict(bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
      files.append(Path(staging) / "generation_config.json")
      with open(files[-1], "w") as f:
        json.dump(ids, f, indent=2, sort_keys=True)
      hf.save_pretrained(model, plan.out, architecture=arch, extra_files=files,
                         overwrite=plan.replace, **ids)
  what = (f"the {plan.average} average of steps {list(plan.plan.items)}" if plan.average
          else f"step {plan.plan.items[0]}")
  merged = "" if adapters is None else f", LoRA rank {adapters.rank} adapters merged"
  log(f"exported {what} of {plan.run_dir} ({arch}, {cfg.num_params() / 1e6:.2f}M parameters"
      f"{merged}) to {plan.out}")
  return Path(plan.out)
