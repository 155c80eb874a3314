"""What a new user touches first: the list of config keys and the one-minute smoke run."""

import dataclasses
import json
import os

import pytest

from rlpost.train import config as config_lib
from rlpost.train import loop, rl_config
from scripts import train as train_script


def test_every_config_key_has_one_line_of_help_and_train_help_lists_them(capsys):
  fields = [f.name for f in dataclasses.fields(rl_config.RLConfig)]
  assert all(line and "\n" not in line for line in rl_config.HELP.values())
  # Each key declares its group and flags where it is defined (``config.key``).
  groups = {f.name: f.metadata["group"] for f in dataclasses.fields(rl_config.RLConfig)}
  assert all(groups.values()) and groups["allocation"] == "rollouts"
  assert config_lib.keys_where(rl_config.RLConfig, run_local=True) == {
      "seed", "policy", "task_spec", "data_dir", "cache_dir", "run_dir", "model", "mesh_fsdp",
      "param_sharding", "grad_accum", "remat", "logits_chunk", "rollout_chunk", "pack_buckets",
      "pack_bin_rows", "logger", "resume_fallback", "keep_checkpoints", "checkpoint_every",
      "guard_action", "guard_patience", "guard_truncated", "guard_logp_mismatch"}
  assert loop.OPERATIONAL_KEYS == {"steps", "run_dir", "resume_fallback", "keep_checkpoints",
                                   "guard_action", "guard_patience", "guard_truncated",
                                   "guard_logp_mismatch", "logger"}
  with pytest.raises(ValueError, match="one line of help"):
    config_lib.key(0, "x", help="")
  with pytest.raises(SystemExit) as e:
    train_script.main(["--help"])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for name in fields:
    assert f"\n  {name} (" in out, name
  assert "  lr (float, default 0.0001)\n      RL learning rate" in out
  assert "  sft_steps (int | None, default None)\n" in out
  assert "\nrollouts:\n  recipe (str, default 'grpo')\n" in out  # keys under their group


@pytest.mark.slow
def test_smoke_run_touches_every_stage(tmp_path, capsys):
  run_dir = tmp_path / "run"
  out = train_script.main(["experiments/smoke.py", f"run_dir={run_dir}",
                           f"data_dir={tmp_path / 'data'}", f"cache_dir={tmp_path / 'cache'}",
                           "--no-progress"])
  printed = capsys.readouterr().out
  assert "saved SFT policy" in printed and "test pass@1:" in printed  # warm start, summary
  assert [e["step"] for e in out["evals"]] == [0, 10, 20]
  assert out["evals"][0]["pass@1"] > 0.05  # the warm start learned the task's format
  entries = loop.read_metrics(str(run_dir / "metrics.jsonl"))
  assert len([r for r in entries if "train/loss" in r]) == 20  # rollouts and updates
  assert sorted(os.listdir(run_dir / "checkpoints"), key=int)[-1] == "20"
  assert os.path.getsize(run_dir / "learning_curve.png") > 0
  assert json.loads((run_dir / "config.json").read_text())["steps"] == 20
