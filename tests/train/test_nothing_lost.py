"""Nothing a user types destroys a run or hangs: overwrite guards, locations checked before work,
a full disk under each tracker, the run-directory lock, the run's identity kept with the run, and
runs that cannot learn said so.

Each test names the defect it holds (D1-D8 of the reliability review, README "Reliability").
A refused command must leave every existing file byte-identical: the trees are hashed before and
after.
"""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from rlpost import paths
from rlpost.cli import is_user_error, one_line
from rlpost.train import checkpoint, guards, loop, rl
from rl_testutil import learning_config, tree_digest as digest
from scripts import average as average_script
from scripts import export as export_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("nothing_lost")
  return dict(data_dir=str(root / "data"), cache_dir=str(root / "cache"))


@pytest.fixture(scope="module")
def finished(dirs, tmp_path_factory):
  """A finished 4-step run (checkpoints 2 and 4) and its trainer."""
  run_dir = str(tmp_path_factory.mktemp("finished") / "x")
  trainer = rl.make_train(learning_config(dirs), log=lambda s: None)
  loop.run(trainer, run_dir, progress=False)
  return run_dir, trainer


def copy_run(run_dir: str, dest) -> str:
  dest = str(dest)
  shutil.copytree(run_dir, dest)
  return dest


def refused(fn, *args, match: str, **kw) -> None:
  """``fn(*args, **kw)`` raises a user error (one ``error:`` line, exit 2 from a script)
  matching ``match``."""
  with pytest.raises(Exception) as info:
    fn(*args, **kw)
  assert is_user_error(info.value), f"{type(info.value).__name__}: {info.value}"
  assert "\n" not in one_line(info.value)
  import re

  assert re.search(match, str(info.value)), str(info.value)


# ----------------------------------------------------------------- D1, D6: no command deletes
def test_overwrite_never_deletes_the_run_it_reads(finished, tmp_path):
  """D1: ``--overwrite`` pointed at the run, its checkpoints or a directory inside them is
  refused by average.py and export.py with one line; D6: an average is never written into a
  checkpoint directory. Every file of the run is byte-identical after."""
  run = copy_run(finished[0], tmp_path / "x")
  ck = os.path.join(run, "checkpoints")
  before = digest(run)
  assert len([k for k in before if k.startswith("checkpoints/")]) > 4  # something to lose
  avg = ["--ckpt-dir", ck, "--method", "lawa", "--k", "2", "--no-progress"]
  cases = [
      (average_script.main, avg + ["--out", run, "--overwrite"], "contains"),
      (average_script.main, avg + ["--out", ck, "--overwrite"], "is the directory this command"),
      (average_script.main, avg + ["--out", ck], "is the directory this command reads"),
      (average_script.main, avg + ["--out", os.path.join(ck, "99")], "inside the checkpoint"),
      (average_script.main, avg + ["--out", os.path.join(run, "tb"), "--overwrite"],
       "lies inside"),
      (export_script.main, [run, "--out", ck, "--overwrite"], "lies inside|checkpoint"),
      (export_script.main, [run, "--out", os.path.join(ck, "2"), "--overwrite"], "checkpoint"),
      (export_script.main, [run, "--out", os.path.join(ck, "exp")], "inside the checkpoint"),
      (export_script.main, [run, "--out", run, "--overwrite"], "is the directory this command"),
  ]
  for fn, argv, match in cases:
    refused(fn, argv, match=match)
    assert digest(run) == before, argv
  # Another run is never replaced either, even one the command does not read.
  other = copy_run(finished[0], tmp_path / "other")
  other_before = digest(other)
  refused(average_script.main, avg + ["--out", other, "--overwrite"], match="is a run directory")
  refused(export_script.main, [run, "--out", other, "--overwrite"], match="is a run directory")
  assert digest(other) == other_before and digest(run) == before
  # A directory holding runs, a run whose config.json is gone, and a link into a run.
  parent = tmp_path / "runs"
  copy_run(finished[0], parent / "a")
  headless = copy_run(finished[0], tmp_path / "headless")
  os.remove(os.path.join(headless, "config.json"))
  os.symlink(os.path.join(other, "tb"), tmp_path / "link")
  guarded = {p: digest(p) for p in (str(parent), headless, other)}
  refused(export_script.main, [run, "--out", str(parent), "--overwrite"], match="holds the run")
  refused(average_script.main, avg + ["--out", str(parent), "--overwrite"], match="holds the run")
  refused(export_script.main, [run, "--out", headless, "--overwrite"], match="is a run directory")
  refused(average_script.main, avg + ["--out", str(tmp_path / "link"), "--overwrite"],
          match="lies inside the run directory")
  assert {p: digest(p) for p in guarded} == guarded and digest(run) == before
  # What export reads includes the run's policy directory.
  refused(paths.check_output, str(tmp_path / "policy"), "--out",
          match="is the directory this command reads", reads=[run, str(tmp_path / "policy")])
  # A new directory inside the run is not a risk: allowed, and the run's files are unchanged.
  average_script.main(avg + ["--out", os.path.join(run, "lawa")])
  after = {k: v for k, v in digest(run).items() if not k.startswith("lawa")}
  assert after == before


def test_an_average_in_a_checkpoint_directory_is_refused_by_the_writer_itself(finished, tmp_path):
  """D6 at the library level: ``write_params`` refuses a path inside a checkpoint directory,
  whoever calls it, so the next resume never meets a foreign "step 99"."""
  from rlpost.averaging import write_params

  run = copy_run(finished[0], tmp_path / "x")
  before = digest(run)
  params = {"w": np.ones(3, np.float32)}
  refused(write_params, os.path.join(run, "checkpoints", "99"), params, {},
          match="inside the checkpoint directory")
  assert digest(run) == before


# ------------------------------------------------------- D2, D8: locations checked before work
@contextlib.contextmanager
def tmpfs(path, size: str, read_only: bool = False):
  """A fresh tmpfs at ``path`` (root only; the test skips elsewhere)."""
  os.makedirs(path, exist_ok=True)
  opts = f"size={size}" + (",ro" if read_only else "")
  res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                       capture_output=True, text=True)
  if res.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_unwritable_locations_fail_before_any_work(dirs, finished, tmp_path):
  """D2 (the hangs on a read-only cache_dir or --out) and D8 (late tracebacks): a read-only
  run_dir, data_dir or cache_dir, a run_dir under a file, and a read-only or full --out are
  one line naming the key or flag and the path, before data, warm start or averaging."""
  base = learning_config(dirs)
  cfg0 = finished[1].cfg
  with tmpfs(tmp_path / "ro", "1m", read_only=True) as mount:
    for key in ("run_dir", "data_dir", "cache_dir"):
      cfg = dataclasses.replace(cfg0, **{key: os.path.join(mount, key)})
      run_dir = cfg.run_dir if key == "run_dir" else str(tmp_path / "r")
      refused(loop.check_run_dir, run_dir, cfg,
              match=rf"config key '{key}': .*{key} is not writable: its filesystem is read-only")
    refused(loop.check_run_dir, os.path.join(finished[0], "config.json", "r"),
            cfg0, match=r"config key 'run_dir': .* \(.*config.json is a file\)")
    run = copy_run(finished[0], tmp_path / "x")
    before = digest(run)
    refused(average_script.main, ["--ckpt-dir", os.path.join(run, "checkpoints"), "--method",
                                  "lawa", "--k", "2", "--out", os.path.join(mount, "avg")],
            match=r"--out: .*avg is not writable: its filesystem is read-only")
    refused(export_script.main, [run, "--out", os.path.join(mount, "exp")],
            match=r"--out: .*exp is not writable: its filesystem is read-only")
    assert digest(run) == before
  # The whole command: one line, exit 2, before the data set is built (nothing in data_dir).
  with tmpfs(tmp_path / "ro2", "1m", read_only=True) as mount:
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(dict(base, data_dir=str(tmp_path / "fresh_data"))))
    res = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"),
                          str(cfg_path), f"cache_dir={mount}/c", f"run_dir={tmp_path}/r2"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"error: config key 'cache_dir': {mount}/c is not writable: its filesystem is read-only "
        f"(nothing can be created in {mount})"]
    assert not os.path.exists(tmp_path / "fresh_data") and not os.path.exists(tmp_path / "r2")
    assert res.stdout == ""  # no data, model or warm-start work reported
  # Free space: below the stated minimum is refused, naming the variable that sets it.
  with tmpfs(tmp_path / "small", "2m") as small:
    os.environ[paths.MIN_FREE_ENV] = "4"
    try:
      refused(paths.check_writable, os.path.join(small, "r"), "config key 'run_dir'",
              match=r"config key 'run_dir': .* MiB free .* below the 4 MiB .*RLPOST_MIN_FREE_MB")
    finally:
      del os.environ[paths.MIN_FREE_ENV]


def _train_cmd(cfg_path, run_dir, *extra):
  return [sys.executable, os.path.join(ROOT, "scripts", "train.py"), str(cfg_path),
          f"run_dir={run_dir}", "--no-progress", *extra]


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["tensorboard", "wandb", "none"])
def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes_bitwise(dirs, tmp_path, logger):
  """D2, D8: a 20 MB filesystem filled during the run, under each tracker. The run exits 2 with
  one line naming the step and the last complete checkpoint (no hang, no traceback); once space
  is freed, the same command resumes from that checkpoint and ends bitwise equal to an
  uninterrupted run of the same config: the same jitted program on one CPU device (the
  subprocess and this process), after asserting that the parameters moved."""
  if logger == "wandb":
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
  kw = dict(steps=12, checkpoint_every=1, keep_checkpoints=100, eval_every=4, logger=logger)
  cfg = learning_config(dirs, **kw)
  # The reference, and a warm SFT cache, so the subprocess starts at once.
  ref = loop.run(rl.make_train(dict(cfg, logger="none"), log=lambda s: None),
                 str(tmp_path / "ref"), progress=False)
  cfg_path = tmp_path / "cfg.json"
  cfg_path.write_text(json.dumps(cfg))
  env = dict(os.environ, JAX_PLATFORMS="cpu", RLPOST_MIN_FREE_MB="0.5", WANDB_MODE="offline",
             WANDB_SILENT="true")
  with tmpfs(tmp_path / "disk", "20m") as disk:
    run_dir = os.path.join(disk, "run")
    filler = os.path.join(disk, "filler")
    with open(filler, "wb") as f:  # leave ~1.5 MiB: a few checkpoints, then no space
      f.write(b"\0" * (shutil.disk_usage(disk).free - 1536 * 1024))
    # A hang fails as TimeoutExpired; the run itself stops at the first failed write.
    res = subprocess.run(_train_cmd(cfg_path, run_dir), capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-3000:]
    assert len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("error: No space left on device at step "), lines[0]
    done = sorted(int(n) for n in os.listdir(os.path.join(run_dir, "checkpoints")) if n.isdigit())
    assert done and done[-1] < kw["steps"], done  # stopped part-way, checkpoints kept
    assert f"last complete checkpoint is step {done[-1]}" in lines[0]
    os.remove(filler)
    res = subprocess.run(_train_cmd(cfg_path, run_dir), capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    like = ref["state"]
    ck = checkpoint.Checkpointer(os.path.join(run_dir, "checkpoints"), keep_last=100)
    try:
      state, _ = ck.restore(kw["steps"], like)
    finally:
      ck.close()
  moved = any(np.any(np.asarray(a) != np.asarray(b)) for a, b in
              zip(jax.tree.leaves(state.params), jax.tree.leaves(
                  rl.make_train(dict(cfg, logger="none"), log=lambda s: None).init_state().params)))
  assert moved  # the run trained: the comparison below is not trivially true
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref["state"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_failing_tracker_is_disabled_and_never_waits_forever(tmp_path):
  """D2: a tracker that raises, or never returns, is reported once and disabled within its
  bounded wait; the caller goes on."""
  from rlpost.train import tracking

  warnings = []

  class Raises:
    def log(self, step, prefix, values):
      raise OSError(28, "No space left on device")

    def close(self):
      raise AssertionError("a disabled tracker is not closed")

  class Hangs:
    def log(self, step, prefix, values):
      time.sleep(3600)

    def close(self):
      time.sleep(3600)

  g = tracking.Guarded("raises", Raises, warn=warnings.append, timeout=5)
  g.log(1, "train", {"loss": 1.0})
  g.log(2, "train", {"loss": 1.0})
  g.close()
  assert len(warnings) == 1 and "tracker raises: logging step 1 failed (OSError" in warnings[0]
  h = tracking.Guarded("hangs", Hangs, warn=warnings.append, timeout=0.5)
  h.log(1, "train", {"loss": 1.0})
  h.log(2, "train", {"loss": 1.0})
  h.close()
  # Every call returned while the tracker's own call is still blocked on its thread: the wait
  # is bounded by the timeout, not by the tracker.
  assert h.disabled and h._thread.is_alive() and h._thread.daemon
  assert len(warnings) == 2 and "did not return within 0.5s" in warnings[1]
  # The TensorBoard tracker writes synchronously: a write error reaches the guard at once.
  tb = tracking.make_logger("tensorboard", str(tmp_path / "r"), {}, warn=warnings.append)
  tb.log(1, "train", {"loss": 0.5})
  tb.close()
  assert len(warnings) == 2 and os.listdir(tmp_path / "r" / "tb")


# ------------------------------------------------------------------ D3: one writer per run
def test_a_second_writer_exits_2_naming_the_holder_and_each_step_is_logged_once(dirs, tmp_path):
  """D3: two train.py on one run directory: the second exits 2 naming the first's pid before
  any work; the first finishes with each step once in metrics.jsonl. A holder killed with
  SIGKILL leaves no lock behind."""
  cfg = learning_config(dirs, steps=6)
  rl.make_train(cfg, log=lambda s: None)  # warm the data and SFT caches
  cfg_path = tmp_path / "cfg.json"
  cfg_path.write_text(json.dumps(cfg))
  run_dir = str(tmp_path / "c")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  first = subprocess.Popen(_train_cmd(cfg_path, run_dir), cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(run_dir, "config.json")):
      assert first.poll() is None and time.time() < deadline, "the first run did not start"
      time.sleep(0.2)
    second = subprocess.run(_train_cmd(cfg_path, run_dir), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert first.poll() is None, "the first run ended before the second was refused"
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines() == [
        f"error: run directory {run_dir} is in use by process {first.pid} (one writer per run "
        "directory); wait for it to end or choose another run_dir"]
    assert first.wait(timeout=300) == 0, first.stderr.read()
  finally:
    if first.poll() is None:
      first.kill()
  entries = loop.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
  steps = [r["step"] for r in entries if "train/loss" in r]
  assert steps == list(range(1, 7))
  # A stale lock: its holder was killed; the lock went with it.
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, "
                             f"{ROOT!r}); from rlpost import paths; "
                             f"paths.RunLock.acquire({run_dir!r}); print('held', flush=True); "
                             "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == "held"
  with pytest.raises(paths.RunDirLocked, match=f"in use by process {holder.pid}"):
    paths.RunLock.acquire(run_dir)
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  with paths.hold_run_dir(run_dir):
    pass


# -------------------------------------------------- D4, D5: the run's identity kept with the run
def test_the_best_checkpoint_survives_a_restart(tmp_path):
  """D4: the metric behind "best" is stored with each checkpoint, so a restarted run keeps the
  best one (step 4 here) beside the latest, as an uninterrupted run does."""
  state = {"w": np.ones(3, np.float32)}
  saves = [(2, 0.1), (4, 0.9), (6, None), (8, 0.2), (10, 0.3), (12, None)]

  def run(split: int | None) -> list[int]:
    d = str(tmp_path / f"ck{split}")
    ck = checkpoint.Checkpointer(d, keep_last=2, best_metric="eval/pass@1", async_save=False)
    for i, (step, m) in enumerate(saves):
      if i == split:
        ck.close()
        ck = checkpoint.Checkpointer(d, keep_last=2, best_metric="eval/pass@1",
                                     async_save=False)
      ck.save(step, state, {}, None if m is None else {"eval/pass@1": m})
    ck.close()
    return sorted(int(n) for n in os.listdir(d) if n.isdigit())

  straight = run(None)
  assert straight == [4, 10, 12]  # the best (0.9 at step 4) and the last two
  for split in (3, 4, 5):
    assert run(split) == straight, split


def test_extending_a_run_keeps_its_best_checkpoint(dirs, tmp_path):
  """D4 through the run loop: extending a run keeps the same checkpoints as running it
  straight (latest plus best by eval/pass@1, which the checkpoints store)."""
  # At this learning rate pass@1 falls after step 2, so the best checkpoint is not the latest.
  kw = dict(steps=8, eval_every=2, checkpoint_every=2, keep_checkpoints=1, logger="none",
            eval_problems=40, lr=3e-3)
  trainer = rl.make_train(learning_config(dirs, **kw), log=lambda s: None)
  straight = loop.run(trainer, str(tmp_path / "a"), progress=False)
  loop.run(rl.make_train(learning_config(dirs, **dict(kw, steps=4)), log=lambda s: None),
           str(tmp_path / "b"), progress=False)
  loop.run(trainer, str(tmp_path / "b"), progress=False)
  kept = {k: sorted(int(n) for n in os.listdir(tmp_path / k / "checkpoints") if n.isdigit())
          for k in "ab"}
  evals = {e["step"]: e["pass@1"] for e in straight["evals"] if e["step"] > 0}
  best = max(evals, key=lambda s: (evals[s], s))  # orbax keeps the latest of tied bests
  assert best < 8, evals  # precondition: keeping the best is not keeping the latest
  assert kept["a"] == sorted({best, 8})
  assert kept["b"] == kept["a"]


def test_a_changed_config_is_refused_even_without_config_json(finished, tmp_path):
  """D5: the config stored in the latest checkpoint is compared too, so deleting config.json
  does not let a resume change lr silently; --allow-config-change resumes and records it."""
  run_dir, trainer = finished
  run = copy_run(run_dir, tmp_path / "x")
  os.remove(os.path.join(run, "config.json"))
  before = digest(run)
  cfg = dataclasses.replace(trainer.cfg, lr=5e-4, steps=6)
  refused(loop.check_run_dir, run, cfg,
          match=r"different config \(keys \['lr'\]\); use another run_dir, or pass "
          r"--allow-config-change .*: lr: 0.0001 -> 0.0005")
  assert digest(run) == before
  # Run-local keys (steps) are no change.
  assert loop.config_changes(run, trainer.cfg) == {}
  # Allowed, the change is recorded at the resumed step and the run goes on at the new rate.
  changed = rl.make_train(cfg, log=lambda s: None)
  out = loop.run(changed, run, progress=False, allow_config_change=True)
  assert out["resumed_from"] == 4 and int(out["state"].step) == 6
  entries = loop.read_metrics(os.path.join(run, "metrics.jsonl"))
  marks = [r for r in entries if "config_change" in r]
  assert marks == [{"step": 4, "config_change": {"lr": {"from": 1e-4, "to": 5e-4}}}]
  assert [r["step"] for r in entries if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
  # The checkpoints now carry the new config: resuming with it needs no flag.
  assert loop.config_changes(run, cfg) == {}


def test_a_run_stored_by_an_older_version_resumes(finished, tmp_path):
  """A config.json written before ``allocation`` existed (its rule in ``dars_schedule`` and
  ``dynamic_sampling_factor``) is read in today's keys: the same run is no change, another
  rule is."""
  run_dir, trainer = finished
  run = copy_run(run_dir, tmp_path / "x")
  path = os.path.join(run, "config.json")
  with open(path) as f:
    saved = json.load(f)
  saved.pop("allocation"), saved.pop("allocation_args")
  saved.update(dynamic_sampling_factor=1, dars_schedule="", dars_n_max=32, dars_budget=0)
  with open(path, "w") as f:
    json.dump(saved, f)
  assert loop.config_changes(run, trainer.cfg) == {}
  # Another rule is a change (its arguments, filled in with the rule's defaults, too).
  other = dataclasses.replace(trainer.cfg, allocation="dynamic_sampling")
  assert set(loop.config_changes(run, other)) == {"allocation", "allocation_args"}


def test_a_checkpoint_of_another_shape_is_never_moved_aside(tmp_path):
  """A config change that alters the state's shape (another model) with resume_fallback set
  must not take the run's sound checkpoints for damage and move them all aside: it is refused
  as a mismatch, and nothing moves."""
  d = str(tmp_path / "ck")
  ck = checkpoint.Checkpointer(d, keep_last=3, async_save=False)
  for step in (2, 4):
    ck.save(step, {"w": np.ones(3, np.float32)}, {})
  ck.close()
  before = digest(str(tmp_path))
  ck = checkpoint.Checkpointer(d, keep_last=3, async_save=False)
  try:
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"step 4 .*float32\[3\] but this run "
                       r"expects float32\[5\]"):
      ck.restore_latest({"w": np.ones(5, np.float32)}, fallback=True, log=lambda s: None)
  finally:
    ck.close()
  assert digest(str(tmp_path)) == before


def test_a_failed_write_stops_with_one_line_and_resumes_bitwise(finished, tmp_path, monkeypatch):
  """D8 without a small filesystem (any user, any machine): a write of metrics.jsonl that fails
  with ENOSPC at step 3 stops the run with one line naming the cause, the step and the last
  complete checkpoint, closes the checkpoint manager, and the same run resumes to a state equal
  to the uninterrupted one."""
  import errno

  run_dir, trainer = finished
  append = loop._append

  def full_at_step_3(path, record):
    if record.get("step") == 3 and "train/loss" in record:
      raise OSError(errno.ENOSPC, "No space left on device", path)
    append(path, record)

  monkeypatch.setattr(loop, "_append", full_at_step_3)
  with pytest.raises(paths.StorageError) as info:
    loop.run(trainer, str(tmp_path / "r"), progress=False)
  msg = one_line(info.value)
  assert is_user_error(info.value) and msg == (
      "No space left on device at step 3: run stopped, the last complete checkpoint is step 2 "
      f"(cannot write {tmp_path / 'r' / 'metrics.jsonl'})")
  monkeypatch.setattr(loop, "_append", append)
  out = loop.run(trainer, str(tmp_path / "r"), progress=False)
  assert out["resumed_from"] == 2
  ck = checkpoint.Checkpointer(os.path.join(run_dir, "checkpoints"), keep_last=5)
  try:
    ref, _ = ck.restore(4, out["state"])
  finally:
    ck.close()
  start = trainer.init_state()
  assert any(np.any(np.asarray(a) != np.asarray(b)) for a, b in
             zip(jax.tree.leaves(ref.params), jax.tree.leaves(start.params)))
  for a, b in zip(jax.tree.leaves(out["state"]), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  entries = loop.read_metrics(str(tmp_path / "r" / "metrics.jsonl"))
  assert [r["step"] for r in entries if "train/loss" in r] == [1, 2, 3, 4]


# --------------------------------------------------------- D7: runs that cannot learn say so
def test_a_collapse_warns_at_once_whatever_the_patience(dirs, tmp_path):
  """D7: lr=1e6 wrecks the policy; the run warns (and records) that no rollout is correct or
  that pass@1 fell to 0 within a few steps, although guard_patience (50) exceeds the steps;
  the patience is adjusted with a note."""
  notes = []
  trainer = rl.make_train(learning_config(dirs, lr=1e6, steps=6, eval_every=3), log=notes.append)
  out = loop.run(trainer, str(tmp_path / "r"), progress=False)
  assert out["evals"][0]["pass@1"] > 0  # precondition: it could solve problems before
  assert any("guard_patience=50 exceeds steps=6" in n for n in notes)
  entries = loop.read_metrics(str(tmp_path / "r" / "metrics.jsonl"))
  alarms = [r for r in entries if "guard/metric" in r]
  collapse = [r for r in alarms if r["guard/metric"] in ("accuracy", "eval/pass@1")]
  assert collapse and all("collapsed" in r["guard/message"] for r in collapse)
  assert all(r["step"] <= 6 for r in collapse)
  assert any(n.startswith("WARNING: step") and "collapsed" in n for n in notes)


def test_a_hard_task_near_zero_is_not_called_a_collapse():
  """A healthy run at a few percent accuracy has many steps without a correct rollout; only a
  fall from COLLAPSE_LEVEL counts as a collapse."""
  g = guards.Guards(patience=50)
  assert g.check_eval(0, {"pass@1": 0.03}) == []
  acc = [0.0, 0.03, 0.0, 0.0, 0.0, 0.0, 0.06, 0.0, 0.0, 0.0]
  assert all(g.check(s, {"accuracy": a}) == [] for s, a in enumerate(acc, 1))
  assert g.check_eval(10, {"pass@1": 0.0}) == []


def test_collapse_rules_fire_once_and_only_after_success():
  g = guards.Guards(patience=50)
  # No correct rollout from the start is not a collapse (the zero-variance guard covers it).
  assert all(g.check(s, {"accuracy": 0.0}) == [] for s in range(1, 6))
  assert g.check_eval(0, {"pass@1": 0.25}) == []
  fired = [g.check(s, {"accuracy": 0.0}) for s in range(6, 12)]
  assert [len(a) for a in fired] == [0, 0, 1, 0, 0, 0]
  assert fired[2][0].metric == "accuracy" and fired[2][0].step == 8
  assert [a.metric for a in g.check_eval(10, {"pass@1": 0.0})] == ["eval/pass@1"]
  assert g.check_eval(12, {"pass@1": 0.0}) == []  # once per episode
  assert g.check_eval(14, {"pass@1": 0.1}) == []
  assert [a.step for a in g.check_eval(16, {"pass@1": 0.0})] == [16]  # re-armed


# ------------------------------------------------------------ mwa reads the run's own metrics
def test_mwa_reads_the_runs_own_metrics(finished, tmp_path):
  """D4's second half: ``--method mwa`` without ``--metrics-file`` weights by the run's
  metrics.jsonl (train/loss per step), where it used to fail for want of stored metrics."""
  run = copy_run(finished[0], tmp_path / "x")
  out = average_script.main(["--ckpt-dir", os.path.join(run, "checkpoints"), "--method", "mwa",
                             "--no-progress"])
  entries = loop.read_metrics(os.path.join(run, "metrics.jsonl"))
  loss = {r["step"]: r["train/loss"] for r in entries if "train/loss" in r}
  plan = out["plan"]
  assert list(plan.items) == [2, 4]
  explicit = average_script.main(["--ckpt-dir", os.path.join(run, "checkpoints"), "--method",
                                  "mwa", "--metrics-file", os.path.join(run, "metrics.jsonl"),
                                  "--no-progress"])["plan"]
  np.testing.assert_allclose(plan.weights, explicit.weights)
  assert loss[2] != loss[4]  # the weights follow a metric that moved
