"""scripts/launch.py: one scripts/train.py command per full-size arm x seed, only the runs not
finished, as printed commands or a SLURM array job; bad input is one line and exit 2."""

import json
import os

import pytest

from experiments.mc_grpo import full as mc_full
from scripts import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def exit_of(argv, capsys):
  with pytest.raises(SystemExit) as e:
    launch.run_main(launch.main, argv)
  return e.value.code, capsys.readouterr()


def fake_run(run_dir, arm, seed, last_step):
  """A run directory as scripts/train.py leaves it, evaluated up to ``last_step``."""
  os.makedirs(run_dir)
  cfg = dict(mc_full.FULL[arm], seed=seed, run_dir=run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump(cfg, f)
  with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
    for step in (0, last_step):
      f.write(json.dumps({"step": step, "eval/pass@1": 0.3}) + "\n")


def test_dry_run_prints_every_arm_and_seed_and_skips_finished_runs(tmp_path, capsys):
  runs = str(tmp_path / "runs")
  code, out = exit_of(["mc_grpo", "--seeds", "2", "--runs", runs, "--dry-run",
                       "mesh_fsdp=8", "policy=/models/q"], capsys)
  lines = out.out.strip().splitlines()
  cmds = [ln for ln in lines if not ln.startswith("#")]
  assert code == 0 and len(cmds) == 2 * len(mc_full.FULL)
  want = (f"python scripts/train.py experiments/mc_grpo/full.py:math-G2-median seed=1 "
          f"run_dir={runs}/math-G2-median/s1 mesh_fsdp=8 policy=/models/q --no-progress")
  assert want in cmds
  assert lines[-1] == f"# then: python scripts/reproduce.py mc_grpo --full --runs {runs}"
  # A finished run is skipped; an unfinished one is listed again (train.py resumes it).
  arm = "gsm8k-G4-mean"
  fake_run(os.path.join(runs, arm, "s0"), arm, 0, mc_full.FULL[arm]["steps"])
  fake_run(os.path.join(runs, arm, "s1"), arm, 1, 10)
  code, out = exit_of(["mc_grpo", "--seeds", "2", "--runs", runs, "--dry-run",
                       "--prefix", "gsm8k-G4"], capsys)
  lines = out.out.strip().splitlines()
  assert lines[0] == "# mc_grpo: 8 runs (4 arms x 2 seeds), 1 finished, 7 to run"
  assert not [ln for ln in lines if f"{arm}/s0" in ln]
  assert [ln for ln in lines if f"{arm}/s1" in ln][0].endswith("# unfinished: resumes")


def test_named_arms_and_one_field_of_a_dict_key(tmp_path, capsys):
  runs = str(tmp_path / "runs")
  code, out = exit_of(["dars", "--seeds", "1", "--runs", runs, "--dry-run",
                       "--arms", "dars-et,dars-b-et", "allocation_args.chunk=16"], capsys)
  cmds = [ln for ln in out.out.splitlines() if not ln.startswith("#")]
  assert code == 0 and [c.split()[2] for c in cmds] == [
      "experiments/dars/full.py:dars-et", "experiments/dars/full.py:dars-b-et"]
  assert all("allocation_args.chunk=16" in c for c in cmds)


def test_slurm_array_from_a_template(tmp_path, capsys):
  runs = tmp_path / "runs"
  template = os.path.join(ROOT, "scripts", "slurm_array.sbatch")
  argv = ["dars", "--seeds", "3", "--runs", str(runs), "--slurm", template,
          "--prefix", "dars-b"]
  code, out = exit_of(argv, capsys)
  assert code == 0 and "sbatch" in out.out
  commands = (runs / "launch-0" / "commands.txt").read_text().splitlines()
  assert len(commands) == 2 * 3 and all(c.startswith("python scripts/train.py") for c in commands)
  job = (runs / "launch-0" / "array.sbatch").read_text()
  assert "#SBATCH --array=0-5" in job and str(runs / "launch-0" / "commands.txt") in job
  assert f'cd "{os.getcwd()}"' in job  # the commands' relative paths are the launcher's
  assert "{" not in job.replace("${", "").replace("$((", "")  # every placeholder filled
  exit_of(argv, capsys)  # again: a new directory, nothing overwritten
  assert (runs / "launch-1" / "commands.txt").read_text().splitlines() == commands


@pytest.mark.parametrize("argv,match", [
    (["nope", "--seeds", "2", "--dry-run"], "no full-size runs for 'nope'"),
    (["dars", "--seeds", "0", "--dry-run"], "--seeds must be >= 1"),
    (["dars", "--seeds", "2", "--dry-run", "run_dir=x"], "override 'run_dir=x': the launcher sets"),
    (["dars", "--seeds", "2", "--dry-run", "lr=abc"], "arm plain-n8: "),
    (["dars", "--seeds", "2", "--dry-run", "nokey=1"], "nokey"),
    (["dars", "--seeds", "2", "--dry-run", "--prefix", "zz"], "--prefix 'zz': no arm"),
    (["dars", "--seeds", "2", "--dry-run", "--arms", "dars-et,nope"], "--arms: 'nope' is not"),
    (["dars", "--seeds", "2", "--dry-run", "--arms", "dars-et", "--prefix", "grpo"],
     "--prefix 'grpo': no arm of experiments/dars/full.py starts with it among --arms"),
    (["ace", "--seeds", "2", "--dry-run", "lr.x=1"], "arm dapo: override lr.x=1: 'lr' does not"),
])
def test_bad_input_is_one_line_and_exit_2(argv, match, capsys):
  code, out = exit_of(argv, capsys)
  assert code == 2 and match in out.err and not out.out


def test_a_template_without_the_command_list_is_refused(tmp_path, capsys):
  t = tmp_path / "t.sbatch"
  t.write_text("#SBATCH --array={array}\n")
  code, out = exit_of(["dars", "--seeds", "2", "--runs", str(tmp_path / "r"), "--slurm", str(t)],
                      capsys)
  assert code == 2 and "never reads {commands}" in out.err and not (tmp_path / "r").exists()
