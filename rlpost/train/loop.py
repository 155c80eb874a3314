"""The outer training loop: resume, step, evaluate, log, checkpoint, plot.

A run directory holds ``config.json``, ``metrics.jsonl`` (one JSON object per step or
evaluation), ``tb/`` (TensorBoard event files: ``tensorboard --logdir runs``; the ``logger``
key chooses the trackers, see ``rlpost.train.tracking``), ``checkpoints/`` (orbax) and
``learning_curve.png`` (redrawn at every evaluation, so a killed run has one).

Crash safety: resuming restores the latest complete checkpoint, verified against its manifest
(structure, shapes, dtypes, checksums, finite values), and continues bit for bit (the state
carries the PRNG key, step and data cursor). Metric rows written after that checkpoint by the
interrupted process are dropped from ``metrics.jsonl`` (and purged from TensorBoard), so the log
of a run killed and resumed any number of times equals that of an uninterrupted run. A corrupt
latest checkpoint is an error naming its step unless ``resume_fallback`` is set. Resuming a
finished run does nothing and says so.

Failures: a non-finite loss or rollout stops the run, keeping the last good checkpoint, and the
error says which step that is. The silent-failure guards (``rlpost.train.guards``) warn, or with
``guard_action="stop"`` save and stop, naming the metric and the step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import numpy as np

from rlpost import averaging, progress as progress_lib
from rlpost.train import checkpoint, guards, tracking
from rlpost.train.rl import RLState, Trainer, raise_if_bad


def _to_float(tree: dict) -> dict:
  return {k: float(v) for k, v in jax.device_get(tree).items()}


# Keys that may change between a run and its resumption: they do not change the trajectory.
OPERATIONAL_KEYS = frozenset({"steps", "run_dir", "resume_fallback", "keep_checkpoints",
                              "guard_action", "guard_patience", "guard_truncated",
                              "guard_logp_mismatch", "logger"})


def _primary() -> bool:
  """Only process 0 writes logs and plots (checkpoints coordinate through orbax)."""
  return jax.process_index() == 0


def _append(path: str, record: dict) -> None:
  if not _primary():
    return
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


def _truncate_metrics(path: str, last_step: int) -> None:
  """Keep the rows of steps <= ``last_step`` (a killed process may have left later rows and a
  partial last line); written to a temporary file and renamed, so a crash here loses nothing."""
  if not _primary() or not os.path.exists(path):
    return
  keep = []
  with open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut by the crash
      if isinstance(row, dict) and row.get("step", last_step + 1) <= last_step:
        keep.append(line if line.endswith("\n") else line + "\n")
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(keep)
  os.replace(tmp, path)


def check_run_dir(run_dir: str, cfg) -> None:
  """Fail early, before any data or model work, when ``run_dir`` cannot hold this run: it is a
  file, or it holds a run with a different config (keys outside ``OPERATIONAL_KEYS``)."""
  if os.path.exists(run_dir) and not os.path.isdir(run_dir):
    raise NotADirectoryError(f"config key 'run_dir': {run_dir} is a file, not a directory")
  cfg_path = os.path.join(run_dir, "config.json")
  if not os.path.exists(cfg_path):
    return
  try:
    with open(cfg_path) as f:
      saved = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{cfg_path} is unreadable ({e}); use another run_dir") from None
  if not isinstance(saved, dict):
    raise ValueError(f"{cfg_path} is not a JSON object; use another run_dir")
  # Compared as JSON (tuples read back as lists); a key the saved config predates counts as
  # its default value.
  cfg_dict = _config_json(cfg)
  defaults = json.loads(json.dumps(dataclasses.asdict(type(cfg)())))
  changed = sorted(k for k in set(saved) | set(cfg_dict)
                   if saved.get(k, defaults.get(k)) != cfg_dict.get(k)
                   and k not in OPERATIONAL_KEYS)
  if changed:
    raise ValueError(f"{run_dir} holds a run with a different config (keys {changed}); "
                     f"use another run_dir")


def _config_json(cfg) -> dict:
  return json.loads(json.dumps(dataclasses.asdict(cfg)))


def run(trainer: Trainer, run_dir: str, *, progress: bool = True) -> dict:
  """Train ``trainer.cfg.steps`` steps in ``run_dir`` (resuming if it holds checkpoints).

  Returns {"state", "evals" (list of eval dicts with "step"), "resumed_from", "averages"
  ({name: averaged parameters} with ``averaging`` set, else {})}. A resume that fails (a
  corrupt checkpoint, another config) changes nothing in ``run_dir``.
  """
  cfg = trainer.cfg
  log = trainer.log
  check_run_dir(run_dir, cfg)
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
  # Written only once the resume succeeded: a failed resume leaves the directory as it was.
  if _primary():
    tmp = cfg_path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(cfg_dict, f, indent=2, sort_keys=True)
    os.replace(tmp, cfg_path)
  if resumed_from is not None:
    if tracker:
      restored, tracker.state = restored
    state = RLState(*restored)
    evals = meta.get("evals", [])
    _truncate_metrics(metrics_path, resumed_from)
    log(f"resumed {run_dir} from step {resumed_from}")
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

  def do_eval(step: int):
    t0 = time.perf_counter()
    extra = f" (and {len(tracker.names)} weight averages)" if tracker and step > 0 else ""
    progress_lib.message(bar, log, f"evaluating {n_eval} test problems x {cfg.eval_samples} "
                         f"samples at step {step}{extra}...")
    res = evaluate(state.params)
    if tracker is not None and step > 0:
      res.update(tracker.evaluate(evaluate, avg_params(state.params),
                                  keys=("pass@1", "pass@4")))
    res["step"] = step
    res["eval_seconds"] = time.perf_counter() - t0
    evals.append(res)
    _append(metrics_path, {"step": step, **{f"eval/{k}": v for k, v in res.items() if k != "step"}})
    if _primary():  # redrawn at every evaluation, so a run stopped at any point has its curve
      plot_learning_curve(metrics_path, curve_png)
    return res

  def save(step: int, last_eval: dict | None):
    metrics = {"eval/pass@1": last_eval["pass@1"]} if last_eval and last_eval["step"] == step else None
    # The parameters are the first leaves of the saved tree; saying how many lets averaging
    # tools restore parameters alone.
    meta = {"config": cfg_dict, "evals": evals,
            "param_leaves": len(jax.tree.leaves(state.params))}
    ckpt.save(step, (state, tracker.state) if tracker else state, meta, metrics)

  # On resume, TensorBoard events a killed process logged after the checkpoint are purged.
  tracker_kind = cfg.logger
  trackers = (tracking.make_logger(tracker_kind, run_dir, cfg_dict, resume_step=resumed_from)
              if _primary() else tracking.NullLogger())
  guard = (guards.Guards(patience=cfg.guard_patience, truncated=cfg.guard_truncated,
                         logp_mismatch=cfg.guard_logp_mismatch)
           if cfg.guard_action != "off" else None)

  start = int(state.step)
  last_good = resumed_from
  history = []
  try:
    if start == 0:
      trackers.log(0, "eval", do_eval(0))
    bar = progress_lib.bar(total=cfg.steps, initial=start, disable=not progress, desc="rl")
    for step in range(start + 1, cfg.steps + 1):
      if step == start + 1:
        progress_lib.message(bar, log, "compiling the RL step (first call of this process; "
                             "later steps reuse it)...")
      t0 = time.perf_counter()
      new_state, metrics = trainer.step(state)
      metrics = _to_float(metrics)
      try:
        raise_if_bad(metrics, step)
      except FloatingPointError as e:
        ckpt.wait()
        where = (f"last good checkpoint: step {last_good} in {ckpt.directory}" if last_good
                 else "no checkpoint was saved yet")
        raise FloatingPointError(f"{e}; run stopped, {where}") from None
      state = new_state
      if tracker is not None:
        tracker.update(avg_params(state.params))
      metrics["step_seconds"] = time.perf_counter() - t0
      history.append(metrics)
      _append(metrics_path, {"step": step, **{f"train/{k}": v for k, v in metrics.items()}})
      trackers.log(step, "train", metrics)
      if step % cfg.eval_every == 0 or step == cfg.steps:
        trackers.log(step, "eval", do_eval(step))
      alarms = guard.check(step, metrics) if guard else []
      for alarm in alarms:  # once, on its own line above the progress bar
        progress_lib.message(bar, log, f"WARNING: {alarm}")
        _append(metrics_path, {"step": step, "guard/metric": alarm.metric,
                               "guard/message": str(alarm)})
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
      if evals:
        post["pass@1"] = f"{evals[-1]['pass@1']:.3f}"
      bar.set_postfix(post)
  finally:
    if bar is not None:
      bar.close()
    trackers.close()
    ckpt.close()
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

  rows = read_metrics(metrics_path)
  train = [(r["step"], r["train/reward"]) for r in rows if "train/reward" in r]
  ev = [(r["step"], r["eval/pass@1"]) for r in rows if "eval/pass@1" in r]
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
