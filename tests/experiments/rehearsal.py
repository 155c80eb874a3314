"""A full-size table's dress rehearsal at toy size, in one process with simulated devices.

``rehearse`` runs, for one experiment with ``experiments/<name>/full.py``, what a user with
accelerators runs, with every key at its full-size value except the widths of the model and
the sizes listed in ``TOY`` (and the per-table ``SCALED`` fields):

1. the data: source files in each paper's published layout (a MATH release tree, MATH-500's
   jsonl, DAPO-Math-17K's and the DARS sets' verl parquet) converted by
   ``scripts/prepare_data.py``;
2. the policy: a tiny random checkpoint of the family of the run's (its config.json flags, Qwen's
   chat tokens), read through the Hugging Face loader with the full-size chat template;
3. ``scripts/launch.py NAME --seeds 2 --dry-run --arms ...``: the printed commands of the arms
   the table reads, each run in this process by ``scripts/train.py``'s ``main`` on the
   simulated devices with ``mesh_fsdp`` over all of them (FSDP), blockwise attention, stacked
   layers and the configured scorer; in the ACE table (the cheapest) the first run is first launched with
   ``steps=1`` and then with its own command, which resumes it from its step-1 checkpoint in
   the same process (every run evaluates at each step, so its evaluations align with the
   rest; a process killed mid-run is tested in ``tests/train/test_nothing_lost.py``);
4. ``scripts/reproduce.py NAME --full --runs DIR --allow-underpowered``: the run directories
   aggregated into the table, the table's arms being the full-size arms with the same toy
   overrides (so the aggregator's matching, identity checks and power plan run as they would).

Run by ``tests/experiments/test_dress_rehearsal.py`` in a subprocess (the device count is fixed
when JAX starts); prints one JSON line starting ``REHEARSAL`` with what it saw.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shlex
import time

# Sizes that shrink, for every table; every other key keeps its full-size value. num_prompts 8
# makes every arm's sampling calls and mini-batches split over 8 devices.
TOY = ["num_prompts=8", "steps=2", "max_new_tokens=8", "num_train=8", "num_test=4",
       "eval_every=1", "eval_problems=4", "eval_samples=2", "eval_batch=8", "checkpoint_every=1",
       "grad_accum=1", "rollout_chunk=0"]

# Per table: the launches (arms, overrides of fields that scale with the sizes), the
# aggregator's --prefix and whether the first run is stopped after step 1 and resumed. DARS's
# stage 2 runs in calls of 16 rows (12 at most per step here, as many as the step's demand
# needs) and its update in 2 micro-batches ordered by live rows; which calls and micro-batches
# a step skips depends on what the tiny policy draws.
TABLES = {
    "mc_grpo": dict(prefix="math-", launches=[
        (["math-G2-mean", "math-G2-median", "math-G2-mean_drop", "math-G2-mean_random",
          "math-G8-mean"], [])]),
    "ace": dict(prefix="", resume=True, launches=[
        (["dapo", "ace-dapo-0.5"], ["recipe_args.overlong_buffer=4"])]),
    "dars": dict(prefix="", launches=[
        (["plain-n8", "plain-n16", "plain-breadth"], []),
        (["dars-et", "dars-b-et"], ["allocation_args.chunk=16", "grad_accum=2"])]),
}

# Train metrics each run reports back.
WATCH = ("loss", "grad_norm", "reward", "dars_stage2_calls", "dars_truncated_fraction",
         "dars_extra_rollouts", "overconfident_errors")

PROBLEMS = [(f"What is ${a} + {b}$?", str(a + b)) for a, b in
            ((3, 4), (12, 5), (7, 9), (20, 22), (6, 6), (15, 1), (8, 13), (30, 11), (2, 2),
             (9, 5), (14, 14), (1, 40))]


def _sources(root: str) -> dict[str, list[str]]:
  """Source files in each published layout; {converter: [src, ...]}."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  from rlpost.tasks import convert

  train, test = PROBLEMS[:8], PROBLEMS[8:]
  out = {}
  # The MATH release: MATH/train/<subject>/<n>.json; MATH-500: test.jsonl with answers.
  for i, (q, a) in enumerate(train):
    path = os.path.join(root, "MATH", "train", "algebra", f"{i}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      json.dump({"problem": q, "level": "Level 1", "type": "Algebra",
                 "solution": f"It is $\\boxed{{{a}}}$."}, f)
  m500 = os.path.join(root, "MATH-500", "test.jsonl")
  os.makedirs(os.path.dirname(m500))
  with open(m500, "w") as f:
    for i, (q, a) in enumerate(test):
      f.write(json.dumps({"problem": q, "solution": f"$\\boxed{{{a}}}$", "answer": a,
                          "subject": "Algebra", "level": 1, "unique_id": f"test/{i}.json"})
              + "\n")
  out["math"], out["math500"] = [os.path.join(root, "MATH")], [m500]

  def verl(q, a, i, system=None):
    prompt = ([{"content": system, "role": "system"}] if system else []) + [
        {"content": q, "role": "user"}]
    return {"data_source": "math", "prompt": prompt, "ability": "MATH",
            "reward_model": {"ground_truth": a, "style": "rule"},
            "extra_info": {"index": i, "split": "train"}}

  def parquet(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path

  out["dapo_math_17k"] = [parquet(os.path.join(root, "dapo", "dapo-math-17k.parquet"), [
      verl(f"{convert.DAPO_PREFIX}\n\n{q}\n\n{convert.DAPO_SUFFIX}", a, i)
      for i, (q, a) in enumerate(train)])]
  system = "Please reason step by step, and put your final answer within \\boxed{}."
  d = os.path.join(root, "DARS-Dataset")
  out["dars"] = [parquet(os.path.join(d, "openr1.parquet"),
                         [verl(q, a, i, system) for i, (q, a) in enumerate(train)]),
                 parquet(os.path.join(d, "capacity_val.parquet"),
                         [verl(q, a, i) for i, (q, a) in enumerate(test)])]
  return out


def _prepare(experiment: str, root: str) -> dict:
  """The table's task_spec, from its sources converted by scripts/prepare_data.py."""
  from scripts import prepare_data

  src = _sources(os.path.join(root, "sources"))
  data = os.path.join(root, "data")
  names = {"mc_grpo": ("math", "math500"), "ace": ("dapo_math_17k", "math500"),
           "dars": ("dars",)}[experiment]
  for name in names:
    prepare_data.main([name, *src[name], "--out", os.path.join(data, name)])
  if experiment == "dars":
    return {"train": f"{data}/dars/train.jsonl", "test": f"{data}/dars/test.jsonl"}
  return {"train": f"{data}/{names[0]}/train.jsonl", "test": f"{data}/math500/test.jsonl"}


def rehearse(experiment: str, root: str) -> dict:
  import jax

  import hf_policy_testutil as hpt
  from experiments import full_size
  from rlpost.train import config as config_lib
  from rlpost.train import rl
  from scripts import launch, reproduce
  from scripts import train as train_script

  devices = jax.device_count()
  table = TABLES[experiment]
  full = importlib.import_module(f"experiments.{experiment}.full")
  spec = _prepare(experiment, root)
  arms = [a for names, _ in table["launches"] for a in names]
  policy_name = os.path.basename(full.FULL[arms[0]]["policy"])
  assert all(os.path.basename(full.FULL[a]["policy"]) == policy_name for a in arms)
  policy = hpt.write_policy_like(os.path.join(root, policy_name), full_size.POLICIES[policy_name],
                                 texts=[full.FULL[arms[0]]["prompt_template"]])
  runs = os.path.join(root, "runs")
  local = [f"policy={policy}", f"task_spec={json.dumps(spec)}", f"mesh_fsdp={devices}"]
  seen: dict = {"devices": devices, "runs": [], "toy": {}}
  for names, extra in table["launches"]:
    argv = [experiment, "--seeds", "2", "--runs", runs, "--dry-run", "--arms", ",".join(names),
            *TOY, *extra, *local]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
      todo = launch.main(argv)
    assert len(todo) == 2 * len(names), printed.getvalue()
    for t in todo:
      train_argv = shlex.split(t["command"])[2:]  # after "python scripts/train.py"
      start = time.perf_counter()
      resumed = None
      if table.get("resume") and not seen["runs"]:  # stopped after step 1, then resumed
        train_script.main(train_argv + ["steps=1"])
        out = train_script.main(train_argv)
        resumed = out["resumed_from"]
      else:
        out = train_script.main(train_argv)
      rows = [json.loads(line) for line in open(os.path.join(t["run_dir"], "metrics.jsonl"))]
      ckpts = os.path.join(t["run_dir"], "checkpoints")
      seen["runs"].append(dict(
          arm=t["arm"], seed=t["seed"], run_dir=t["run_dir"], resumed_from=resumed,
          seconds=round(time.perf_counter() - start, 1), step=int(out["state"].step),
          evals=[e["step"] for e in out["evals"]],
          checkpoints=sorted(int(n) for n in os.listdir(ckpts) if n.isdigit()),
          identity=os.path.exists(os.path.join(t["run_dir"], "identity.json")),
          train={k: [r[f"train/{k}"] for r in rows if f"train/{k}" in r] for k in WATCH}))
    for a in names:
      seen["toy"][a] = config_lib.apply_overrides(
          full.FULL[a], config_lib.parse_overrides(TOY + extra, rl.RLConfig))
  # Each launch again, as it was launched: every run is finished, so nothing is left to run.
  seen["left_to_run"] = 0
  for names, extra in table["launches"]:
    with contextlib.redirect_stdout(io.StringIO()):
      seen["left_to_run"] += len(launch.main(
          [experiment, "--seeds", "2", "--runs", runs, "--dry-run", "--arms", ",".join(names),
           *TOY, *extra, *local]))
  # The aggregator over the toy arms: the full-size arms with the same overrides.
  full.FULL = seen.pop("toy")
  out_dir = os.path.join(root, "table")
  argv = [experiment, "--full", "--runs", runs, "--out", out_dir, "--allow-underpowered"]
  with contextlib.redirect_stdout(io.StringIO()) as printed:
    report = reproduce.main(argv + (["--prefix", table["prefix"]] if table["prefix"] else []))
  seen["table"] = os.path.join(out_dir, "table.md")
  seen["printed"] = printed.getvalue()[-2000:]
  seen["claims"] = {c["claim"]["id"]: c.get("verdict") for c in report["summary"]["claims"]}
  seen["seeds"] = report["config"]["seeds"]
  return seen


def main(experiment: str, root: str) -> None:
  print("REHEARSAL " + json.dumps(rehearse(experiment, root), default=str), flush=True)
