"""The benchmarks of scripts/benchmarks/ (averaging, roundtrip, lora, seeds, packing,
profile_update, layers): quick runs write the documented JSON.

Each benchmark's ``run`` is called in a fresh interpreter (the round-trip benchmark counts XLA
compilations, which needs a process whose jit caches start empty). No timing assertions: the
numbers depend on the machine and its load; only structure, signs and internal consistency.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import env_without_compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = """
import argparse, importlib, json, sys
sys.path.insert(0, {root!r})
mod = importlib.import_module("scripts.benchmarks." + sys.argv[1])
parser = argparse.ArgumentParser()
mod.add_args(parser)
result = mod.run(parser.parse_args(sys.argv[3:]))
with open(sys.argv[2], "w") as f:
  json.dump(result, f, default=str)
"""


def _run(tmp_path, name, *args):
  out = tmp_path / f"{name}.json"
  proc = subprocess.run([sys.executable, "-c", _DRIVER.format(root=ROOT), name, str(out), *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                        env=env_without_compilation_cache())
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text()), proc.stdout


def test_averaging_quick(tmp_path):
  data, stdout = _run(tmp_path, "averaging", "--quick")
  assert data["benchmark"] == "averaging"
  s = data["settings"]
  assert s["quick"] and s["model"] == "toy" and s["ks"] == [2, 4] and s["opt_state"]
  assert s["params"] == s["config_params"] > 0 and s["leaves"] > 0
  assert s["tree_mb"] == pytest.approx(s["params"] * 4 / 2 ** 20)
  # Adam moments are in the checkpoint too, so a checkpoint is larger than the parameters.
  assert s["checkpoint_mb"] > s["tree_mb"] > 0 and s["write_s"] > 0
  assert data["idle_rss_mb"] > 0
  rows = data["results"]
  assert [r["k"] for r in rows] == s["ks"]
  steps = [100 * (i + 1) for i in range(max(s["ks"]))]
  for r in rows:
    assert r["items"] == steps[-r["k"]:]  # the K latest checkpoints
    for method in ("streaming", "naive"):
      m = r[method]
      assert m["items"] == r["items"]
      assert len(m["seconds"]) == s["repeats"] and all(t > 0 for t in m["seconds"])
      assert m["first_s"] > 0 and m["min_s"] <= m["median_s"] <= m["max_s"]
      assert m["rss_peak_mb"] >= m["rss_baseline_mb"] > 0
      assert m["rss_increment_mb"] == pytest.approx(m["rss_peak_mb"] - m["rss_baseline_mb"])
      assert m["trees_at_peak"] == pytest.approx(m["rss_increment_mb"] / s["tree_mb"])
      # The measuring process's baseline is its own, not the launching process's peak.
      assert 0.5 * data["idle_rss_mb"] < m["rss_baseline_mb"] < 2 * data["idle_rss_mb"]
      if m["vm_hwm_peak_mb"] is not None:
        assert m["vm_hwm_peak_mb"] >= m["vm_hwm_baseline_mb"] > 0
    assert 0 <= r["max_abs_diff"] <= 1e-6 and 0 <= r["max_rel_diff"] <= 1e-6
    assert r["time_ratio"] == pytest.approx(r["naive"]["median_s"] / r["streaming"]["median_s"])
  for method in ("streaming", "naive"):
    f = data["fit"][method]
    assert f["trees_per_checkpoint"] == pytest.approx(f["mib_per_checkpoint"] / s["tree_mb"])
  assert "| K | streaming ms | naive ms |" in stdout


def test_lora_quick(tmp_path):
  data, stdout = _run(tmp_path, "lora", "--quick", "--data-dir", str(tmp_path / "data"))
  assert data["benchmark"] == "lora"
  s = data["settings"]
  assert s["quick"] and s["rank"] == 8 and s["config"]["lora_rank"] == 8
  full, adapted = data["results"]
  assert (full["mode"], full["rank"], adapted["mode"]) == ("full", 0, "lora r=8")
  # The same model: LoRA adds the adapters to the parameters and trains only them.
  assert full["trainable"] == full["params"] > 0
  assert 0 < adapted["trainable"] == adapted["params"] - full["params"]
  # AdamW: two float32 moments per trained parameter and an int32 count.
  for r in (full, adapted):
    assert r["opt_state_bytes"] == 2 * 4 * r["trainable"] + 4
    assert r["param_bytes"] == 4 * r["params"]
    assert r["update_s"] > 0 and r["step_s"] > 0
  assert data["lora_over_full"]["opt_state"] == pytest.approx(
      adapted["opt_state_bytes"] / full["opt_state_bytes"])
  assert "| mode | params | trainable |" in stdout and "| lora r=8 |" in stdout


def test_roundtrip_quick(tmp_path):
  data, stdout = _run(tmp_path, "roundtrip", "--quick")
  assert data["benchmark"] == "roundtrip"
  s = data["settings"]
  assert s["quick"] and s["system"] == "kdv1d" and s["grid"] == [64] and s["num_fields"] == 1
  assert s["depths"] == [1, 2] and s["batch"] == 4 and s["params"] > 0
  assert s["sampler"]["method"] == "euler" and s["sampler"]["init"] == "zero"
  assert s["network_calls_per_step"] == s["sampler"]["num_steps"] >= 1
  rows = data["results"]
  assert [r["depth"] for r in rows] == s["depths"]
  med = {}
  for r in rows:
    d = r["depth"]
    for v in ("forward", "round", "all"):
      t = r[v]
      assert len(t["seconds"]) == s["repeats"] and all(x > 0 for x in t["seconds"])
      assert t["min_s"] <= t["median_s"] <= t["max_s"] and t["compile_s"] > 0
    med[d] = r["round"]["median_s"]
    assert r["ratio"] == pytest.approx(r["round"]["median_s"] / r["forward"]["median_s"])
    assert r["steps"] == {"forward": d, "round": 2 * d, "all": d + d * (d + 1) // 2,
                          "separate": d * (d + 1)}
    # Depths 1 and 2 are both measured: the separate sum is exact.
    assert not r["separate_estimated"]
    assert r["separate_s"] == pytest.approx(sum(med[j] for j in range(1, d + 1)))
    assert r["all_vs_separate"] == pytest.approx(r["all"]["median_s"] / r["separate_s"])
  ds = data["depth_set"]
  assert ds["depths"] == s["depths"] and ds["median_s"] > 0
  assert ds["separate_s"] == pytest.approx(sum(med.values()))
  assert ds["one_pass_vs_separate"] == pytest.approx(ds["median_s"] / ds["separate_s"])
  comp = data["compilations"]
  # One trace per (entry point, static depths): rollout at 1 and 2; round_trip at (1,), (2,)
  # and (1, 2) (the every-depth call of depth 1 is (1,), and the depth set is (1, 2)).
  assert comp["traces"] == {"rollout": 2, "round_trip": 3}
  assert comp["warmup"] >= 5 and comp["timed"] == 0
  assert "| depth i | forward ms | round trip ms |" in stdout


def test_seeds_quick(tmp_path):
  data, stdout = _run(tmp_path, "seeds", "--quick", "--data-dir", str(tmp_path / "data"))
  assert data["benchmark"] == "seeds"
  s = data["settings"]
  assert s["quick"] and s["seeds"] == [1, 2] and s["params"] > 0
  rows = data["results"]
  assert [r["K"] for r in rows] == [1, 2]
  one_state = rows[0]["state_bytes"]
  for r in rows:
    assert r["single_s"] > 0 and r["vmapped_s"] > 0
    assert r["per_seed_step_s"] == pytest.approx(r["vmapped_s"] / r["K"])
    assert r["vs_one_seed"] == pytest.approx(r["vmapped_s"] / r["single_s"])
    # K stacked states: K copies of one seed's state.
    assert r["state_bytes"] == r["K"] * one_state
  assert "| K | one seed ms | vmapped ms |" in stdout


def test_packing_quick(tmp_path):
  data, stdout = _run(tmp_path, "packing", "--quick")
  assert data["benchmark"] == "packing" and data["settings"]["quick"]
  rows = data["results"]
  assert [r["share"] for r in rows] == [0.7, 0.4]
  for r in rows:
    # the padded and packed passes compute the same loss and gradients
    assert r["loss_gap"] < 1e-3 and r["max_grad_gap"] < 1e-4
    assert 0 < r["real_tokens"] <= r["packed_slots"] <= 1
    assert r["speedup"] == pytest.approx(r["padded_ms"] / r["packed_ms"])
  # fewer real tokens pack into a smaller bucket
  assert rows[1]["packed_slots"] < rows[0]["packed_slots"]
  assert set(data["compile_s"]) == {"padded", "packed"}
  assert "| real tokens | bucket (share of slots) |" in stdout



def test_profile_update_traces_the_update(tmp_path):
  """scripts/benchmarks/profile_update.py on the toy setting: the trace holds the update's ops
  (dots among them) and the stand-alone dot's FLOP rate is its FLOPs over its time."""
  from rlpost.train import rl
  from scripts.benchmarks import profile_update
  from scripts.benchmarks import train as bench_train

  class Quick(profile_update._Args):
    quick, prompts, group_size, new_tokens, data_dir = True, 4, 4, 8, str(tmp_path / "data")

  cfg = bench_train._config(Quick, 0.0) | {"num_prompts": 4, "group_size": 4,
                                           "max_new_tokens": 8}
  ms, count, wall = profile_update.profile_update(rl.make_train(cfg, log=lambda s: None),
                                                  calls=1, top=2)
  longest = ms.pop("longest ops")
  assert wall > 0 and sum(ms.values()) > 0 and set(ms) == set(count)
  assert len(longest) == 2 and longest[0][1] >= longest[1][1] > 0
  assert all(shape != "?" for _, _, shape in longest)  # found in the compiled HLO
  assert any("dot" in kind or "ynn" in kind for kind in ms), sorted(ms)
  out = profile_update.mlp_dot_alone(64, 16, 32)
  assert set(out) == {"forward x @ w", "input gradient dy @ w.T", "weight gradient x.T @ dy"}
  for r in out.values():
    assert r["ms"] > 0 and abs(r["gflops"] - 2 * 64 * 16 * 32 / r["ms"] / 1e6) < 1e-9


def test_layers_quick(tmp_path):
  """bench.py layers --quick: stored against stacked layers, one row per program, in the
  documented fields (the two trainers start from the same weights: the benchmark asserts it)."""
  data, stdout = _run(tmp_path, "layers", "--quick", "--data-dir", str(tmp_path / "data"))
  assert data["benchmark"] == "layers" and data["settings"]["quick"]
  rows = data["results"]
  assert [r["what"].split(",")[0] for r in rows] == ["GRPO step", "GRPO step", "sampler"]
  for r in rows:
    assert r["stored_s"] > 0 and r["stacked_s"] > 0
    assert r["stacked_over_stored"] == pytest.approx(r["stacked_s"] / r["stored_s"])
  assert "| what | stored ms | stacked ms | stacked / stored | per round" in stdout
  assert all(len(r["paired_ratios"]) == data["settings"]["repeats"] for r in rows)


def test_dot_in_step_finds_the_dots_and_their_overlap():
  """scripts/benchmarks/dot_in_step.py's pieces on a toy program: the two [R, F] dots are found
  in the compiled HLO and in the trace, the stand-alone programs all run, and the MLP with the
  gate and up weights concatenated has the two-dot MLP's gradients."""
  import jax
  import jax.numpy as jnp
  from scripts.benchmarks import dot_in_step

  ks = jax.random.split(jax.random.key(0), 3)
  x, a, b = (jax.random.normal(k, s) for k, s in zip(ks, ((256, 16), (16, 64), (16, 64))))
  fn = jax.jit(lambda x, a, b: (jnp.tanh(x @ a), x @ b))
  assert len(dot_in_step._dots(fn.lower(x, a, b).compile().as_text(), 256, 64)) >= 2
  r = dot_in_step._in_step(fn, (x, a, b), 256, 64, calls=1)
  assert r["dots"] == 2 and r["median_ms"] > 0 and 0.0 <= r["overlap"] <= 1.0
  alone = dot_in_step._alone(64, 16, 32)
  assert len(alone) == 5 and all(v > 0 for v in alone.values())
  wd = jax.random.normal(ks[0], (64, 16))
  grads = [jax.grad(lambda *p: jnp.sum(mlp(*p) ** 2), argnums=(0, 1, 2, 3))(x, a, b, wd)
           for mlp in (dot_in_step.mlp, dot_in_step.mlp_concat)]
  assert float(jnp.abs(grads[0][1]).max()) > 0
  for g0, g1 in zip(*grads):  # one program against another: equal to float32 rounding
    scale = float(jnp.abs(g0).max())
    assert float(jnp.abs(g1 - g0).max()) <= 1e-5 * scale, (float(jnp.abs(g1 - g0).max()), scale)


def test_dot_in_step_refuses_unknown_variants(capsys):
  from scripts.benchmarks import dot_in_step
  with pytest.raises(SystemExit) as e:
    dot_in_step.main(["--variants", "fast"])
  assert e.value.code == 2 and "unknown ['fast']" in capsys.readouterr().err


def test_arm_profile_parts_add_up(tmp_path, capsys):
  """scripts/benchmarks/arm_profile.py on mc_grpo's --quick design: the parts add up to the
  extrapolated arm time, one step compilation serves every step, and --out is never
  overwritten."""
  from scripts.benchmarks import arm_profile

  out = tmp_path / "arm.json"
  arm_profile.main(["--quick", "--arm", "G2-mean", "--steps", "3", "--out", str(out)])
  r = json.loads(out.read_text())
  assert r["command"].endswith("--out " + str(out)) and r["machine"]["cpu_cores"] >= 1
  assert r["step_compilations"] == 1 and r["seeds"] == 2 and r["design_evaluations"] == 1 + 2 * 3
  assert sum(r["parts_s"].values()) == pytest.approx(r["arm_s_extrapolated"])
  assert sum(r["shares"].values()) == pytest.approx(1.0)
  assert r["parts_s"]["steps"] == pytest.approx(3 * r["step_s"]) and r["step_s"] > 0
  assert all(v > 0 for v in r["single_seed_split_s"].values())
  assert "| steps |" in r["report"] and "| steps |" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:
    arm_profile.main(["--quick", "--out", str(out)])
  assert e.value.code == 2 and "exists; not overwritten" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    arm_profile.main(["--quick", "--arm", "G9-mode"])
  assert e.value.code == 2 and "--arm G9-mode: not an arm of mc_grpo" in capsys.readouterr().err
