"""What moves a table's numbers between machines: the SFT start and an RL arm under different
XLA:CPU code paths on one host.

Command:  python -m experiments.portability [--steps N] [--out DIR]   (default out:
          results/portability; about 15 minutes on 2 CPU cores)

Each variant runs in its own process with its own ``XLA_FLAGS`` (read once, when jax starts):

* ``default``: this CPU's full instruction set;
* ``avx2``: ``--xla_cpu_max_isa=AVX2``, the code XLA:CPU generates for a CPU without AVX-512
  (the project's hosts have been AMD EPYC with AVX-512 and Intel Xeon);
* ``default-again``: ``default`` once more, to show what one machine and program repeat.

Per variant: (1) the SFT start retrained from the testbed recipe (``experiments/testbeds``
"b23-sft", never from a cache): its content digest, its largest weight difference from
``default``'s, and its step-0 evaluation (the ACE table's: 200 test problems x 64 samples);
(2) from the *pinned* start, the ACE table's GRPO arm for ``--steps`` steps at 2 seeds: the
digest of the trained weights and pass@1 after training. Outputs ``results.json`` and
``table.md`` in ``--out``.

Other hosts: ``bash scripts/portability_host.sh DIR`` runs the same variant there (on the CPU,
and on the GPU at JAX's default f32 matmul precision and at "highest" where one is present);
``python -m experiments.portability --add-host DIR --label NAME`` adds its rows to ``--out``,
the SFT weights compared with the pinned start's.

Another code version: ``python -m experiments.portability --old-code COMMIT`` retrains the SFT
start with the code of ``COMMIT`` (extracted with ``git archive`` into a temporary folder, never
checked out here), on this host, evaluates it as the ACE table does and compares its weights with
the pin's. For a commit whose ACE design loads the pin it runs that commit's own ``default``
variant: the SFT rebuild and the GRPO arm from the pin, whose weights it compares with the
``default`` variant's, so the RL arm is measured on two code versions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

VARIANTS = {"default": "", "avx2": "--xla_cpu_max_isa=AVX2", "default-again": ""}
# The report's parts that --add-host and --old-code add (a rerun of the variants keeps them).
ADDED = ("hosts", "host_notes", "old_code")
SEEDS = (0, 1)


def _one(steps: int, out_dir: str, name: str) -> dict:
  """In the variant's process: the SFT rebuild, its evaluation, and the RL arm from the pin."""
  import jax

  from experiments import ace, harness, rl_seeds, testbeds
  from rlpost.train import pinned, rl

  t0 = time.perf_counter()
  start = testbeds.build("b23-sft", log=lambda s: None)
  sz = ace.design(False)
  arm = dict(ace.base_config(sz), **ace.arms(sz)["grpo"])
  ev = dict(num_problems=sz.eval_problems, num_samples=sz.eval_samples)
  # The rebuilt start, evaluated as the ACE table evaluates its step 0.
  rebuilt = pinned.save(start, out_dir, name)
  trainer = rl.make_train(dict(arm, init_params=rebuilt), log=lambda s: None)
  sft_eval = trainer.evaluate(trainer.init_state().params, **ev)
  # The GRPO arm from the pinned start (as rl_seeds.run_arm trains it).
  trainer = rl.make_train(dict(arm, steps=steps), log=lambda s: None)
  states = rl_seeds.stack_states(trainer, list(SEEDS))
  step = rl_seeds.vmapped_step(trainer, states)
  for _ in range(steps):
    states, _ = step(states)
  params = jax.device_get(states.params)
  pass1 = [trainer.evaluate(rl_seeds.unstack(params, i), **ev)["pass@1"]
           for i in range(len(SEEDS))]
  return {"sft_digest": pinned.digest(start), "sft_eval": {k: sft_eval[k] for k in
                                                           ("pass@1", "pass@64")},
          "rl_digest": pinned.digest(params), "rl_pass1": pass1, "sft_file": rebuilt,
          "seconds": time.perf_counter() - t0, "machine": harness.machine()}


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--steps", type=int, default=20)
  ap.add_argument("--out", default=os.path.join(ROOT, "results", "portability"))
  ap.add_argument("--add-host", metavar="DIR",
                  help="add the rows that scripts/portability_host.sh wrote in DIR")
  ap.add_argument("--label", help="the added host's name in the table (with --add-host)")
  ap.add_argument("--note", default="", help="a sentence on the added host (with --add-host)")
  ap.add_argument("--old-code", metavar="COMMIT",
                  help="retrain the SFT start (and, for a commit with the pin, run the RL arm "
                       "from it) with that commit's code on this host")
  ap.add_argument("--variant", help=argparse.SUPPRESS)
  ap.add_argument("--dir", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.variant:  # a child process: print the record as the last line
    print(json.dumps(_one(args.steps, args.dir, args.variant)))
    return {}
  if args.add_host:
    return add_host(args.add_host, args.label, args.out, args.note)
  if args.old_code:
    return old_code(args.old_code, args.out)
  from experiments import harness
  from rlpost import paths

  paths.check_writable(args.out, "--out")
  os.makedirs(args.out, exist_ok=True)
  rows, files = {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    for name, flags in VARIANTS.items():
      env = dict(os.environ, XLA_FLAGS=" ".join(x for x in (os.environ.get("XLA_FLAGS", ""),
                                                            flags) if x))
      out = subprocess.run([sys.executable, "-m", "experiments.portability", "--variant", name,
                            "--dir", tmp, "--steps", str(args.steps)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=3600)
      if out.returncode:
        raise RuntimeError(f"variant {name} failed: {out.stderr[-2000:]}")
      rows[name] = dict(json.loads(out.stdout.strip().splitlines()[-1]), xla_flags=flags)
      files[name] = rows[name].pop("sft_file")
      rows[name]["sft_max_abs_diff_vs_default"] = _max_abs_diff(files[name], files["default"])
      print(f"{name}: {rows[name]['sft_digest']} sft pass@1 "
            f"{rows[name]['sft_eval']['pass@1']:.4f}", flush=True)
  report = {"experiment": "portability", "command": "python -m experiments.portability"
            + (f" --steps {args.steps}" if args.steps != 20 else ""), "steps": args.steps,
            "seeds": list(SEEDS), "variants": rows, "machine": harness.machine()}
  # What --add-host and --old-code added stays: they were measured elsewhere or separately.
  if os.path.isfile(os.path.join(args.out, "results.json")):
    before = _read(args.out)
    report.update({k: before[k] for k in ADDED if k in before})
  return _save(report, args.out)


def _read(out: str) -> dict:
  path = os.path.join(out, "results.json")
  if not os.path.isfile(path):
    raise ValueError(f"{path} does not exist: run python -m experiments.portability first")
  with open(path) as f:
    return json.load(f)


def _save(report: dict, out: str) -> dict:
  from experiments import harness

  harness.write_json(os.path.join(out, "results.json"), report)
  text = render(report)
  harness._write_text(os.path.join(out, "table.md"), text)
  print(text)
  return report


def _max_abs_diff(path: str, pin_path: str) -> float:
  """The largest absolute difference between the leaves of ``path`` and the pin's, leaf by leaf
  by name (ValueError when their names or shapes differ)."""
  import numpy as np

  from rlpost.train import pinned

  a, pin = pinned.read(path), pinned.read(pin_path)
  if set(a) != set(pin) or any(a[k].shape != pin[k].shape for k in pin):
    raise ValueError(f"{path}: its leaves are not the pinned start's (names or shapes differ)")
  return float(max(np.max(np.abs(a[k].astype(np.float64) - pin[k])) for k in pin))


def add_host(host_dir: str, label: str | None, out: str, note: str = "") -> dict:
  """Adds the variants ``scripts/portability_host.sh`` recorded in ``host_dir`` to the report in
  ``out`` as host ``label``, each SFT start compared with the pinned one."""
  from experiments import testbeds

  if not label:
    raise ValueError("--add-host needs --label NAME (the host's name in the table)")
  if not os.path.isdir(host_dir):
    raise ValueError(f"--add-host {host_dir} is not a directory")
  report = _read(out)
  rows = {}
  for name in sorted(os.listdir(host_dir)):
    record_path = os.path.join(host_dir, name, "record.json")
    if not os.path.isfile(record_path):
      continue
    with open(record_path) as f:
      lines = f.read().strip().splitlines()
    try:
      row = json.loads(lines[-1])
      sft_file = row.pop("sft_file")
    except (IndexError, json.JSONDecodeError, KeyError, AttributeError):
      raise ValueError(f"{record_path}: its last line is not a variant's record (did the variant "
                       "finish? see err.txt beside it)") from None
    npz = os.path.join(host_dir, name, os.path.basename(sft_file))
    row["sft_max_abs_diff_vs_pin"] = _max_abs_diff(npz, testbeds.path("b23-sft"))
    rows[name] = row
  if not rows:
    raise ValueError(f"{host_dir} holds no VARIANT/record.json")
  report.setdefault("hosts", {})[label] = rows
  report.setdefault("host_notes", {})[label] = note
  return _save(report, out)


# Run in the old tree (its own rlpost first on sys.path): the ACE design's SFT start, retrained
# by that commit's warm start, its step-0 evaluation, and its leaves saved for the comparison.
_OLD_CODE_CHILD = """
import json, sys, tempfile, time
import jax, numpy as np
from experiments import ace
from rlpost.train import rl
t0 = time.perf_counter()
sz = ace.design(False)
arm = (ace.arm_config(ace.base_config(sz), None, kl_coef=0.0) if hasattr(ace, "arm_config")
       else dict(ace.base_config(sz), **ace.arms(sz)["grpo"]))
if arm.get("init_params"):
  sys.exit(3)  # this commit's ACE design loads a pinned start: nothing to retrain
with tempfile.TemporaryDirectory() as cache:
  tr = rl.make_train(dict(arm, cache_dir=cache), log=lambda s: None)
  params = jax.device_get(tr.init_state().params)
  ev = tr.evaluate(params, num_problems=sz.eval_problems, num_samples=sz.eval_samples)
np.savez(sys.argv[1], **{jax.tree_util.keystr(k): np.asarray(v)
                         for k, v in jax.tree_util.tree_flatten_with_path(params)[0]})
print(json.dumps({"sft_eval": {"pass@1": ev["pass@1"], "pass@64": ev["pass@64"]},
                  "seconds": time.perf_counter() - t0}))
"""


def old_code(commit: str, out: str) -> dict:
  """Adds to the report in ``out`` the SFT start that ``commit``'s code retrains on this host,
  compared leaf by leaf with the pin; for a commit whose ACE design loads the pin, that commit's
  own ``default`` variant (the SFT rebuild and the GRPO arm from the pin), its RL weights compared
  with the report's ``default`` variant (another code version, the same program's arithmetic)."""
  import numpy as np

  from experiments import harness, testbeds
  from rlpost.train import pinned

  report = _read(out)
  full = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                        cwd=ROOT, capture_output=True, text=True)
  if full.returncode:
    raise ValueError(f"--old-code {commit}: not a commit of this repository")
  full_sha = full.stdout.strip()
  sha = full_sha[:7]
  with tempfile.TemporaryDirectory() as tmp:
    tree = os.path.join(tmp, "tree")
    os.makedirs(tree)
    archive = subprocess.run(["git", "archive", full_sha], cwd=ROOT, capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    leaves = os.path.join(tmp, "sft.npz")
    env = dict(os.environ, HOME=os.path.join(tmp, "home"), PYTHONPATH=tree)
    run = subprocess.run([sys.executable, "-c", _OLD_CODE_CHILD, leaves], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=3600)
    if run.returncode == 3:  # a commit with the pin: its own variant, SFT rebuild and RL arm
      run = subprocess.run([sys.executable, "-m", "experiments.portability", "--variant",
                            "default", "--dir", tmp, "--steps", str(report["steps"])], cwd=tree,
                           env=env, capture_output=True, text=True, timeout=3600)
      if run.returncode:
        raise RuntimeError(f"commit {sha}'s portability variant failed: {run.stderr[-2000:]}")
      row = json.loads(run.stdout.strip().splitlines()[-1])
      row.pop("sft_file", None)
      row.pop("machine", None)
      # The pinned file's name is its content digest: equal digests are equal weights.
      row["bitwise_equal_to_pin"] = row["sft_digest"] == testbeds.PINNED["b23-sft"]
      default = report["variants"]["default"]
      row["rl_bitwise_equal_to_default"] = row["rl_digest"] == default["rl_digest"]
    elif run.returncode:
      raise RuntimeError(f"commit {sha}'s SFT retraining failed: {run.stderr[-2000:]}")
    else:
      row = json.loads(run.stdout.strip().splitlines()[-1])
      old, pin = pinned.read(leaves), pinned.read(testbeds.path("b23-sft"))
      row["bitwise_equal_to_pin"] = set(old) == set(pin) and all(
          old[k].dtype == pin[k].dtype and np.array_equal(old[k], pin[k]) for k in pin)
  row["machine"] = harness.machine()
  report.setdefault("old_code", {})[sha] = row
  return _save(report, out)


def render(report: dict) -> str:
  from experiments import harness

  rows = report["variants"]
  lines = ["# What moves between machines", "",
           f"`{report['command']}` on {harness.machine_text(report['machine'])}, commit "
           f"{report['machine'].get('commit')}. SFT: the b23-sft recipe retrained (500 steps); "
           f"RL: the ACE table's GRPO arm from the pinned start, {report['steps']} steps, seeds "
           f"{', '.join(map(str, report['seeds']))}.", "",
           "| variant | XLA flags | SFT digest | max abs weight diff vs default | SFT pass@1 | "
           "SFT pass@64 | RL weights digest | RL pass@1 per seed | minutes |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, r in rows.items():
    lines.append(f"| {name} | `{r['xla_flags'] or '-'}` | {r['sft_digest']} | "
                 f"{r['sft_max_abs_diff_vs_default']:.3g} | {r['sft_eval']['pass@1']:.4f} | "
                 f"{r['sft_eval']['pass@64']:.4f} | {r['rl_digest']} | "
                 f"{', '.join(f'{x:.4f}' for x in r['rl_pass1'])} | {r['seconds'] / 60:.1f} |")
  for label, rows in report.get("hosts", {}).items():
    lines += ["", f"## Host {label}", "",
              f"`bash scripts/portability_host.sh DIR`, then `python -m experiments.portability "
              f"--add-host DIR --label {label}`: the same SFT recipe and RL arm, each variant in "
              "its own process. GPU variants: JAX's default f32 matmul precision (`gpu`) and "
              "`JAX_DEFAULT_MATMUL_PRECISION=highest`. "
              + report.get("host_notes", {}).get(label, ""), "",
              "| variant | machine | SFT digest | max abs weight diff vs the pin | SFT pass@1 | "
              "SFT pass@64 | RL weights digest | RL pass@1 per seed | minutes |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
      m = r["machine"]
      lines.append(f"| {name} | {harness.machine_text(m)}, commit {m.get('commit')} | "
                   f"{r['sft_digest']} | {r['sft_max_abs_diff_vs_pin']:.3g} | "
                   f"{r['sft_eval']['pass@1']:.4f} | {r['sft_eval']['pass@64']:.4f} | "
                   f"{r['rl_digest']} | {', '.join(f'{x:.4f}' for x in r['rl_pass1'])} | "
                   f"{r['seconds'] / 60:.1f} |")
  if report.get("old_code"):
    default = report["variants"].get("default", {})
    lines += ["", "## Other code versions on this host", "",
              "`python -m experiments.portability --old-code COMMIT`: the ACE design's SFT "
              "start retrained by that commit's code; for a commit with the pin, also its GRPO "
              f"arm from the pin ({report['steps']} steps, the variants' seeds), whose weights "
              "are compared with the `default` variant's (commit "
              f"{default.get('machine', {}).get('commit', '?')}).", "",
              "| commit | machine | SFT pass@1 | SFT pass@64 | SFT weights bitwise equal to the "
              "pin | RL weights digest | RL pass@1 per seed | RL weights bitwise equal to "
              "default's | minutes |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for sha, r in report["old_code"].items():
      rl_cells = ("-", "-", "-") if "rl_digest" not in r else (
          r["rl_digest"], ", ".join(f"{x:.4f}" for x in r["rl_pass1"]),
          "yes" if r["rl_bitwise_equal_to_default"] else "no")
      lines.append(f"| {sha} | {harness.machine_text(r['machine'])} | "
                   f"{r['sft_eval']['pass@1']:.4f} | {r['sft_eval']['pass@64']:.4f} | "
                   f"{'yes' if r['bitwise_equal_to_pin'] else 'no'} | {' | '.join(rl_cells)} | "
                   f"{r['seconds'] / 60:.1f} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  from rlpost.cli import run_main

  run_main(main)
