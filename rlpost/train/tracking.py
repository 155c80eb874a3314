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
  W&B cannot drop steps, so after a resume it ignores entries of steps it already holds.
- ``none``: nothing beyond ``metrics.jsonl``.

A tracker never stops or hangs a run. Each one runs on its own worker thread and every call
(creation, ``log``, ``close``) waits at most ``timeout`` seconds (``RLPOST_TRACKER_TIMEOUT``,
default 120). A tracker whose call raises (a full disk, a lost connection) or does not return
in time is reported once through ``warn`` and disabled; the run goes on with ``metrics.jsonl``,
which stays complete. TensorBoard events are written synchronously on that thread (no second
writer thread inside the tracker that could die and leave its queue waiting forever).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from typing import Callable, Protocol

KINDS = ("tensorboard", "wandb", "none")
TIMEOUT_ENV = "RLPOST_TRACKER_TIMEOUT"
DEFAULT_TIMEOUT = 120.0


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
  """Scalars in a TensorBoard event file under ``log_dir``, written and flushed at each call.

  purge_step: the step a resumed run continues from; TensorBoard hides the events of steps >=
    it that an earlier process wrote (a ``SessionLog.START`` event at that step, as
    ``tensorboardX.SummaryWriter(purge_step=...)`` writes).
  """

  def __init__(self, log_dir: str, *, purge_step: int | None = None):
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog
    from tensorboardX.summary import scalar

    self._event, self._scalar = Event, scalar
    os.makedirs(log_dir, exist_ok=True)
    self.writer = EventsWriter(os.path.join(log_dir, "events"))
    if purge_step is not None:
      self.writer.write_event(Event(step=purge_step, wall_time=time.time(),
                                    session_log=SessionLog(status=SessionLog.START)))
    self.writer.flush()

  def log(self, step: int, prefix: str, values: dict) -> None:
    now = time.time()
    for tag, v in _scalars(prefix, values).items():
      # TensorBoard tags allow no "@".
      self.writer.write_event(self._event(wall_time=now, step=step,
                                          summary=self._scalar(tag.replace("@", "_at_"), v)))
    self.writer.flush()

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


def timeout_seconds() -> float:
  """The longest wait on a tracker call (``RLPOST_TRACKER_TIMEOUT``, default 120 s)."""
  text = os.environ.get(TIMEOUT_ENV, "").strip()
  try:
    value = float(text) if text else DEFAULT_TIMEOUT
  except ValueError:
    raise ValueError(f"environment variable {TIMEOUT_ENV}={text!r} is not a number") from None
  if not value > 0:
    raise ValueError(f"environment variable {TIMEOUT_ENV}={text!r} must be > 0")
  return value


class Guarded:
  """A tracker built and called on its own daemon thread, each call waited on for at most
  ``timeout`` seconds; the first failure or timeout is reported through ``warn`` and disables
  it (later calls do nothing).

  make: builds the tracker (on the worker thread). Creation failures of the user's own making
  (a ``ValueError`` or ``ImportError``, e.g. a missing package) are raised to the caller, not
  swallowed: they are configuration errors, not runtime failures.
  """

  def __init__(self, name: str, make: Callable[[], Logger], *, warn: Callable[[str], None],
               timeout: float | None = None):
    self.name = name
    self.warn = warn
    self.timeout = timeout_seconds() if timeout is None else timeout
    self.disabled = False
    self.logger = None
    self._calls: queue.Queue = queue.Queue()
    self._thread = threading.Thread(target=self._serve, name=f"rlpost-tracker-{name}",
                                    daemon=True)
    self._thread.start()
    self.logger = self._call("start", make, raise_config_errors=True)

  def _serve(self) -> None:
    while True:
      item = self._calls.get()
      if item is None:
        return
      fn, box, done = item
      try:
        box["value"] = fn()
      except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
        box["error"] = e
      done.set()

  def _call(self, what: str, fn, *, raise_config_errors: bool = False):
    if self.disabled:
      return None
    box, done = {}, threading.Event()
    self._calls.put((fn, box, done))
    if not done.wait(self.timeout):
      self._disable(f"{what} did not return within {self.timeout:g}s "
                    f"({TIMEOUT_ENV} sets the limit)")
      return None
    err = box.get("error")
    if err is None:
      return box.get("value")
    if raise_config_errors and isinstance(err, (ValueError, ImportError)):
      self._stop()
      raise err
    text = " ".join(str(err).split()) or type(err).__name__
    self._disable(f"{what} failed ({type(err).__name__}: {text[:200]})")
    return None

  def _disable(self, why: str) -> None:
    self.disabled = True
    self.warn(f"WARNING: tracker {self.name}: {why}; it is disabled and the run goes on "
              "(metrics.jsonl keeps every entry)")
    self._stop()

  def _stop(self) -> None:
    self._calls.put(None)

  def log(self, step: int, prefix: str, values: dict) -> None:
    logger = self.logger
    if logger is not None:
      self._call(f"logging step {step}", lambda: logger.log(step, prefix, values))

  def close(self) -> None:
    logger = self.logger
    if logger is not None and not self.disabled:
      self._call("closing", logger.close)
      self._stop()
    self.logger = None


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
                resume_step: int | None = None, warn: Callable[[str], None] = print,
                timeout: float | None = None) -> Logger:
  """The trackers named by ``kind`` for the run in ``run_dir`` (see the module docstring),
  each ``Guarded``; ``resume_step`` is the checkpoint step a resumed run continues from, and
  ``warn`` reports a tracker that fails and is disabled."""
  kinds = [k for k in parse_kinds(kind) if k != "none"]
  if not kinds:
    return NullLogger()
  purge = None if resume_step is None else resume_step + 1
  makers = {"tensorboard": lambda: TensorBoardLogger(os.path.join(run_dir, "tb"),
                                                      purge_step=purge),
            "wandb": lambda: WandbLogger(run_dir, config)}
  loggers = []
  try:
    for k in kinds:
      loggers.append(Guarded(k, makers[k], warn=warn, timeout=timeout))
  except BaseException:
    _Several(loggers).close()
    raise
  return loggers[0] if len(loggers) == 1 else _Several(loggers)
