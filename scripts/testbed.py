"""Pinned testbeds: the committed starting policies and datasets of the paper tables
(experiments/testbeds).

    python scripts/testbed.py list                 # each testbed, its pinned digest and file
    python scripts/testbed.py verify               # every pinned file loads and matches its digest
    python scripts/testbed.py build b23-sft        # retrain from the recipe; prints the digest
    python scripts/testbed.py build kdv1d-data0    # integrate the dataset again; likewise

``build`` makes the testbed again from its recipe (an SFT start retrained, a dataset integrated
again; never from a cache), writes
``<name>-<digest>.npz`` and ``<name>-<digest>.json`` (the recipe, the machine, the commit and
the seconds it took) into ``--out`` (default experiments/testbeds) and prints the digest. It never
replaces a file: the same digest means the same content. The tables keep loading the digest in
``experiments.testbeds.PINNED`` until that line is edited.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost.cli import run_main  # noqa: E402


def cmd_list(args) -> int:
  from experiments import testbeds

  for name in testbeds.names():
    if name not in testbeds.PINNED:
      print(f"{name}: none pinned (python scripts/testbed.py build {name})")
      continue
    p = testbeds.path(name)
    state = "present" if os.path.isfile(p) else "MISSING"
    print(f"{name}: digest {testbeds.PINNED[name]} {os.path.relpath(p, ROOT)} ({state})")
  return 0


def cmd_verify(args) -> int:
  from experiments import testbeds

  for name in sorted(testbeds.PINNED):
    testbeds.load(name)
    print(f"{name}: {os.path.relpath(testbeds.path(name), ROOT)} matches digest "
          f"{testbeds.PINNED[name]}")
  return 0


def cmd_build(args) -> int:
  from experiments import harness, testbeds
  from rlpost import paths
  from rlpost.train import pinned

  if args.name not in testbeds.names():
    raise ValueError(f"no testbed {args.name!r}; known: {testbeds.names()}")
  paths.check_writable(args.out, "--out")
  recipe = testbeds.RECIPES.get(args.name) or testbeds.DATA[args.name]
  t0 = time.perf_counter()
  params = testbeds.build(args.name, print, progress=not args.no_progress)
  seconds = time.perf_counter() - t0
  path = pinned.save(params, args.out, args.name)
  digest = pinned.parse_name(path)[1]
  manifest = os.path.splitext(path)[0] + ".json"
  if not os.path.exists(manifest):
    harness.write_json(manifest, {"testbed": args.name, "digest": digest, "recipe": recipe,
                                  "seconds": seconds, "machine": harness.machine()})
  same = digest == testbeds.PINNED.get(args.name)
  print(f"{args.name}: digest {digest} -> {os.path.relpath(path, ROOT)} ({seconds:.0f} s)"
        + (" (the pinned one)" if same else
           f"; the tables load {testbeds.PINNED.get(args.name) or 'no pinned file'} until "
           f"experiments/testbeds/__init__.py PINNED[{args.name!r}] is set to it"))
  return 0


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  sub.add_parser("list", help="the testbeds and their pinned files")
  sub.add_parser("verify", help="load every pinned file and check its digest")
  b = sub.add_parser("build", help="retrain a testbed from its recipe and print its digest")
  b.add_argument("name")
  b.add_argument("--out", default=os.path.join(ROOT, "experiments", "testbeds"))
  b.add_argument("--no-progress", action="store_true")
  args = ap.parse_args(argv)
  {"list": cmd_list, "verify": cmd_verify, "build": cmd_build}[args.cmd](args)


if __name__ == "__main__":
  run_main(main)
