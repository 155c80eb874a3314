"""Layering: experiments and scripts use the trainer's public API only."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"\b(trainer|tr|ref)\._[a-z]\w*")


def test_no_private_trainer_access_outside_rlpost_train():
  hits = []
  for sub in ("experiments", "scripts", "rlpost"):
    for path in (ROOT / sub).rglob("*.py"):
      if path.parent.name == "train" and path.parent.parent.name == "rlpost":
        continue
      for i, line in enumerate(path.read_text().splitlines(), 1):
        if PRIVATE.search(line):
          hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
  assert not hits, "\n".join(hits)

