"""Export a run to a Hugging Face directory (config.json, model.safetensors, tokenizer files).

    python scripts/export.py runs/x --out exports/x                 # the latest checkpoint
    python scripts/export.py runs/x --out exports/x --step 200
    python scripts/export.py runs/x --out exports/x --average lawa:k=5,every=100

RUN_DIR is a run directory of scripts/train.py (config.json, checkpoints/). ``--average`` takes an
averaging spec of ``RLConfig.averaging`` (``lawa:k=K[,every=N]``, ``swa:start=S[,every=N]``,
``ema:decay=D[,every=N]``), each checkpoint counting as one snapshot. A run with ``policy=PATH``
keeps PATH's architecture, bos/eos/pad ids and tokenizer files (PATH must still exist); a
character-model run becomes a Llama model with a character-level tokenizer.json. Then:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("exports/x")
    tok = AutoTokenizer.from_pretrained("exports/x")

Every input is checked before anything is read or written; the directory is written beside
``--out`` and renamed into place at the end. See ``rlpost.train.export``.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlpost.cli import run_main  # noqa: E402
from rlpost.train import export  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.json, checkpoints/)")
  ap.add_argument("--out", required=True, help="the Hugging Face directory to write")
  ap.add_argument("--step", type=int, help="the checkpoint to export (default: the latest)")
  ap.add_argument("--average", metavar="SPEC",
                  help="export the average of the run's checkpoints, e.g. lawa:k=5,every=100")
  ap.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
  ap.add_argument("--no-progress", action="store_true")
  return ap


def main(argv=None):
  args = build_parser().parse_args(argv)
  return export.export_run(args.run_dir, args.out, step=args.step, average=args.average,
                           overwrite=args.overwrite, progress=not args.no_progress)


if __name__ == "__main__":
  run_main(main)
