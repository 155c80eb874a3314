"""The outer training loop: resume, step, evaluate, log, checkpoint, plot.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per step or
evaluation), ``tb/`` (TensorBoard event files: ``tensorboard --logdir runs``; the ``logger``
key chooses the trackers, see ``rlpost.train.tracking``), ``checkpoints/`` (orbax) and
``learning_curve.png`` (redrawn at every evaluation, so a killed run has one).

Crash safety: resuming restores the latest complete checkpoint, verified against its manifest
(structure, shapes, dtypes, checksums, finite values), and continues bit for bit (the state
carries the PRNG key, step and data cursor). Metric entries written after that checkpoint by the
interrupted process are dropped from ``metrics.jsonl`` (and purged from TensorBoard), so the log
of a run killed and resumed any number of times equals that of an uninterrupted run. A corrupt
latest checkpoint is an error naming its step unless ``resume_fallback`` is set. Resuming a
finished run does nothing and says so.

Failures: a non-finite loss or rollout stops the run, keeping the last good checkpoint, and the
error says which step that is. The silent-failure guards (``rlpost.train.guards``) warn, or with
``guard_action="stop"`` save and stop, naming the metric and the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import time

import jax
import numpy as np

from rlpost import averaging, paths, progress as progress_lib
from rlpost.train import checkpoint, guards, identity, tracking
from rlpost.train import config as config_lib
from rlpost.train.rl import RLConfig, RLState, Trainer, raise_if_bad


def _to_float(tree: dict) -> dict:
  return {k: float(v) for k, v in jax.device_get(tree).items()}


# Keys that may change between a run and its resumption: they do not change the trajectory
# (declared with each key: ``operational`` in ``rlpost.train.rl_config.RLConfig``).
OPERATIONAL_KEYS = config_lib.keys_where(RLConfig, operational=True)


def _primary() -> bool:
  """Only process 0 writes logs and plots (checkpoints coordinate through orbax)."""
  return jax.process_index() == 0


def _append(path: str, record: dict) -> None:
  if not _primary():
    return
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


def _truncate_metrics(path: str, last_step: int) -> None:
  """Keep the entries of steps <= ``last_step`` (a killed process may have left later ones and a
  partial last line); written to a temporary file and renamed, so a crash here loses nothing."""
  if not _primary() or not os.path.exists(path):
    return
  keep = []
  with open(path) as f:
    for line in f:
      try:
        entry = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut by the crash
      if isinstance(entry, dict) and entry.get("step", last_step + 1) <= last_step:
        keep.append(line if line.endswith("\n") else line + "\n")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(keep)
  os.replace(tmp, path)


def check_locations(run_dir: str, cfg) -> None:
  """Every location the run writes (``run_dir``, ``data_dir``, and ``cache_dir`` when a warm
  start is cached there) can be created, is writable and has ``paths.min_free_mb()`` free;
  else one line naming the key and the path."""
  paths.check_writable(run_dir, "config key 'run_dir'")
  paths.check_writable(cfg.data_dir, "config key 'data_dir'")
  if not cfg.policy and cfg.sft_steps:
    paths.check_writable(cfg.cache_dir, "config key 'cache_dir'")


def _stored_config(run_dir: str) -> tuple[int | None, dict | None]:
  """(step, config) stored in the latest complete checkpoint of ``run_dir`` that has a readable
  one (read from its JSON metadata alone); (None, None) if none has."""
  ckpt_dir = os.path.join(run_dir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    return None, None
  steps, incomplete = averaging.scan_steps(ckpt_dir)
  for step in reversed([s for s in steps if s not in incomplete]):
    try:
      with open(os.path.join(ckpt_dir, str(step), checkpoint.META_ITEM, "metadata")) as f:
        meta = json.load(f)
    except (OSError, ValueError):
      continue  # a damaged checkpoint: resume names it
    if isinstance(meta, dict) and isinstance(meta.get("config"), dict):
      return step, meta["config"]
  return None, None


def config_changes(run_dir: str, cfg) -> dict[str, dict]:
  """``{key: {"from": stored, "to": new}}`` for every key outside ``OPERATIONAL_KEYS`` on
  which ``cfg`` differs from the run stored in ``run_dir``: its ``config.json`` and the config
  saved in its latest checkpoint (which outlives a deleted or edited ``config.json``). Compared
  as JSON (tuples read back as lists); a key a stored config predates counts as its default."""
  cfg_dict = _config_json(cfg)
  defaults = json.loads(json.dumps(dataclasses.asdict(type(cfg)())))
  stored = []
  cfg_path = os.path.join(run_dir, "config.json")
  if os.path.exists(cfg_path):
    try:
      with open(cfg_path) as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      raise ValueError(f"{cfg_path} is unreadable ({e}); use another run_dir") from None
    if not isinstance(saved, dict):
      raise ValueError(f"{cfg_path} is not a JSON object; use another run_dir")
    stored.append(saved)
  step, in_ckpt = _stored_config(run_dir)
  if in_ckpt is not None:
    stored.append(in_ckpt)
  if hasattr(type(cfg), "upgrade"):  # configs stored by older versions, in today's keys
    stored = [json.loads(json.dumps(type(cfg).upgrade(dict(s)))) for s in stored]
  changes = {}
  for saved in stored:
    for k in sorted(set(saved) | set(cfg_dict)):
      old = saved.get(k, defaults.get(k))
      if k not in OPERATIONAL_KEYS and old != cfg_dict.get(k) and k not in changes:
        changes[k] = {"from": old, "to": cfg_dict.get(k)}
  return changes


def check_run_dir(run_dir: str, cfg, *, allow_config_change: bool = False) -> dict[str, dict]:
  """Fail early, before any data or model work, when ``run_dir`` cannot hold this run: it (or
  ``data_dir``, ``cache_dir``) is not a writable directory with room (``check_locations``),
  or it holds a run with a different config (``config_changes``) and ``allow_config_change``
  is not set. Returns the changes that were allowed."""
  if os.path.exists(run_dir) and not os.path.isdir(run_dir):
    raise NotADirectoryError(f"config key 'run_dir': {run_dir} is a file, not a directory")
  check_locations(run_dir, cfg)
  changes = config_changes(run_dir, cfg)
  changes.update(identity_changes(run_dir, cfg))
  if changes and not allow_config_change:
    shown = "; ".join(f"{k}: {v['from']!r} -> {v['to']!r}" for k, v in changes.items())
    if len(shown) > 200:
      shown = shown[:197] + "..."
    raise ValueError(f"{run_dir} holds a run with a different config (keys {sorted(changes)}); "
                     "use another run_dir, or pass --allow-config-change "
                     f"(allow_config_change=True) to continue it with the new values: {shown}")
  return changes


def identity_changes(run_dir: str, cfg) -> dict[str, dict]:
  """``{"identity:<key>": {"from", "to"}}`` for each entry of ``run_dir``'s ``identity.json``
  (``rlpost.train.identity``) that the files ``cfg`` names now differ from: other weights or
  data behind the same (or another) path. Nothing when the run has no identity yet or a file
  cannot be read (the run's own checks name it)."""
  stored = identity.read(run_dir)
  if stored is None:
    return {}
  try:
    now = identity.of_config(cfg)
  except OSError:
    return {}
  return {f"identity:{k}": {"from": identity.describe(stored, k), "to": identity.describe(now, k)}
          for k in identity.differences(stored, now)}


def _config_json(cfg) -> dict:
  return json.loads(json.dumps(dataclasses.asdict(cfg)))


_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EIO, errno.EACCES,
                             errno.EPERM, errno.EFBIG})


def _storage_error(e: BaseException) -> bool:
  """A failed write of the run's own files (disk full, read-only, quota, I/O), also when orbax
  reports it wrapped in another exception."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
      return True
    text = str(e)
    if any(m in text for m in ("No space left", "Read-only file system", "Disk quota",
                                "os_error_code='28'")):
      return True
    e = e.__cause__ or e.__context__
  return False


def _storage_reason(e: BaseException) -> str:
  """The cause of a storage failure in a few words (``No space left on device``), else the
  start of the message."""
  text = " ".join(str(e).split())
  for marker in ("No space left on device", "Read-only file system", "Disk quota exceeded",
                 "Permission denied", "Input/output error", "File too large"):
    if marker in text:
      return marker
  strerror = getattr(e, "strerror", None)
  return strerror or text[:120]


def run(trainer: Trainer, run_dir: str, *, progress: bool = True,
        allow_config_change: bool = False) -> dict:
  """Train ``trainer.cfg.steps`` steps in ``run_dir`` (resuming if it holds checkpoints).

  Returns {"state", "evals" (list of eval dicts with "step"), "resumed_from", "averages"
  ({name: averaged parameters} with ``averaging`` set, else {})}. A resume that fails (a
  corrupt checkpoint, another config) changes nothing in ``run_dir``. The run holds
  ``run_dir``'s lock (``rlpost.paths.RunLock``) throughout; a write that fails on the way (a
  full disk) stops it with ``rlpost.paths.StorageError`` naming the file, the step and the last
  good checkpoint.
  """
  if os.path.exists(run_dir) and not os.path.isdir(run_dir):
    raise NotADirectoryError(f"config key 'run_dir': {run_dir} is a file, not a directory")
  check_locations(run_dir, trainer.cfg)
  lock = paths.hold_run_dir(run_dir) if _primary() else contextlib.nullcontext()
  with lock, _held_orbax_errors() as held:
    try:
      return _run(trainer, run_dir, progress=progress, allow_config_change=allow_config_change)
    except paths.StorageError:
      held.clear()  # orbax's background threads' tracebacks of the same failure
      raise


class _HoldErrors(logging.Filter):
  """Holds back the error records (with tracebacks) that orbax's background threads log when
  a checkpoint write fails, so a storage failure is reported once, as one line."""

  def __init__(self):
    super().__init__()
    self.records: list[logging.LogRecord] = []

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname:
      self.records.append(record)
      return False
    return True

  def clear(self) -> None:
    self.records.clear()


@contextlib.contextmanager
def _held_orbax_errors():
  """Within the block, orbax's error records are held; after it, those still held (a failure
  that was not a storage error) are logged as they would have been."""
  logger = logging.getLogger("absl")
  hold = _HoldErrors()
  logger.addFilter(hold)
  try:
    yield hold
  finally:
    logger.removeFilter(hold)
    for record in hold.records:
      logger.handle(record)


def _run(trainer: Trainer, run_dir: str, *, progress: bool, allow_config_change: bool) -> dict:
  cfg = trainer.cfg
  log = trainer.log
  changes = check_run_dir(run_dir, cfg, allow_config_change=allow_config_change)
  cfg_dict = _config_json(cfg)
  os.makedirs(run_dir, exist_ok=True)
  cfg_path = os.path.join(run_dir, "config.json")
  metrics_path = os.path.join(run_dir, "metrics.jsonl")
  ckpt = checkpoint.Checkpointer(os.path.join(run_dir, "checkpoints"),
                                 keep_last=cfg.keep_checkpoints, best_metric="eval/pass@1")
  state = trainer.init_state()
  # Weight averages (LAWA, EMA, ...) travel beside the train state and in its checkpoints, so a
  # resumed run continues its averages exactly.
  # With LoRA, averages of the merged weights (``Trainer.averaging_params``).
  avg_params = trainer.averaging_params
  tracker = (averaging.Tracker(cfg.averaging, avg_params(state.params)) if cfg.averaging
             else None)
  like = (state, tracker.state) if tracker else state
  try:
    resumed_from, restored, meta = ckpt.restore_latest(like, fallback=cfg.resume_fallback, log=log)
  except BaseException:
    ckpt.close()
    raise
  evals = []
  last_good = resumed_from
  try:  # read before any write, so an unreadable input is not reported as a failed write
    ident = identity.of_config(cfg) if _primary() else None
  except BaseException:
    ckpt.close()
    raise
  where = [cfg_path, 0]  # the file being written and the step, for a storage error

  def stopped(e: BaseException) -> paths.StorageError:
    # Complete checkpoints only: orbax renames a step's directory into place when it is whole.
    try:
      done = [int(n) for n in os.listdir(ckpt.directory) if n.isdigit()]
    except OSError:
      done = []
    at = (f"the last complete checkpoint is step {max(done)}" if done
          else "no checkpoint is complete")
    what = ("a checkpoint in " + ckpt.directory if where[0].startswith(ckpt.directory)
            else where[0])
    return paths.StorageError(f"{_storage_reason(e)} at step {where[1]}: run stopped, {at} "
                              f"(cannot write {what})")

  # Until the training loop's own handler takes over: close the checkpoint manager on any
  # error, and report a failed write as one line.
  try:
    # Written only once the resume succeeded: a failed resume leaves the directory as it was.
    if _primary():
      tmp = cfg_path + ".tmp"
      with open(tmp, "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
      os.replace(tmp, cfg_path)
      where[0] = os.path.join(run_dir, identity.FILE)
      identity.write(run_dir, ident)
    where[0] = metrics_path
    if resumed_from is not None:
      if tracker:
        restored, tracker.state = restored
      state = RLState(*restored)
      evals = meta.get("evals", [])
      _truncate_metrics(metrics_path, resumed_from)
      log(f"resumed {run_dir} from step {resumed_from}")
      if changes:
        log(f"config changed on resume (allowed): "
            + "; ".join(f"{k}: {v['from']!r} -> {v['to']!r}" for k, v in changes.items()))
        entry = {"step": resumed_from, "config_change": changes}
        if not os.path.exists(metrics_path) or entry not in read_metrics(metrics_path):
          _append(metrics_path, entry)  # once, however often this checkpoint is resumed
      if resumed_from >= cfg.steps:
        log(f"run already finished at step {resumed_from} (steps={cfg.steps}); nothing to do")
        ckpt.close()
        averages = tracker.results(avg_params(state.params)) if tracker is not None else {}
        return {"state": state, "evals": evals, "resumed_from": resumed_from, "averages": averages}
    else:
      if os.path.exists(metrics_path):
        # An earlier attempt ran but was stopped before its first checkpoint was complete.
        log(f"no complete checkpoint in {ckpt.directory}; starting at step 0 (the metrics of the "
            "interrupted attempt are discarded)")
        if _primary():
          os.remove(metrics_path)

    n_test = trainer.test_data.prompt_tokens.shape[0]
    n_eval = min(cfg.eval_problems or n_test, n_test)
    evaluate = functools.partial(trainer.evaluate, progress=progress)
    curve_png = os.path.join(run_dir, "learning_curve.png")
    bar = None

    def say(text: str) -> None:
      progress_lib.message(bar, log, text)

    def do_eval(step: int):
      t0 = time.perf_counter()
      extra = f" (and {len(tracker.names)} weight averages)" if tracker and step > 0 else ""
      say(f"evaluating {n_eval} test problems x {cfg.eval_samples} samples at step {step}{extra}...")
      res = evaluate(state.params)
      if tracker is not None and step > 0:
        res.update(tracker.evaluate(evaluate, avg_params(state.params),
                                    keys=("pass@1", "pass@4")))
      res["step"] = step
      res["eval_seconds"] = time.perf_counter() - t0
      evals.append(res)
      where[0] = metrics_path
      _append(metrics_path, {"step": step, **{f"eval/{k}": v for k, v in res.items() if k != "step"}})
      if _primary():  # redrawn at every evaluation, so a run stopped at any point has its curve
        where[0] = curve_png
        plot_learning_curve(metrics_path, curve_png)
      return res

    def save(step: int, last_eval: dict | None):
      metrics = {"eval/pass@1": last_eval["pass@1"]} if last_eval and last_eval["step"] == step else None
      # The parameters are the first leaves of the saved tree; saying how many lets averaging
      # tools restore parameters alone.
      meta = {"config": cfg_dict, "evals": evals,
              "param_leaves": len(jax.tree.leaves(state.params))}
      where[0] = os.path.join(ckpt.directory, str(step))
      ckpt.save(step, (state, tracker.state) if tracker else state, meta, metrics)

    # On resume, TensorBoard events a killed process logged after the checkpoint are purged.
    trackers = (tracking.make_logger(cfg.logger, run_dir, cfg_dict, resume_step=resumed_from,
                                     warn=say)
                if _primary() else tracking.NullLogger())
  except BaseException as e:
    with contextlib.suppress(Exception):
      ckpt.close()
    if isinstance(e, Exception) and _storage_error(e):
      raise stopped(e) from None
    raise

  guard = None
  if cfg.guard_action != "off":
    patience = cfg.guard_patience
    if patience > cfg.steps:
      patience = max(1, cfg.steps // 2)
      log(f"note: guard_patience={cfg.guard_patience} exceeds steps={cfg.steps}; the guards "
          f"fire after {patience} steps instead")
    guard = guards.Guards(patience=patience, truncated=cfg.guard_truncated,
                          logp_mismatch=cfg.guard_logp_mismatch)
    for res in evals:  # a resumed run remembers the pass@1 it had reached
      guard.check_eval(res["step"], res)

  def alarm(step: int, alarms: list) -> None:
    for a in alarms:  # once, on its own line above the progress bar
      say(f"WARNING: {a}")
      where[0] = metrics_path
      _append(metrics_path, {"step": step, "guard/metric": a.metric, "guard/message": str(a)})

  start = int(state.step)
  history = []
  closed = False
  try:
    if start == 0:
      res = do_eval(0)
      trackers.log(0, "eval", res)
      if guard:
        alarm(0, guard.check_eval(0, res))
    bar = progress_lib.bar(total=cfg.steps, initial=start, disable=not progress, desc="rl")
    for step in range(start + 1, cfg.steps + 1):
      where[1] = step
      if step == start + 1:
        say("compiling the RL step (first call of this process; later steps reuse it)...")
      t0 = time.perf_counter()
      new_state, metrics = trainer.step(state)
      metrics = _to_float(metrics)
      try:
        raise_if_bad(metrics, step)
      except FloatingPointError as e:
        ckpt.wait()
        at = (f"last good checkpoint: step {last_good} in {ckpt.directory}" if last_good
              else "no checkpoint was saved yet")
        raise FloatingPointError(f"{e}; run stopped, {at}") from None
      state = new_state
      if tracker is not None:
        tracker.update(avg_params(state.params))
      metrics["step_seconds"] = time.perf_counter() - t0
      history.append(metrics)
      where[0] = metrics_path
      _append(metrics_path, {"step": step, **{f"train/{k}": v for k, v in metrics.items()}})
      trackers.log(step, "train", metrics)
      alarms = guard.check(step, metrics) if guard else []
      if step % cfg.eval_every == 0 or step == cfg.steps:
        res = do_eval(step)
        trackers.log(step, "eval", res)
        if guard:
          alarms += guard.check_eval(step, res)
      alarm(step, alarms)
      stop = bool(alarms) and cfg.guard_action == "stop"
      if step % cfg.checkpoint_every == 0 or step == cfg.steps or stop:
        save(step, evals[-1] if evals else None)
        last_good = step
      if stop:
        ckpt.wait()
        raise guards.TrainingStalled(
            f"{'; '.join(map(str, alarms))}; run stopped (guard_action='stop'), "
            f"checkpoint saved at step {step} in {ckpt.directory}")
      bar.update(1)
      post = {"reward": f"{metrics['reward']:.3f}", "loss": f"{metrics['loss']:.4f}"}
      # The first few metrics the allocation rule and the advantage chain report.
      post.update({k: f"{metrics[k]:.3g}" for k in getattr(trainer, "reported", ())[:3]
                   if k in metrics})
      if evals:
        post["pass@1"] = f"{evals[-1]['pass@1']:.3f}"
      bar.set_postfix(post)
    where[0] = ckpt.directory
    ckpt.close()
    closed = True
  except Exception as e:  # noqa: BLE001 - storage failures become one line; others re-raised
    if not _storage_error(e):
      raise
    # Let the saves in flight finish (or fail) first, so the message names what is complete.
    with contextlib.suppress(Exception):
      ckpt.close()
    closed = True
    raise stopped(e) from None
  finally:
    if bar is not None:
      bar.close()
    trackers.close()
    if not closed:
      try:
        ckpt.close()
      except Exception as e:  # noqa: BLE001 - the pending save's failure, after the first error
        if not _storage_error(e):
          raise
  averages = tracker.results(avg_params(state.params)) if tracker is not None else {}
  return {"state": state, "evals": evals, "resumed_from": resumed_from, "averages": averages}


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def plot_learning_curve(metrics_path: str, out_png: str) -> None:
  """Training reward (smoothed) and evaluation pass@1 against the step."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  entries = read_metrics(metrics_path)
  train = [(r["step"], r["train/reward"]) for r in entries if "train/reward" in r]
  ev = [(r["step"], r["eval/pass@1"]) for r in entries if "eval/pass@1" in r]
  fig, ax = plt.subplots(figsize=(6, 3.5))
  if train:
    s, v = np.array(train).T
    w = max(1, len(v) // 20)
    smooth = np.convolve(v, np.ones(w) / w, mode="valid")
    ax.plot(s[w - 1:], smooth, label=f"train reward (mean of {w})", color="tab:blue", alpha=0.7)
  if ev:
    s, v = np.array(ev).T
    ax.plot(s, v, "o-", label="test pass@1", color="tab:red")
  ax.set_xlabel("RL step")
  ax.set_ylabel("reward / pass@1")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out_png, dpi=120)
  plt.close(fig)
