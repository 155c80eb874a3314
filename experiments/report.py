"""How a paper table is written: verdict rows and the notes beside them (rules, protocol, seeds,
wall time), cells with their intervals, and the machine and provenance a table records.

``experiments/harness.py`` writes every table with these; the tables' own renderers use them
for their sections.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import binom

from experiments.claims import Verdict
from rlpost.eval import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def verdict_rows(verdicts: Sequence[Verdict], digits: int = 3) -> list[str]:
  """Markdown table rows: claim | a - b [interval] | smallest effect of interest | p (Holm) |
  permutation p | seeds | minimum detectable effect | declared in | verdict (``Verdict`` objects
  or their ``to_json`` dicts; results judged before protocol v2 have no sesoi or declaring
  commit, shown as "-")."""
  rows = ["| claim (paper) | ours: a - b [interval] | SESOI | p (Holm) | permutation p | seeds | "
          "min. detectable | declared | verdict |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for v in verdicts:
    v = v if isinstance(v, dict) else v.to_json()
    c = v["claim"]
    one = len(c["arms"]) == 1
    label = f"{c['arms'][0]} - {c.get('center', 0.0):g}" if one else c["arms"][0]
    seeds = f"{v['n'][0]}" if one else f"{v['n'][0]} vs {v['n'][1]}"
    verdict = v["verdict"] + (f"; {v['note']}" if v.get("note") else "")
    rows.append(f"| {c['text']} | {label}: {v['diff']:+.{digits}f} "
                f"[{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}] | {sesoi_text(c)} | {v['p']:.3g} "
                f"({v['p_holm']:.3g}) | {v['p_permutation']:.3g} | {seeds} | "
                f"{v['mde']:.{digits}f} | {declared_text(c)} | {verdict} |")
  return rows


def sesoi_text(claim: Mapping) -> str:
  """A claim's smallest effect of interest for a table cell: +-margin for an equivalence claim,
  "-" when not recorded (judged before protocol v2)."""
  if claim.get("direction") == "equivalent":
    return f"+-{claim['margin']:g}"
  sesoi = claim.get("sesoi")
  return f"{sesoi:g}" if sesoi else "-" if sesoi is None else "0"


def declared_text(claim: Mapping) -> str:
  """A claim's declaring commit for a table cell ("-" when not recorded), marked exploratory."""
  return (claim.get("declared") or "-") + (" (exploratory)" if claim.get("exploratory") else "")


def rules_note(verdicts: Sequence[Verdict | dict], level: float = 0.95) -> str:
  """The decision rules of the judged claims, in words, for a table."""
  vs = [v if isinstance(v, dict) else v.to_json() for v in verdicts]
  alpha = 1 - level
  out = []
  directional = [v["claim"] for v in vs if v["claim"]["direction"] in ("greater", "less")]
  if directional:
    out.append(f"a directional claim is *reproduced* when its Holm-adjusted one-sided p is <= "
               f"{alpha:.2g} and it is not "
               "equivalent to the threshold within +-SESOI (TOST, "
               f"{1 - 2 * alpha:.0%} interval), *trivial* when it is significant but equivalent "
               "(too small to matter), *not reproduced* when it is equivalent but not "
               "significant or its interval lies wholly on the other side, *inconclusive* "
               "otherwise (SESOI 0: the threshold is itself the effect of interest, no "
               "*trivial* outcome)")
  if any(v["claim"]["direction"] == "not_greater" for v in vs):
    out.append(f"a no-gain claim is *reproduced* when the one-sided test that a - b < +SESOI "
               f"rejects (Holm-adjusted), *not reproduced* when its {level:.0%} interval lies "
               "wholly above +SESOI, *inconclusive* otherwise")
  equivalent = sorted({v["claim"]["margin"] for v in vs
                       if v["claim"]["direction"] == "equivalent"})
  if equivalent:
    m = "/".join(f"{x:g}" for x in equivalent)
    out.append(f"an equivalence claim (margin {m}) is *reproduced* when TOST rejects "
               f"(Holm-adjusted), *not reproduced* when its {1 - 2 * alpha:.0%} interval lies "
               "wholly outside the margin, *inconclusive* otherwise")
  if not out:
    return ""
  return ("Rules (protocol v2, experiments/STATISTICS.md; `experiments/claims.py`): "
          + "; ".join(out) + ". An equivalence claim whose difference is significantly "
          "non-zero (95% interval), whatever its verdict, and a holding no-gain claim whose "
          "difference is, say so beside the verdict, and so does a verdict whose deciding "
          "bound lies within half a minimum detectable effect of its threshold (near its "
          "threshold: it can flip on another start or seed set). The permutation p (not adjusted) "
          "is reported beside the deciding test. Min. detectable: the difference a two-sided "
          "test at 80% power would find at these seeds and this seed SD. Declared: the commit "
          "that declared the claim; exploratory claims were declared after the run that "
          "motivated them and are kept out of the headline.")


def cell(x: Sequence[float], level: float = 0.95) -> dict:
  """{"mean", "lo", "hi", "n"}: the Student-t interval of a per-seed mean (no interval, NaN
  bounds, for a single seed)."""
  x = np.asarray(x, np.float64)
  if x.size < 2:
    return {"mean": float(np.mean(x)), "lo": float("nan"), "hi": float("nan"), "n": int(x.size)}
  m, lo, hi = stats.mean_interval(x, level=level, method="t")
  return {"mean": float(m), "lo": float(lo), "hi": float(hi), "n": int(x.size)}


def diff_cell(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
  """{"mean", "lo", "hi", "n", "signed"}: mean(a) - mean(b) of unpaired arms with its Welch
  interval (NaN bounds below 2 seeds per arm)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if min(a.size, b.size) < 2:
    return {"mean": float(a.mean() - b.mean()), "lo": float("nan"), "hi": float("nan"),
            "n": int(min(a.size, b.size)), "signed": True}
  d, lo, hi = stats.diff_interval(a, b, level=level, method="welch")
  return {"mean": float(d), "lo": float(lo), "hi": float(hi), "n": int(min(a.size, b.size)),
          "signed": True}


def pooled_sd(verdicts: Sequence[Verdict | dict]) -> float:
  """The largest pooled seed SD among ``verdicts`` (the pilot SD a table reports)."""
  sds = [(v if isinstance(v, dict) else v.to_json())["sd"] for v in verdicts]
  return max(sds) if sds else float("nan")


def protocol_note(verdicts: Sequence[Verdict | dict], level: float = 0.95) -> str:
  """One paragraph for a table: the interval method, the seed counts, the pooled seed SD and the
  minimum detectable effect of the judged claims."""
  vs = [v if isinstance(v, dict) else v.to_json() for v in verdicts]
  if not vs:
    return ""
  seeds = sorted({n for v in vs for n in v["n"]})
  methods = sorted({v["method"] for v in vs})
  mdes = [v["mde"] for v in vs]
  return (f"Statistics: {'; '.join(methods)} at {level:.0%}, Holm-adjusted within each family; "
          f"{'/'.join(str(s) for s in seeds)} seeds per arm; pooled seed SD up to "
          f"{pooled_sd(vs):.3g}; minimum detectable effect (80% power) "
          f"{min(mdes):.3g}-{max(mdes):.3g}.")


def proportions_rows(r: Mapping, rates: Sequence[float], trials: str = "trials") -> list[str]:
  """The markdown table of a ``claims.judge_proportions`` verdict ``r``: the claim, a - b with its
  interval and the two arms' ``rates``, z, p, each arm's ``trials`` and the verdict."""
  a = r["claim"]["arms"][0]
  return [f"| claim (paper) | ours: a - b [interval] | z | p | {trials} | verdict |",
          "| --- | --- | --- | --- | --- | --- |",
          f"| {r['claim']['text']} | {a}: {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
          f"({rates[0]:.3f} vs {rates[1]:.3f}) | {r['z']:.2f} | {r['p']:.3g} | "
          f"{r['n'][0]} vs {r['n'][1]} | {r['verdict']} |"]


def proportions_note(r: Mapping, what: str, source: str, trials: str, shared: str) -> str:
  """The paragraph under ``proportions_rows``: ``what`` the claim compares (a minus b, from
  ``source``), its test and rule, and that it treats ``trials`` as independent, which ``shared``
  are not."""
  c = r["claim"]
  a, b = c["arms"]
  greater = c["direction"] == "greater"
  bound = (c.get("margin") or 0.0) * (1 if greater else -1)
  return (f"{what} ({a} minus {b}, {source}): a one-sided two-proportion z-test "
          "(``claims.judge_proportions``), reproduced when p <= 0.05 and the 95% interval lies "
          f"{'above' if greater else 'below'} {f'{bound:g}' if bound else '0'}, not "
          f"Holm-adjusted. It treats {trials} as independent, which {shared} are not: a lenient "
          "test.")


def seeds_note(sz, from_power: int) -> str:
  """The table header's seed sentence for a design ``sz`` with ``seeds``, ``pilot_sd``,
  ``min_effect`` and ``min_seeds`` (and ``sd_source`` when the SD is not the CPU pilot's): the
  seeds run and the count the power analysis asked for, and a warning when fewer ran."""
  source = getattr(sz, "sd_source", "")
  sd = f"SD {sz.pilot_sd} ({source})" if source else f"pilot SD {sz.pilot_sd}"
  short = (f"; UNDERPOWERED: {sz.seeds} < {from_power} seeds, judged under "
           "--allow-underpowered" if source and sz.seeds < from_power else "")
  return (f"{sz.seeds} seeds per arm ({from_power} from power: {sd}, minimum "
          f"effect {sz.min_effect}, 80% power, alpha 0.05; floor {sz.min_seeds}{short})")


def wall_time(report: Mapping) -> str:
  """The table header's wall-time sentence: the units' training and evaluation time, or, for
  full-size runs, that the run directories do not record it."""
  if report.get("unit_seconds") is None:
    return "Wall time: not recorded in the full-size run directories."
  jobs = int(report.get("jobs") or 1)
  workers = (f" with {jobs} worker processes, each on its own share of the cores"
             if jobs > 1 else "")
  return (f"Wall time: {report['unit_seconds'] / 60:.1f} min of training and evaluation over "
          f"all arms (this invocation {report['seconds'] / 60:.1f} min{workers}; cached arms "
          f"are not rerun). {provenance_note(report)}")


def provenance_note(report: Mapping) -> str:
  """Where a table's numbers come from: the machine, the commit and the start."""
  m = report.get("machine") or {}
  commit = m.get("commit") or "?"
  if m.get("dirty"):
    commit += " with uncommitted changes"
  beds = report.get("testbeds")
  if beds:
    start = "the pinned testbed " + ", ".join(beds) + " (experiments/testbeds)"
  elif beds is None:
    start = "an SFT start retrained on that machine (results older than pinned testbeds)"
  else:
    start = "starts made within the run (nothing pinned: seeded initialisation, generated data)"
  return f"Run on {machine_text(m)} at commit {commit}, from {start}."


def machine_text(machine: Mapping | None) -> str:
  """'AMD EPYC 7B13, 2 CPU cores, jax 0.10.2 on cpu' from a results.json ``machine`` record."""
  if not machine or machine.get("recorded") is False:
    return "a machine not recorded"
  jax_version = machine.get("versions", {}).get("jax", "?")
  cpu = machine.get("cpu_model") or f"{machine.get('processor', '?')} (CPU model not recorded)"
  isa = isa_text(machine.get("cpu_isa"))
  cpu += f" ({isa})" if isa else ""
  return (f"{cpu}, {machine.get('cpus', '?')} CPU cores, jax {jax_version} on "
          f"{machine.get('platform', '?')}")


def minutes(seconds: float | None) -> str:
  return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds / 60:.1f}"


def fmt_fraction(f: Mapping) -> str:
  """A ratio with its interval and method (``rl_table.gap_fraction``): "+0.10 [-0.25, +0.36]
  (method)"."""
  return f"{f['fraction']:+.2f} [{f['lo']:+.2f}, {f['hi']:+.2f}] ({f['method']})"


def fmt(c: Mapping | None, digits: int = 3) -> str:
  """A ``cell``/``diff_cell`` as '0.123 [0.100, 0.140]' ('+' signs for a difference; the mean
  alone without an interval)."""
  if c is None:
    return "—"
  lo = c.get("lo")
  if lo is None or (isinstance(lo, float) and math.isnan(lo)):
    return f"{c['mean']:.{digits}f}"
  sign = "+" if c.get("signed") else ""
  return (f"{c['mean']:{sign}.{digits}f} [{c['lo']:{sign}.{digits}f}, "
          f"{c['hi']:{sign}.{digits}f}]")


def errorbars(ax, x: Sequence[float], cells: Sequence[Mapping], **kw):
  """Plot per-seed ``cell``s (mean and interval) against ``x`` with error bars; a cell without an
  interval (one seed) is drawn as a point."""
  m = np.array([c["mean"] for c in cells], np.float64)
  lo = np.array([c["lo"] if c.get("lo") is not None else np.nan for c in cells], np.float64)
  hi = np.array([c["hi"] if c.get("hi") is not None else np.nan for c in cells], np.float64)
  err = np.stack([np.nan_to_num(m - lo), np.nan_to_num(hi - m)])
  kw.setdefault("marker", "o")
  kw.setdefault("capsize", 3)
  return ax.errorbar(np.asarray(x), m, yerr=err, **kw)


def replication_markdown(name: str, committed: Mapping, new: Mapping, rows: list[dict],
                         command_line: str, digits: int = 3, scope: str | None = None,
                         wall: str | None = None) -> str:
  """``replication.md``: what was rerun where, and per claim committed vs new. ``scope``: what
  the runs share, so what the comparison tests (default: the RL tables' fixed test problems and
  evaluation key); ``wall``: the replication's wall-time sentence (default ``wall_time``)."""
  def iv(v):
    return f"{v['diff']:+.{digits}f} [{v['lo']:+.{digits}f}, {v['hi']:+.{digits}f}]"

  agree = sum(r["agree"] for r in rows)
  nc, nn = committed.get("config", {}), new.get("config", {})
  lines = [f"# Replication of `{name}`", "",
           f"`{command_line}`: the table's main arms rerun "
           f"{'from its pinned testbeds' if new.get('testbeds') else 'from their seeded start'} "
           "with "
           f"{nn.get('seeds')} fresh seeds (from {nn.get('seed_offset', 0)}; the committed table "
           f"used {nc.get('seeds')} seeds from {nc.get('seed_offset', 0)}).", "",
           f"- Committed: commit {committed.get('machine', {}).get('commit', '?')} on "
           f"{machine_text(committed.get('machine'))}; testbeds "
           f"{', '.join(committed.get('testbeds') or ['not pinned'])}.",
           f"- Replication: commit {new.get('machine', {}).get('commit', '?')} on "
           f"{machine_text(new.get('machine'))}; testbeds "
           f"{', '.join(new.get('testbeds') or ['not pinned'])}. {wall or wall_time(new)}", "",
           f"{agree} of {len(rows)} claims agree: the same verdict, and the change of a - b "
           "between the runs (Welch-Satterthwaite over both runs' seeds, two-sided) not "
           "significant at 0.05.", "",
           "| claim | SESOI | declared | committed a - b [95%] | verdict | replication a - b "
           "[95%] | verdict | committed - replication [95%] | p | agree | both pooled [95%] |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

  def verdict(v):
    return v["verdict"] + (f"; {v['note']}" if v.get("note") else "")

  for r in rows:
    c, n, ch = r["committed"], r["new"], r["change"]
    change = ("-", "-") if ch is None else (iv(ch), f"{ch['p']:.3g}")
    pooled = "-" if r.get("pooled") is None else iv(r["pooled"])
    lines.append(f"| {r['text']} | {sesoi_text(n['claim'])} | {declared_text(n['claim'])} | "
                 f"{iv(c)} | {verdict(c)} | {iv(n)} | {verdict(n)} | {change[0]} | "
                 f"{change[1]} | {'yes' if r['agree'] else 'no'} | {pooled} |")
  lines += ["", chance_note(rows),
            "", "Both pooled: the difference over both runs' seeds as one sample (95%, the "
            "claim's own interval kind), a description chosen after both ran, never a verdict.",
            "", "Verdicts follow protocol v2 (experiments/STATISTICS.md) in both runs, judged by "
            "the table's own rules. Intervals of equivalence claims are their 90% TOST "
            "intervals. " + (scope or "Both runs use the same fixed test problems and evaluation "
                             "key, so the test compares training seeds only.")]
  return "\n".join(lines) + "\n"


def chance_note(rows: list[dict], alpha: float = 0.05) -> str:
  """How many changes were significant against how many chance alone gives: with both runs
  drawn from one distribution each change test rejects with probability ``alpha``; the binomial
  tail treats the claims as independent, which claims sharing an arm are not."""
  tested = [r for r in rows if r["change"] is not None]
  k = sum(r["change"]["p"] <= alpha for r in tested)
  if not tested:
    return "No claim has per-seed values in both runs, so no change was tested."
  if not k:
    return (f"Changes significant at {alpha:g}: 0 of {len(tested)}; chance alone gives "
            f"{alpha * len(tested):.2g} on average.")
  p = float(binom.sf(k - 1, len(tested), alpha))
  text = (f"Changes significant at {alpha:g}: {k} of {len(tested)}; chance alone gives "
          f"{alpha * len(tested):.2g} on average (P(>= {k}) = {p:.2g} were the claims "
          "independent")
  if k == 1:
    return text + ")."
  return text + ("; claims that share an arm move together, which makes several changes at "
                 "once likelier than this P says).")


def cpu_model() -> str:
  """The CPU's model name ('AMD EPYC 7B13', 'Intel(R) Xeon(R) CPU @ 2.20GHz'), or the
  architecture where the system does not say."""
  return _cpuinfo(("model name",)) or platform.processor() or platform.machine()


def _cpuinfo(keys: tuple[str, ...]) -> str:
  """The value of the first /proc/cpuinfo line whose name starts with one of ``keys`` ('' where
  the system has no such file or line)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.lower().startswith(keys):
          return line.split(":", 1)[1].strip()
  except OSError:
    return ""
  return ""


# The vector extensions XLA:CPU may generate code for: two hosts that differ in these run other
# kernels (results/portability: the instruction set alone moves a retrained SFT start).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
             "asimd", "sve", "sve2")


def cpu_isa() -> list[str]:
  """The CPU's vector extensions among ``ISA_FLAGS`` (from /proc/cpuinfo; empty where the system
  does not say)."""
  have = set(_cpuinfo(("flags", "features")).split())
  return [x for x in ISA_FLAGS if x in have]


def isa_text(isa: Sequence[str] | None) -> str:
  """The widest x86 vector extension in ``isa`` ('AVX-512', 'AVX2', 'AVX'), or ''."""
  isa = set(isa or ())
  for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"),
                     ("asimd", "NEON")):
    if flag in isa:
      return name
  return ""


PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy", "scipy",
            "ml_dtypes", "tensorflow-datasets", "array-record", "grain")


def _git(*args: str) -> str:
  try:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ""


def usable_cpus() -> list[int]:
  """The CPU cores this process may run on (its affinity mask; all cores where there is none)."""
  try:
    return sorted(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return list(range(os.cpu_count() or 1))


def machine() -> dict:
  """The machine, environment and code a result was produced with: CPU model and vector
  extensions, cores (and those this process may use), XLA flags and thread settings, package
  versions, the commit and whether the tracked files differed from it."""
  import importlib.metadata as md

  versions = {}
  for pkg in PACKAGES:
    try:
      versions[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
      pass
  import jax

  usable = len(usable_cpus())
  return {"cpu_model": cpu_model(), "cpu_isa": cpu_isa(), "processor": platform.machine(),
          "cpus": os.cpu_count(),
          "cpus_usable": usable, "platform": jax.devices()[0].platform,
          "devices": jax.device_count(),
          "env": {k: os.environ[k] for k in ("XLA_FLAGS", "OMP_NUM_THREADS", "JAX_ENABLE_X64",
                                             "JAX_DEFAULT_MATMUL_PRECISION")
                  if k in os.environ},
          "load_average": list(os.getloadavg()), "python": platform.python_version(),
          "versions": versions, "commit": _git("rev-parse", "--short", "HEAD"),
          "dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}
