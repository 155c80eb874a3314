"""``reproduce.py NAME --full --runs DIR``: full-size run directories (one per arm x seed, as
``scripts/train.py`` writes them) judged by the CPU table's code. The run directories are fakes
written here, with planted per-seed metrics, so the verdicts' numbers are known."""

import importlib
import json
import os

import numpy as np
import pytest

from experiments import ace, dars, harness, mc_grpo
ace_full = importlib.import_module("experiments.ace.full")
dars_full = importlib.import_module("experiments.dars.full")
mc_full = importlib.import_module("experiments.mc_grpo.full")
from scripts import reproduce

ACE_KEYS = ("overconfident_errors",) + ace.SELECTIVITY


# What every fake run trained on (rlpost.train.identity): one policy, one data set, one dtype.
IDENTITY = {"policy": "a" * 64, "data": {"test": "b" * 64, "train": "c" * 64},
            "dtype": {"dtype": "bfloat16", "param_dtype": "float32"}}


def write_run(root, name, config, seed, evals, train=None, identity=IDENTITY, **overrides):
  """A run directory: config.json (``config`` with ``seed`` and ``overrides``), identity.json
  (``identity``; None: none) and metrics.jsonl, with eval entries at the steps of ``evals``
  ({step: {metric: value}}, a step given as a fraction of the run's ``steps``) and train entries
  (``train``) at the same steps."""
  d = os.path.join(root, f"{name}-s{seed}")
  os.makedirs(d)
  cfg = dict(config, seed=seed, run_dir=d, **overrides)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f)
  if identity is not None:
    with open(os.path.join(d, "identity.json"), "w") as f:
      json.dump(identity, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for frac in sorted(evals):
      step = round(frac * cfg["steps"])
      if step:
        row = {"train/reward": 0.5, **{f"train/{k}": v for k, v in (train or {}).items()}}
        f.write(json.dumps({"step": step, **row}) + "\n")
      f.write(json.dumps({"step": step, **{f"eval/{k}": v for k, v in evals[frac].items()}})
              + "\n")
  return d


MC_EFFECT = {"G8-mean": 0.06, "G2-mean": 0.02, "G2-median": 0.05, "G2-mean_drop": 0.03,
             "G2-mean_random": 0.02}


def mc_runs(root, seeds=3, arms=MC_EFFECT, dataset="math", identity=IDENTITY, **overrides):
  rng = np.random.default_rng(0)
  planted = {}
  for arm, effect in arms.items():
    cfg = dict(mc_full.FULL[f"{dataset}-{arm}"], **overrides.get(arm, {}))
    planted[arm] = []
    for s in range(seeds):
      vals = {0: 0.30, 0.25: 0.30 + effect / 2}
      last = [0.30 + effect + 0.004 * rng.standard_normal() for _ in range(3)]
      vals.update({f: v for f, v in zip((0.5, 0.75, 1.0), last)})
      # the run's own weights and data paths: run-local, they do not change its arm
      write_run(root, f"{dataset}-{arm}", cfg, s, {k: {"pass@1": v} for k, v in vals.items()},
                identity=identity(arm, s) if callable(identity) else identity,
                policy=f"/models/{s}", task_spec={"train": "a.jsonl", "test": "b.jsonl"})
      planted[arm].append(np.mean(last))
  return planted


def test_mc_grpo_full_runs_give_the_table(tmp_path, capsys):
  runs, out = tmp_path / "runs", tmp_path / "out"
  planted = mc_runs(str(runs))
  write_run(str(runs / "elsewhere"), "gsm", mc_full.FULL["gsm8k-G2-mean"], 0,
            {0: {"pass@1": 0.1}, 1.0: {"pass@1": 0.2}})  # another dataset's: left out
  write_run(str(runs / "elsewhere"), "g4", mc_full.FULL["math-G4-mean"], 0,
            {0: {"pass@1": 0.1}})  # an arm this table does not use (one seed, unfinished)
  argv = ["mc_grpo", "--full", "--runs", str(runs), "--prefix", "math-", "--out", str(out)]
  # 3 seeds per arm, fewer than the power plan's (SD 0.01, SESOI 0.0125: 12): refused, unless
  # the user accepts it, which is printed and marked in the header.
  with pytest.raises(SystemExit) as e:
    reproduce.main(argv)
  assert e.value.code == 2 and not out.exists()
  err = capsys.readouterr().err
  assert "3 seed(s) in the arm with the fewest; the power plan asks for 12 per arm" in err
  assert err.rstrip().endswith("or pass --allow-underpowered")
  reproduce.main(argv + ["--allow-underpowered"])
  assert "UNDERPOWERED (--allow-underpowered): mc_grpo --full: 3 seed(s)" in capsys.readouterr().out
  res = json.loads((out / "results.json").read_text())
  assert res["full"] and res["command"].endswith("--prefix math-")
  s = res["summary"]
  assert s["start_pass@1"] == pytest.approx(0.30)
  for arm, vals in planted.items():
    assert s["cells"][arm]["mean"] == pytest.approx(np.mean(vals))
  assert s["rates"] is None and "median_fewer_sign_flips" not in s["verdicts"]
  # MATH trains on a two-valued reward: its claims are the 0/1 family's.
  claims = {c["claim"]["id"]: c for c in s["claims"]}
  assert {c["claim"]["family"] for c in s["claims"]} == {"testbed", "mc_grpo_01"}
  want = np.mean(planted["G2-median"]) - np.mean(planted["G2-mean"])
  assert claims["median_beats_mean_small_g_01"]["diff"] == pytest.approx(want)
  assert s["verdicts"]["median_beats_mean_small_g_01"] == "reproduced"  # +0.03 at SD 0.0025
  assert s["base_learned"]
  table = (out / "table.md").read_text()
  assert table.startswith("# MC-GRPO at full size") and "not recorded" in table
  assert "full size, math" in table and "0/1 reward (claim family mc_grpo_01)" in table
  assert "3 seeds per arm (12 from power: SD 0.01 (stated, not measured" in table
  assert "UNDERPOWERED: 3 < 12 seeds, judged under --allow-underpowered" in table
  assert "| 0/1 | G=2, " in table and "| graded |" not in table
  assert os.path.getsize(out / "learning_curves.png") > 0
  assert not (out / "sign_flips.png").exists()


def test_mc_grpo_full_gsm8k_is_judged_as_graded_and_mixed_rewards_are_refused(tmp_path, capsys):
  """GSM8K trains on the graded reward: its claims are the graded family's. A run on another
  reward matches no arm, so one table never pools two rewards."""
  runs, out = tmp_path / "runs", tmp_path / "out"
  assert mc_full.FULL["gsm8k-G2-median"]["graded_reward"]
  mc_runs(str(runs), dataset="gsm8k")
  reproduce.main(["mc_grpo", "--full", "--runs", str(runs), "--prefix", "gsm8k-",
                  "--out", str(out), "--allow-underpowered"])
  s = json.loads((out / "results.json").read_text())["summary"]
  assert {c["claim"]["family"] for c in s["claims"]} == {"testbed", "mc_grpo"}
  assert s["verdicts"]["median_beats_mean_small_g"] == "reproduced"
  mixed = tmp_path / "mixed"
  mc_runs(str(mixed), dataset="gsm8k", **{"G2-mean": {"graded_reward": False}})
  with pytest.raises(SystemExit) as e:
    reproduce.main(["mc_grpo", "--full", "--runs", str(mixed), "--prefix", "gsm8k-",
                    "--out", str(tmp_path / "o2")])
  assert e.value.code == 2
  assert "gsm8k-G2-mean-s0: its config matches no arm" in capsys.readouterr().err


def test_full_runs_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
  runs = tmp_path / "runs"
  mc_runs(str(runs), arms={k: v for k, v in MC_EFFECT.items() if k != "G2-mean_random"})

  def fails(argv, match):
    with pytest.raises(SystemExit) as e:
      reproduce.main(argv)
    assert e.value.code == 2
    assert match in capsys.readouterr().err

  base = ["mc_grpo", "--full", "--runs", str(runs), "--out", str(tmp_path / "o")]
  fails(base + ["--prefix", "math-"], "no runs under")  # an arm of the table is missing
  fails(base, "--prefix must be 'math-' or 'gsm8k-'")
  fails(["mc_grpo", "--full", "--out", str(tmp_path / "o")], "--full needs --runs DIR")
  fails(["mc_grpo", "--full", "--runs", str(tmp_path / "nope")], "not a directory")
  cfg = mc_full.FULL["math-G2-mean"]
  full = {0: {"pass@1": 0.3}, 1.0: {"pass@1": 0.3}}
  write_run(str(runs / "lr"), "math-G2-mean", cfg, 7, full, lr=3e-6)  # no arm has this lr
  fails(base + ["--prefix", "math-"], "matches no arm of the table")
  (runs / "lr" / "math-G2-mean-s7" / "config.json").unlink()
  write_run(str(runs / "short"), "math-G2-mean", cfg, 8, {0: {"pass@1": 0.3}, 0.5: {"pass@1": 0.3}})
  fails(base + ["--prefix", "math-"], "unfinished (last evaluation at step")
  (runs / "short" / "math-G2-mean-s8" / "config.json").unlink()
  write_run(str(runs / "again"), "math-G2-mean", cfg, 0, full)  # a seed run twice
  fails(base + ["--prefix", "math-"], "arm math-G2-mean seed 0 is also in")
  assert not (tmp_path / "o").exists()  # nothing written


def test_collect_runs_matches_configs_and_aligns_seeds(tmp_path):
  arms = {"a": {"recipe": "grpo", "lr": 1e-6, "group_size": 4, "steps": 4},
          "b": {"recipe": "grpo", "lr": 2e-6, "group_size": 4, "steps": 4}}
  for s in (1, 0):
    write_run(str(tmp_path), "a", arms["a"], s, {0: {"pass@1": 0.1}, 1.0: {"pass@1": 0.2 + s}},
              train={"kl": s})
  write_run(str(tmp_path), "b", arms["b"], 0, {0: {"pass@1": 0.1}, 1.0: {"pass@1": 0.1}})
  with pytest.raises(harness.RunsError, match="arm b: 1 seed"):
    harness.collect_runs(str(tmp_path), arms)
  assert list(harness.collect_runs(str(tmp_path), arms, select={"a"})) == ["a"]
  a = harness.collect_runs(str(tmp_path), arms, min_seeds=1)["a"]
  assert a["seeds"] == [0, 1] and [e["step"] for e in a["evals"]] == [0, 4]
  assert [x["pass@1"] for x in a["evals"][1]["per_seed"]] == [0.2, 1.2]  # seed order
  assert a["train"]["kl"] == [[0, 1]]
  # seeds whose evaluation steps differ cannot be compared
  write_run(str(tmp_path / "x"), "a", arms["a"], 2, {0: {"pass@1": 0.1}, 0.5: {"pass@1": 0.1},
                                                     1.0: {"pass@1": 0.1}})
  with pytest.raises(harness.RunsError, match="evaluation steps"):
    harness.collect_runs(str(tmp_path), arms, min_seeds=1)


def test_ace_full_runs_give_the_table(tmp_path, capsys):
  runs, out = tmp_path / "runs", tmp_path / "out"
  ks = (1, 2, 4, 8, 16, 32)
  rng = np.random.default_rng(1)
  for name, gain in (("dapo", 0.0), ("ace-dapo-0.5", 0.02)):
    for s in range(3):
      evals = {}
      for step in (0, 0.25, 0.5, 0.75, 1.0):
        lift = 0.05 * (step > 0)
        evals[step] = {f"pass@{k}": min(1.0, 0.2 + 0.1 * np.log2(k) + lift
                                        + (gain * (k == 32)) + 0.002 * rng.standard_normal())
                       for k in ks}
        evals[step]["token_entropy"] = 0.5
      write_run(str(runs), name, ace_full.FULL[name], s, evals,
                train={k: 0.1 for k in ACE_KEYS})
  reproduce.main(["ace", "--full", "--runs", str(runs), "--out", str(out), "--allow-underpowered"])
  s = json.loads((out / "results.json").read_text())["summary"]
  assert s["main"] == "ace-dapo-0.5" and s["ks"] == list(ks)
  claims = {c["claim"]["id"]: c for c in s["claims"]}
  assert claims["grpo_learns"]["claim"]["arms"] == ["dapo"] and s["base_learned"]
  assert claims["pass_at_kmax_improves"]["diff"] == pytest.approx(0.02, abs=0.005)
  assert claims["pass_at_kmax_improves"]["claim"]["arms"] == ["ace-dapo-0.5", "dapo"]
  table = (out / "table.md").read_text()
  assert table.startswith("# ACE at full size") and "DAPO base" in table
  # runs without the confidence diagnostics cannot enter the table
  bare = tmp_path / "bare"
  for name in ("dapo", "ace-dapo-0.5"):
    for s in range(2):
      write_run(str(bare), name, ace_full.FULL[name], s,
                {f: {f"pass@{k}": 0.1 for k in ks} for f in (0, 0.5, 0.75, 1.0)})
  with pytest.raises(SystemExit) as e:
    reproduce.main(["ace", "--full", "--runs", str(bare), "--out", str(tmp_path / "o")])
  assert e.value.code == 2 and "logged no confidence diagnostics" in capsys.readouterr().err


# planted (pass@1, pass@64) gains over plain-n8 of each full-size DARS arm
DARS_EFFECT = {"plain-n8": (0.0, 0.0), "plain-n16": (0.0, 0.0), "dars-et": (0.0, 0.03),
               "plain-breadth": (0.02, 0.0), "dars-b-et": (0.04, 0.05)}


def test_dars_full_runs_give_the_table(tmp_path, capsys):
  runs, out = tmp_path / "runs", tmp_path / "out"
  rng = np.random.default_rng(2)
  stage2 = {"dars_all_wrong_stage1": 30.0, "dars_rescued": 6.0, "dars_extra_rollouts": 900.0,
            "dars_budget_used": 0.9, "dars_truncated_fraction": 0.0}
  for name, (g1, g64) in DARS_EFFECT.items():
    for s in range(3):
      evals = {0: {"pass@1": 0.30, "pass@4": 0.45, "pass@16": 0.6, "pass@64": 0.70}}
      for f in (0.5, 0.75, 1.0):
        evals[f] = {"pass@1": 0.35 + g1 + 0.003 * rng.standard_normal(), "pass@4": 0.5,
                    "pass@16": 0.62, "pass@64": 0.70 + g64 + 0.003 * rng.standard_normal()}
      write_run(str(runs), name, dars_full.FULL[name], s, evals,
                train=stage2 if name.startswith("dars") else None)
  # an arm the table does not use is recognised and left out
  write_run(str(runs), "dars-hw", dars_full.FULL["dars-hw"], 0, {0: {"pass@1": 0.3}})
  reproduce.main(["dars", "--full", "--runs", str(runs), "--out", str(out), "--allow-underpowered"])
  res = json.loads((out / "results.json").read_text())
  s = res["summary"]
  assert list(res["data"]["arms"]) == list(dars.FULL_ARMS.values())
  assert s["keys"] == ["pass@1", "pass@4", "pass@16", "pass@64"]  # no digit bucket in MATH
  claims = {c["claim"]["id"]: c for c in s["claims"]}
  assert s["base_learned"] and claims["grpo_learns"]["diff"] == pytest.approx(0.05, abs=0.005)
  assert claims["dars_beats_matched_n"]["claim"]["arms"] == ["dars-et", "plain-n16"]
  assert claims["dars_beats_matched_n"]["diff"] == pytest.approx(0.03, abs=0.006)
  assert claims["depth_adds_to_breadth"]["diff"] == pytest.approx(0.05, abs=0.006)
  assert s["verdicts"]["breadth_improves_pass1"] == "reproduced"
  assert s["updates"]["plain-b"] == 86 * 2 and s["updates"]["plain-n8"] == (
      dars_full.STANDARD_STEPS * 2)
  assert s["stage2"]["dars-et"]["dars_budget_used"] == pytest.approx(0.9)
  assert s["sanity"] is None
  table = (out / "table.md").read_text()
  assert table.startswith("# DARS / DARS-B at full size") and "experiments/dars/full.py" in table
  assert "Stage 2 is sampled in calls of 512 rows" in table and "172 optimizer updates" in table
  assert "| dars-et | 30.00 | 6.00 | 900.0 | 0.900 | 0.000 |" in table
  assert os.path.getsize(out / "passk.png") > 0 and not (out / "cumulative_advantage.png").exists()
  with pytest.raises(SystemExit) as e:
    reproduce.main(["dars", "--full", "--runs", str(runs), "--prefix", "x-",
                    "--out", str(tmp_path / "o")])
  assert e.value.code == 2 and "no --prefix" in capsys.readouterr().err
  for d in (runs / "plain-breadth-s0", runs / "plain-breadth-s1", runs / "plain-breadth-s2"):
    (d / "config.json").unlink()
  with pytest.raises(SystemExit) as e:
    reproduce.main(["dars", "--full", "--runs", str(runs), "--out", str(tmp_path / "o")])
  assert e.value.code == 2 and "for arm(s) plain-breadth" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key,other", [
    ("policy", "d" * 64), ("data", {"test": "b" * 64, "train": "e" * 64}),
    ("dtype", {"dtype": "float32", "param_dtype": "float32"})])
def test_runs_of_other_weights_data_or_dtype_are_refused(tmp_path, key, other):
  """The paths are run-local, so what they held decides: one run of another policy (a 7B
  checkpoint), another data set or another dtype is refused with the key named."""
  odd = lambda arm, s: dict(IDENTITY, **{key: other}) if (arm, s) == ("G2-mean", 1) else IDENTITY  # noqa: E731
  mc_runs(str(tmp_path), identity=odd)
  with pytest.raises(harness.RunsError, match=rf"runs differ in '{key}': .*math-G2-mean-s1 \(arm "
                     r"math-G2-mean\) has .*one policy, one data set and one dtype"):
    mc_grpo.from_full_runs(str(tmp_path), "math-")


def test_a_run_without_identity_is_digested_from_its_files_or_refused(tmp_path):
  from rlpost.train import identity

  pol = tmp_path / "policy"
  pol.mkdir()
  (pol / "config.json").write_text('{"model_type": "qwen2"}')
  data = {s: tmp_path / f"{s}.jsonl" for s in ("train", "test")}
  for s, p in data.items():
    p.write_text(json.dumps({"question": s, "answer": "1"}) + "\n")
  spec = {s: str(p) for s, p in data.items()}
  cfg = dict(mc_full.FULL["math-G2-mean"], policy=str(pol), task_spec=spec)
  (pol / "model.safetensors").write_bytes(b"weights")
  ident = identity.of_config(cfg)
  assert ident["policy"] == identity.policy_digest(str(pol))
  (pol / "model.safetensors").write_bytes(b"fine-tuned")  # the same config, other weights
  assert identity.of_config(cfg)["policy"] != ident["policy"]
  (pol / "model.safetensors").write_bytes(b"weights")
  assert set(ident["data"]) == {"train", "test"} and ident["dtype"]["dtype"] == "bfloat16"
  runs = [{"dir": "r0", "config": cfg, "identity": None},
          {"dir": "r1", "config": cfg, "identity": ident}]
  harness.check_identities(runs, {})  # the old run's files give the same identity
  data["train"].write_text("other\n")
  with pytest.raises(harness.RunsError, match="runs differ in 'data'"):
    harness.check_identities(runs, {})
  gone = dict(cfg, policy=str(tmp_path / "elsewhere"))
  with pytest.raises(harness.RunsError, match=r"r0: no identity.json .*config key 'policy': "
                     r"cannot read .*elsewhere"):
    harness.check_identities([{"dir": "r0", "config": gone, "identity": None}] + runs[1:], {})


def test_dars_full_docs_state_its_power_plan():
  from experiments import full_size

  need = harness.power_plan(dict(full_size.power_fields(), min_effect=dars.Design().min_effect))
  assert f"{need} at the stated SD {full_size.SEED_SD}" in " ".join(dars_full.__doc__.split())
