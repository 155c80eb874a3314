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
SEEDS = (0, 1)


def _one(steps: int, out_dir: str, name: str) -> dict:
  """In the variant's process: the SFT rebuild, its evaluation, and the RL arm from the pin."""
  import jax

  from experiments import ace, harness, rl_seeds, testbeds
  from rlpost.train import config as config_lib
  from rlpost.train import pinned, rl, setup

  t0 = time.perf_counter()
  recipe = testbeds.RECIPES["b23-sft"]
  with tempfile.TemporaryDirectory() as cache:
    cfg = config_lib.from_dict(rl.RLConfig, dict(recipe, cache_dir=cache))
    start = setup.character_start(cfg, lambda s: None, progress=False)
  sz = ace.sizes(False)
  arm = ace.arm_config(ace.base_config(sz), None, kl_coef=0.0)
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
  ap.add_argument("--variant", help=argparse.SUPPRESS)
  ap.add_argument("--dir", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.variant:  # a child process: print the record as the last line
    print(json.dumps(_one(args.steps, args.dir, args.variant)))
    return {}
  import numpy as np

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
      with np.load(files[name]) as z, np.load(files["default"]) as d:
        rows[name]["sft_max_abs_diff_vs_default"] = float(max(
            np.max(np.abs(z[k].astype(np.float64) - d[k])) for k in d.files))
      print(f"{name}: {rows[name]['sft_digest']} sft pass@1 "
            f"{rows[name]['sft_eval']['pass@1']:.4f}", flush=True)
  report = {"experiment": "portability", "command": "python -m experiments.portability"
            + (f" --steps {args.steps}" if args.steps != 20 else ""), "steps": args.steps,
            "seeds": list(SEEDS), "variants": rows, "machine": harness.machine()}
  harness.write_json(os.path.join(args.out, "results.json"), report)
  text = render(report)
  harness._write_text(os.path.join(args.out, "table.md"), text)
  print(text)
  return report


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
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  from rlpost.cli import run_main

  run_main(main)
