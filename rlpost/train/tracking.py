"""Experiment trackers beside ``metrics.jsonl``, which stays the record of a run.

``make_logger(kind, run_dir, config, resume_step=None)`` returns a ``Logger`` with
``log(step, prefix, values)`` (the numeric entries of ``values`` as ``prefix/key`` at ``step``)
and ``close()``. Kinds, comma-separated to use several (``"tensorboard,wandb"``):

- ``tensorboard``: event files in ``run_dir/tb`` (``tensorboard --logdir runs``); a resumed run
  purges the events a killed process wrote after its checkpoint.
- ``wandb``: Weights & Biases (``pip install -e .[wandb]``). The run's id is kept in
  ``run_dir/wandb_id``, so a resumed run continues the same W&B run; its files go to
  ``$WANDB_DIR`` if set, else into ``run_dir``. ``WANDB_MODE=offline`` needs no network
  (``wandb sync`` uploads later); ``WANDB_PROJECT`` names the project (default ``rlpost``).
  W&B cannot drop steps, so after a resume it ignores rows of steps it already holds.
- ``none``: nothing beyond ``metrics.jsonl``.
"""

from __future__ import annotations

import os
import uuid
from typing import Protocol

KINDS = ("tensorboard", "wandb", "none")


class Logger(Protocol):
  def log(self, step: int, prefix: str, values: dict) -> None: ...

  def close(self) -> None: ...


def _scalars(prefix: str, values: dict) -> dict[str, float]:
  return {f"{prefix}/{k}": float(v) for k, v in values.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}


class NullLogger:
  def log(self, step: int, prefix: str, values: dict) -> None:
    pass

  def close(self) -> None:
    pass


class TensorBoardLogger:
  def __init__(self, log_dir: str, *, purge_step: int | None = None):
    from tensorboardX import SummaryWriter

    self.writer = SummaryWriter(log_dir, purge_step=purge_step)

  def log(self, step: int, prefix: str, values: dict) -> None:
    for tag, v in _scalars(prefix, values).items():
      self.writer.add_scalar(tag.replace("@", "_at_"), v, step)  # TB tags allow no "@"

  def close(self) -> None:
    self.writer.close()


class WandbLogger:
  def __init__(self, run_dir: str, config: dict):
    try:
      import wandb
    except ImportError:
      raise ImportError("logger='wandb' needs the wandb package: pip install -e '.[wandb]' "
                        "(or pip install wandb)") from None
    id_path = os.path.join(run_dir, "wandb_id")
    if os.path.exists(id_path):
      with open(id_path) as f:
        run_id = f.read().strip()
    else:
      run_id = uuid.uuid4().hex[:12]
      with open(id_path, "w") as f:
        f.write(run_id + "\n")
    self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlpost"),
                          name=os.path.basename(os.path.abspath(run_dir)), id=run_id,
                          resume="allow", config=config,
                          dir=os.environ.get("WANDB_DIR") or run_dir)

  def log(self, step: int, prefix: str, values: dict) -> None:
    self.run.log(_scalars(prefix, values), step=step)

  def close(self) -> None:
    self.run.finish()


class _Several:
  def __init__(self, loggers: list):
    self.loggers = loggers

  def log(self, step: int, prefix: str, values: dict) -> None:
    for lg in self.loggers:
      lg.log(step, prefix, values)

  def close(self) -> None:
    for lg in self.loggers:
      lg.close()


def parse_kinds(kind: str) -> list[str]:
  """The kinds of a ``logger`` value (``"tensorboard,wandb"`` -> both), checked."""
  kinds = [k.strip() for k in kind.split(",") if k.strip()]
  bad = [k for k in kinds if k not in KINDS]
  if not kinds or bad:
    raise ValueError(f"config key 'logger': unknown kind(s) {bad or [kind]}; known: "
                     f"{list(KINDS)}, comma-separated to use several")
  return kinds


def make_logger(kind: str, run_dir: str, config: dict, *,
                resume_step: int | None = None) -> Logger:
  """The trackers named by ``kind`` for the run in ``run_dir`` (see the module docstring);
  ``resume_step`` is the checkpoint step a resumed run continues from."""
  loggers = []
  try:
    for k in parse_kinds(kind):
      if k == "tensorboard":
        purge = None if resume_step is None else resume_step + 1
        loggers.append(TensorBoardLogger(os.path.join(run_dir, "tb"), purge_step=purge))
      elif k == "wandb":
        loggers.append(WandbLogger(run_dir, config))
  except BaseException:
    _Several(loggers).close()
    raise
  if not loggers:
    return NullLogger()
  return loggers[0] if len(loggers) == 1 else _Several(loggers)
