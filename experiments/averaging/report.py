"""Table-specific helpers of the averaging tables: grouping runs by setting, indices, labels, and
collecting per-seed values for ``harness.Claim`` s.

Shape legend: R runs, E eval points, M methods (index 0 is the raw checkpoint). Losses are excess
losses in nats (cross-entropy above the language's entropy floor); a gain is raw minus method, so a
positive gain means the average is better.
"""

from __future__ import annotations

import numpy as np

from experiments import harness

# The pre-declared metric of every claim in T1-T4: excess loss at the final evaluation.
METRIC = "final excess loss (nats)"


def settings(data: dict) -> list[tuple[str, float]]:
  """(schedule, lr) pairs in run order, each with one run per seed."""
  out = []
  for r in data["runs"]:
    key = (r["schedule"], r["lr"])
    if key not in out:
      out.append(key)
  return out


def run_index(data: dict, schedule: str, lr: float) -> np.ndarray:
  """Run indices of one setting, ordered by seed (so settings pair up seed by seed)."""
  idx = [(r["seed"], i) for i, r in enumerate(data["runs"])
         if r["schedule"] == schedule and r["lr"] == lr]
  return np.asarray([i for _, i in sorted(idx)])


def step_index(data: dict, fraction: float) -> int:
  """Index of the eval step closest to ``fraction`` of training."""
  steps = np.asarray(data["steps"])
  return int(np.argmin(np.abs(steps - fraction * steps[-1])))


def method_index(data: dict, name: str) -> int:
  return data["methods"].index(name)


def gain(raw, method) -> dict:
  """The per-seed gain raw - method of two policies of the same runs: a t interval of the paired
  differences (a signed ``harness.cell``)."""
  return dict(harness.cell(np.subtract(raw, method)), signed=True)


def lr_label(schedule: str, lr: float) -> str:
  return f"{lr:g}" + (" (cosine)" if schedule == "cosine" else "")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


class Claims:
  """Claims of the tables as ``harness.Claim`` data, with the per-seed values they are judged on
  (``values[metric][arm]``, ordered by seed)."""

  def __init__(self, sesoi: float = 0.0):
    self.claims: list[harness.Claim] = []
    self.values: dict[str, dict[str, list[float]]] = {}
    self.sesoi = sesoi  # the design's minimum effect in nats: the SESOI of every loss claim

  def add(self, id: str, text: str, arms: dict, *, direction: str, family: str,
          metric: str = METRIC, margin: float = 0.0, paired: bool = True) -> None:
    """``arms``: {name: per-seed values} for (a, b), in that order. A directional claim on a
    loss in nats gets the design's minimum effect as its SESOI; other metrics (accuracy) have
    none declared (SESOI 0)."""
    for name, v in arms.items():
      self.values.setdefault(metric, {})[name] = [float(x) for x in v]
    sesoi = self.sesoi if "nats" in metric and direction != "equivalent" else 0.0
    self.claims.append(harness.Claim(id, text, metric, tuple(arms), direction, margin, family,
                                     paired, sesoi=sesoi))


def verdict_section(judged: list[dict]) -> list[str]:
  """Table lines of the judged claims (``harness.verdict_rows`` and ``protocol_note``)."""
  if not judged:
    return ["No verdicts: claims need at least 2 seeds.", ""]
  return [*harness.verdict_rows(judged), "", harness.protocol_note(judged), ""]


machine_text = harness.machine_text
