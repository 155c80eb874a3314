"""Convert a paper's dataset from local files into the project's record format.

    python scripts/prepare_data.py NAME SRC [SRC ...] --out DIR [--split SPLIT]

NAME is a converter (``rlpost.tasks.convert.CONVERTERS``): gsm8k, math, math500, aime,
dapo_math_17k, dars, verl. SRC is a .parquet, .jsonl or .json file in the source's published
layout, or a directory of them. Each split is written to ``DIR/<split>.jsonl`` with
``DIR/<split>.manifest.json`` beside it (source hashes, counts, fields kept, rows dropped). For
example, ACE's data:

    python scripts/prepare_data.py dapo_math_17k /data/dapo-math-17k.parquet --out data/dapo_math_17k
    python scripts/prepare_data.py math500 /data/MATH-500/test.jsonl --out data/math500

then ``task_spec='{"train": "data/dapo_math_17k/train.jsonl", "test": "data/math500/test.jsonl"}'``.
Nothing is downloaded and nothing is overwritten; a bad row is one line naming the file and the
row, exit status 2, and no file written.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost.cli import run_main  # noqa: E402
from rlpost.tasks import convert  # noqa: E402


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("name", help=f"the converter: {', '.join(sorted(convert.CONVERTERS))}")
  ap.add_argument("src", nargs="+", help="source files or directories, in the published layout")
  ap.add_argument("--out", required=True, help="the directory to write <split>.jsonl into")
  ap.add_argument("--split", help="the split of every source (default: from each file's name)")
  dd = ap.add_mutually_exclusive_group()
  dd.add_argument("--dedupe", dest="dedupe", action="store_true", default=None,
                  help="drop repeated problems, keeping the first (dapo_math_17k's default)")
  dd.add_argument("--keep-duplicates", dest="dedupe", action="store_false",
                  help="keep repeated problems")
  args = ap.parse_args(argv)
  convert.prepare(args.name, args.src, args.out, split=args.split, dedupe=args.dedupe)


if __name__ == "__main__":
  run_main(main)
