"""The one skeleton of every paper table: the run that produces a table's per-seed values, and
the ways to redo it.

A table is plain functions of plain data (``Experiment``). Its units are cached by the digest of
their spec and of the code they run, so a rerun computes only the missing ones; ``results.json``
keeps the config, the machine, and every per-seed value and evaluation point; ``rejudge``
re-judges it without training, ``replicate`` reruns its main arms at fresh seeds, ``recheck``
retrains committed arms on this machine, and ``run_full`` judges full-size run directories with
the same code; ``experiments/docsync.py`` copies ``table.md`` into the table's README.

What it runs on: ``experiments/claims.py`` (claims as data and their judging),
``experiments/report.py`` (verdict rows, notes, cells, the machine record) and
``experiments/runs.py`` (full-size run directories as the arms of a table). Their names can be
imported from here too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from experiments.claims import (  # noqa: F401
    DIRECTIONS, REPRODUCED, TRIVIAL, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE, OUTCOMES, Claim,
    Verdict, decide, judge_family, GATE, NOT_JUDGED, judge_gated, judge_proportions, DECLARED,
    declarations, declaration, declare, mappings, verdicts_in, compare)
from experiments.report import (  # noqa: F401
    verdict_rows, sesoi_text, declared_text, rules_note, cell, diff_cell, pooled_sd, protocol_note,
    seeds_note, wall_time, provenance_note, machine_text, minutes, fmt, errorbars,
    replication_markdown, chance_note, cpu_model, ISA_FLAGS, cpu_isa, isa_text, PACKAGES, machine,
    usable_cpus)
from experiments.runs import (  # noqa: F401
    RunsError, read_run, run_local_keys, collect_runs, check_identities)
from rlpost import progress as progress_lib
from rlpost.eval import stats


def power_plan(config: Mapping) -> int:
  """Seeds per arm a design's power plan asks for (its ``pilot_sd``, ``min_effect`` and
  ``min_seeds``): the SESOI found with 80% power at alpha 0.05, two-sided."""
  return max(int(config["min_seeds"]),
             stats.seeds_needed(float(config["pilot_sd"]), float(config["min_effect"])))


# --------------------------------------------------------------------- running an experiment
@dataclasses.dataclass(frozen=True)
class Unit:
  """An independent, cacheable piece of an experiment (one arm's seed block, one system x seed).

  Attributes:
    spec: plain data that determines the result; its digest is the cache key, so a unit reruns
      exactly when its spec changes.
    run: ``run(progress)`` computes the result, calling ``progress(n)`` as it advances by ``n`` of
      ``weight``. The result is a dict of JSON values and, at its top level, numpy arrays (stored
      beside the JSON in an ``.npz``).
    weight: the unit's share of the progress bar (e.g. its training steps).
    code: source files the unit runs besides the ``rlpost`` package, the file that defines
      ``run`` and the repository modules those import (all always counted): their content is part
      of the unit's cache key (``code_version``), so a unit reruns when the code it runs changes.
  """

  spec: Mapping
  run: Callable[[Callable[[int], None]], dict]
  weight: int = 1
  code: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A paper table as plain functions of plain data.

  Attributes:
    name: the key of ``scripts/reproduce.py`` and of ``results/<name>``.
    get_config: ``get_config(quick) -> dict`` (big_vision style): seeds, sizes, arms; the key
      ``"seeds"`` is the seed count ``--seeds`` overrides.
    units: ``units(config) -> {unit id: Unit}``.
    summarize: ``summarize(results) -> dict``: per-seed values, judged claims, sanity checks, from
      ``results["config"]`` and ``results["data"]`` alone (so ``--rejudge`` needs no training).
    render: ``render(results) -> str``: ``table.md``; its "## Paper claims" section is what the
      docs carry.
    plot: ``plot(results, out_dir) -> [paths]`` (from ``results`` alone, error bars over seeds).
    collect: ``collect(config, units) -> data``: what ``results.json`` keeps of the unit results
      (every per-seed value and evaluation point); default: the units' JSON parts.
    module: the table's module (dotted name); its README sits beside it unless ``readme``.
    readme: the README holding the generated results between ``docsync`` markers.
    full: ``full(runs_dir, prefix) -> (config, data)``: the full-size runs under ``runs_dir``
      (``collect_runs`` over the ``experiments/*/full.py`` arms whose names start with
      ``prefix``) as the config and data ``summarize`` reads (``reproduce.py --full``).
    replicate: ``replicate(config, seeds, seed_offset) -> config``: the committed design reduced
      to its main arms, run with ``seeds`` fresh seeds starting at ``seed_offset``
      (``reproduce.py --replicate``).
    pinned: whether the table's units start from a pinned testbed (a trained start or a
      dataset); a replication of such a table runs from the committed table's testbeds. A table
      with nothing to pin (models trained from their seeded initialisation on data it generates
      from fixed seeds) sets False.
    starts: ``starts(report) -> {arm: (arm config, step-0 evaluation)}`` for the step-0 guard
      (``check_same_start``), for a table whose data do not keep the ``rl_seeds.run_arm`` layout
      the guard finds by itself.
    replicate_own: a table's own replication, for a design ``replicate`` cannot express (a seed
      count chosen by a pilot's power plan, a pilot's seed ids to avoid):
      ``replicate_own(out_dir, seeds, seed_offset, no_progress, rejudge) -> dict`` (what
      ``replicate`` returns; ``rejudge``: re-judge the replication in ``out_dir`` without
      running); ``reproduce.py --replicate`` calls it in place of ``replicate``.
  """

  name: str
  get_config: Callable[[bool], dict]
  units: Callable[[dict], Mapping[str, Unit]]
  summarize: Callable[[dict], dict]
  render: Callable[[dict], str]
  plot: Callable[[dict, str], list] = lambda results, out_dir: []
  collect: Callable[[dict, Mapping[str, dict]], dict] | None = None
  module: str = ""
  readme: str = ""
  full: Callable[[str, str], tuple[dict, dict]] | None = None
  replicate: Callable[[dict, int, int], dict] | None = None
  pinned: bool = True
  starts: Callable[[dict], Mapping[str, tuple]] | None = None
  replicate_own: Callable[[str, int | None, int, bool, bool], dict] | None = None


def digest(spec: Mapping) -> str:
  """A short stable hash of plain data (the cache key of a unit)."""
  blob = json.dumps(spec, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources(path: str) -> list[str]:
  if os.path.isfile(path):
    return [path]
  return sorted(os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                if f.endswith(".py"))


def code_version(unit: "Unit") -> str:
  """A digest of the source the unit runs: every ``.py`` file of the ``rlpost`` package, the file
  defining ``unit.run`` and ``unit.code``, and every repository module those import (at module
  level or inside functions, transitively: a table's runner, config and helpers), by their code
  (paths relative to the repository; docstrings and comments left out, so regenerated docs do not
  invalidate a cache)."""
  import inspect

  files = _sources(os.path.join(_ROOT, "rlpost"))
  try:
    files += _sources(inspect.getsourcefile(unit.run) or "")
  except TypeError:  # a builtin or functools.partial of one: nothing more to count
    pass
  files += [f for c in unit.code for f in _sources(os.path.join(_ROOT, c) if not os.path.isabs(c)
                                                    else c)]
  files = _import_closure(files)
  h = hashlib.sha256()
  for f in sorted(set(os.path.abspath(f) for f in files)):
    h.update(os.path.relpath(f, _ROOT).encode() + b"\0")
    h.update(hashlib.sha256(_code_text(f).encode()).digest())
  return h.hexdigest()[:16]


def _module_file(module: str) -> str | None:
  """The repository file of a dotted module name (a package's ``__init__.py``), or None for a
  module outside the repository."""
  base = os.path.join(_ROOT, *module.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      return path
  return None


def _imports(path: str) -> list[str]:
  """The repository files ``path`` imports anywhere in its code (``import a.b``, ``from a import
  b`` where ``b`` is a module or a name of ``a``, and relative imports), with the packages on the
  way (their ``__init__.py`` runs on import)."""
  import ast

  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  rel = os.path.relpath(path, _ROOT)
  package = None if rel.startswith("..") else os.path.dirname(rel).replace(os.sep, ".")
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level and package is None:  # a file outside the repository
        continue
      if node.level:
        parts = package.split(".") if package else []
        parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
        base = ".".join(parts + ([node.module] if node.module else []))
      else:
        base = node.module or ""
      names += [base] + [f"{base}.{a.name}" for a in node.names]
  out = []
  for name in names:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):  # every package on the way, then the module itself
      f = _module_file(".".join(parts[:i]))
      if f:
        out.append(f)
  return out


def _import_closure(files: Sequence[str]) -> list[str]:
  """``files`` and every repository file they import, transitively."""
  seen, todo = set(), [os.path.abspath(f) for f in files]
  while todo:
    f = todo.pop()
    if f in seen or not f.endswith(".py"):
      continue
    seen.add(f)
    todo += [os.path.abspath(g) for g in _imports(f) if os.path.abspath(g) not in seen]
  return sorted(seen)


def _code_text(path: str) -> str:
  """A source file as its syntax tree without docstrings (comments and layout do not reach the
  tree): what the code does, not its documentation."""
  import ast

  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)):
      node.body = body[1:] or [ast.Pass()]
  return ast.dump(tree)


def unit_key(unit: "Unit") -> dict:
  """What a unit's cache entry is keyed by: its spec and the version of its code."""
  return {"spec": unit.spec, "code": code_version(unit)}


def testbeds_in(tree) -> list[str]:
  """The testbed digests anywhere in ``tree``: pinned files (``rlpost.train.pinned``) named by
  ``init_params`` (a start) or ``testbed`` (a dataset) keys."""
  from rlpost.train import pinned

  return sorted({pinned.parse_name(m[k])[1] for m in mappings(tree)
                 for k in ("init_params", "testbed") if isinstance(m.get(k), str) and m[k]})


def check_one_testbed(specs, desc: str) -> None:
  """Raises ``MixedStarts`` when ``specs`` start from two pinned policies (``init_params``), or
  read two pinned datasets (``testbed``) of one ``system``: a table compares its units from one
  start, and each system's units on one dataset."""
  from rlpost.train import pinned

  starts = sorted({pinned.parse_name(m["init_params"])[1] for m in mappings(specs)
                   if isinstance(m.get("init_params"), str) and m["init_params"]})
  if len(starts) > 1:
    raise MixedStarts(f"the units of {desc} start from {len(starts)} testbeds "
                      f"({', '.join(starts)}); a table starts from one")
  data: dict[str, set] = {}
  for m in mappings(specs):
    if isinstance(m.get("testbed"), str) and m["testbed"]:
      data.setdefault(str(m.get("system", "")), set()).add(pinned.parse_name(m["testbed"])[1])
  for system, files in sorted(data.items()):
    if len(files) > 1:
      raise MixedStarts(f"the units of {desc} read {len(files)} pinned datasets of system "
                        f"{system!r} ({', '.join(sorted(files))}); a system's units read one")


class MixedStarts(ValueError):
  """Arms of one table that did not start from the same policy (named in the message)."""


# RLConfig keys that decide a step-0 evaluation besides the start: arms that agree on these (and on
# the start) must report the same step-0 evaluation.
_EVAL_KEYS = ("task", "task_spec", "num_train", "num_test", "data_seed", "graded_reward",
              "prompt_template", "max_prompt_tokens", "eval_problems", "eval_samples",
              "temperature", "top_p", "max_new_tokens", "model", "model_seed", "sft_steps",
              "sft_lr", "sft_batch_size", "policy")


def _arm_starts(tree, path: str = "") -> dict:
  """{path: (arm config, step-0 evaluation)} of every trained arm (``rl_seeds.run_arm`` layout)
  in ``tree``."""
  out = {}
  if isinstance(tree, Mapping):
    evals = tree.get("evals")
    if (isinstance(evals, list) and evals and isinstance(evals[0], Mapping)
        and evals[0].get("step") == 0 and isinstance(tree.get("config"), Mapping)):
      out[path or "/"] = (tree["config"], evals[0]["per_seed"][0])
    else:
      for k, v in tree.items():
        out.update(_arm_starts(v, f"{path}/{k}"))
  return out


def check_same_start(data, starts: Mapping[str, tuple] | None = None) -> None:
  """Refuse a table whose arms started from different policies: arms that share a testbed
  (``init_params``) and their evaluation settings must report bitwise-equal step-0 evaluations
  (one program on one machine gives exactly that; units cached on two machines or from two
  starts do not). The arms are ``starts`` ({arm: (config, step-0 evaluation)}) when given, else
  those of ``data`` in the ``rl_seeds.run_arm`` layout. Raises ``MixedStarts`` naming the two
  arms and the metric."""
  groups: dict[str, tuple[str, Mapping]] = {}
  for path, (cfg, ev) in (_arm_starts(data) if starts is None else starts).items():
    key = json.dumps({k: cfg.get(k) for k in _EVAL_KEYS + ("init_params",)}, sort_keys=True,
                     default=str)
    if key not in groups:
      groups[key] = (path, ev)
      continue
    first, ref = groups[key]
    for m in sorted(set(ref) & set(ev)):
      if ref[m] != ev[m] and not (_isnan(ref[m]) and _isnan(ev[m])):
        raise MixedStarts(
            f"arms {first} and {path} start from different policies: step-0 {m} {ref[m]!r} vs "
            f"{ev[m]!r} with the same start and evaluation settings (units from two starts or "
            "two machines); rerun the table into a fresh --out")


def check_starts(exp: Experiment, report: Mapping) -> None:
  """``check_same_start`` over the arms of ``report`` (``exp.starts`` where the table has its
  own layout)."""
  check_same_start(report["data"], exp.starts(report) if exp.starts else None)


def _isnan(x) -> bool:
  return isinstance(x, float) and math.isnan(x)


def write_json(path: str, obj) -> None:
  """Write ``obj`` as indented JSON to ``path`` atomically."""
  _write_text(path, json.dumps(jsonable(obj), indent=1))


def _atomic_write(path: str, write: Callable) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _write_text(path: str, text: str) -> None:
  def write(tmp):
    with open(tmp, "w") as f:
      f.write(text)
  _atomic_write(path, write)


class UnitCache:
  """Finished units under ``directory``: ``<id>-<digest>.json`` (the JSON part of the result and
  the seconds the unit took; written last, so its presence marks a complete unit) and, for
  array results, ``<id>-<digest>.npz``."""

  def __init__(self, directory: str):
    self.directory = directory

  def _stem(self, uid: str, spec: Mapping) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in uid)
    return os.path.join(self.directory, f"{safe}-{digest(spec)}")

  def has(self, uid: str, spec: Mapping) -> bool:
    """Whether the unit is finished (its JSON, written last, is there)."""
    return os.path.exists(self._stem(uid, spec) + ".json")

  def load(self, uid: str, spec: Mapping) -> tuple[dict, float] | None:
    """(result, seconds) of a finished unit, or None."""
    entry = self.load_entry(uid, spec)
    return None if entry is None else (entry["result"], float(entry["seconds"]))

  def load_entry(self, uid: str, spec: Mapping) -> dict | None:
    """{"result", "seconds", "provenance"} of a finished unit (provenance {} when not
    recorded), or None."""
    stem = self._stem(uid, spec)
    if not os.path.exists(stem + ".json"):
      return None
    with open(stem + ".json") as f:
      entry = json.load(f)
    out = entry["result"]
    if os.path.exists(stem + ".npz"):
      with np.load(stem + ".npz") as z:
        out.update({k: z[k] for k in z.files})
    return {"result": out, "seconds": float(entry["seconds"]),
            "provenance": entry.get("provenance", {})}

  def save(self, uid: str, spec: Mapping, result: Mapping, seconds: float,
           provenance: Mapping | None = None) -> None:
    os.makedirs(self.directory, exist_ok=True)
    stem = self._stem(uid, spec)
    arrays = {k: v for k, v in result.items() if isinstance(v, np.ndarray)}
    rest = {k: v for k, v in result.items() if k not in arrays}

    def write_npz(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, **arrays)

    if arrays:
      _atomic_write(stem + ".npz", write_npz)
    _write_text(stem + ".json", json.dumps({"seconds": seconds, "result": jsonable(rest),
                                            "provenance": jsonable(provenance or {})}))


def jsonable(x):
  """``x`` with numpy scalars and arrays as Python numbers and lists (NaN stays NaN, which
  Python's json writes and reads as ``NaN``)."""
  if isinstance(x, Mapping):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return jsonable(x.tolist())
  if isinstance(x, (float, np.floating)):
    return float(x)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def command(name: str, args) -> str:
  jobs = int(getattr(args, "jobs", None) or 1)
  return (f"python scripts/reproduce.py {name}" + (" --quick" if args.quick else "")
          + (f" --seeds {args.seeds}" if args.seeds else "")
          + (f" --jobs {jobs}" if jobs > 1 else ""))


def run(exp: Experiment, args, *, sync_docs: bool = False) -> dict:
  """Run (or resume) every unit of ``exp``, then judge and write the outputs into ``args.out``.

  ``args`` carries ``quick``, ``seeds`` (None: the config's), ``out`` and ``no_progress``.
  Finished units are cached under ``<out>/cache`` by the digest of their spec and of the code they
  run (``unit_key``); a rerun computes only the missing ones. ``results.json`` records each unit's
  provenance (``machine`` when it ran, its code version and testbed) and the table's testbeds.
  """
  config = exp.get_config(bool(args.quick))
  if args.seeds:
    config = dict(config, seeds=int(args.seeds))
  units = exp.units(config)
  os.makedirs(args.out, exist_ok=True)
  jobs = int(getattr(args, "jobs", None) or 1)
  results, seconds, ran, provenance = run_units(units, os.path.join(args.out, "cache"),
                                                 exp.name, args.no_progress, jobs=jobs,
                                                 source=(exp.module, config))
  data = _collect(exp, config, results)
  report = {"experiment": exp.name, "command": command(exp.name, args), "config": config,
            "machine": machine(), "jobs": jobs, "seconds": seconds.pop("_total"),
            "unit_seconds": sum(seconds.values()), "units_run": ran, "units": provenance,
            "testbeds": testbeds_in([u.spec for u in units.values()]), "data": data}
  return write(exp, report, args.out, sync_docs=sync_docs)


def _collect(exp: Experiment, config: dict, results: Mapping[str, dict]) -> dict:
  """What results.json keeps of the unit results: ``exp.collect``'s choice, by default every
  unit's JSON part."""
  if exp.collect:
    return exp.collect(config, results)
  return {uid: {k: v for k, v in r.items() if not isinstance(v, np.ndarray)}
          for uid, r in results.items()}


def check_jobs(jobs: int) -> None:
  """Refuses (ValueError, one line) a worker count below 1 or above the usable cores."""
  cores = len(usable_cpus())
  if jobs < 1 or jobs > cores:
    raise ValueError(f"--jobs {jobs}: must be between 1 and the {cores} CPU cores this process "
                     "may use (one worker process per share of them)")


def run_units(units: Mapping[str, Unit], cache_dir: str, desc: str, no_progress: bool = False,
              *, jobs: int = 1, source: tuple[str, Mapping] | None = None):
  """Run (or load from ``cache_dir``) every unit. Returns (results, seconds per unit and
  "_total", ids run now, provenance per unit: the machine, commit and code version that computed
  it and the testbeds it started from). Refuses units that start from two pinned policies, or
  that read two pinned datasets of one system.

  ``jobs`` > 1 runs the missing units in that many worker processes (``_run_in_workers``),
  each pinned to its own share of the usable cores; ``source`` = (module, config) rebuilds the
  units there (``module``'s ``EXPERIMENT.units(config)`` must be ``units``). A unit's numbers
  then come from a program on fewer cores: the same computation, but XLA splits its reductions
  by the thread count, so they agree with an in-process run within the cross-program tolerance
  (``tests/experiments/test_mc_grpo.py``), not bitwise; each unit's provenance records the cores
  it ran on (``cpus_usable``)."""
  check_one_testbed([u.spec for u in units.values()], desc)
  check_jobs(jobs)
  if jobs > 1 and source is None:
    raise ValueError("run_units: jobs > 1 needs source=(module, config) to rebuild the units in "
                     "the worker processes")
  cache = UnitCache(cache_dir)
  t0 = time.perf_counter()
  results, seconds, ran, provenance = {}, {}, [], {}
  bar = progress_lib.bar(total=sum(u.weight for u in units.values()), desc=desc,
                         disable=no_progress)
  keys = {uid: unit_key(unit) for uid, unit in units.items()}
  if jobs > 1:
    todo = [uid for uid in units if not cache.has(uid, keys[uid])]
    bar.update(sum(u.weight for uid, u in units.items() if uid not in todo))
    if todo:
      _run_in_workers(todo, units, keys, cache_dir, jobs, source, bar)
      ran.extend(todo)
  for uid, unit in units.items():
    bar.set_postfix_str(uid)
    key = keys[uid]
    entry = cache.load_entry(uid, key)
    if entry is None:
      _save_run(cache, uid, unit, key, bar.update)
      ran.append(uid)
      entry = cache.load_entry(uid, key)  # exactly what a resumed run sees
    elif jobs == 1:
      bar.update(unit.weight)
    results[uid], seconds[uid], provenance[uid] = (entry["result"], entry["seconds"],
                                                   entry["provenance"])
  bar.close()
  seconds["_total"] = time.perf_counter() - t0
  return results, seconds, ran, provenance


# glibc malloc settings of the worker processes: one arena, no mmap, no trimming. XLA:CPU
# allocates a program's temporaries (hundreds of MB for a table's vmapped step) at every
# execution and frees them after; from a thread's own arena such a buffer is a fresh mmap, and
# the kernel faults it in 4 KiB at a time at every step (29% of two 1-core workers' CPU time on
# the ACE table, `BENCHMARKS.md`, "Issue 39 item 3"). From the one heap it is reused without a
# fault. Allocation only: the numbers are unchanged.
WORKER_MALLOC = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                 "glibc.malloc.trim_threshold=68719476736")


def _save_run(cache: UnitCache, uid: str, unit: Unit, key: Mapping, progress) -> None:
  """Run ``unit`` and cache its result with its provenance."""
  t = time.perf_counter()
  result = unit.run(progress)
  prov = dict(machine(), code=key["code"], testbeds=testbeds_in(unit.spec))
  cache.save(uid, key, result, time.perf_counter() - t, prov)


def _unit_worker(cpus: set, module: str, config: Mapping, cache_dir: str, tasks, events) -> None:
  """A worker process of ``run_units``: pinned to ``cpus`` before JAX starts its backend, it
  rebuilds the units (``module``'s ``EXPERIMENT.units(config)``) and runs each (id, key digest)
  it takes from ``tasks`` (None: stop) into the cache, refusing a unit whose key here differs
  from the parent's. It sends ("start", id, None), ("progress", id, n), ("done", id, None) or
  ("error", id, traceback) on its pipe ``events`` (sent at once, so the parent knows the unit a
  worker held even when the worker is killed), and ends with the parent (SIGTERM when it dies)."""
  import importlib
  import traceback

  uid = None
  try:
    _end_with_parent()
    os.sched_setaffinity(0, cpus)
    units = importlib.import_module(module).EXPERIMENT.units(config)
    cache = UnitCache(cache_dir)
    while (task := tasks.get()) is not None:
      uid, parent_digest = task
      events.send(("start", uid, None))
      key = unit_key(units[uid])
      if digest(key) != parent_digest:
        raise RuntimeError(f"unit {uid}: its spec or code differs from the parent process's "
                           "(were files changed during the run?); not run")
      _save_run(cache, uid, units[uid], key, lambda n, uid=uid: events.send(("progress", uid, n)))
      events.send(("done", uid, None))
  except BaseException:
    events.send(("error", uid, traceback.format_exc()))
  finally:
    events.close()


def _end_with_parent() -> None:
  """Have the kernel send this process SIGTERM when its parent dies (Linux ``prctl``)."""
  import ctypes
  import signal

  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass  # not Linux: a worker then outlives a killed parent until its units end


def _run_in_workers(todo: Sequence[str], units: Mapping[str, Unit], keys: Mapping[str, Mapping],
                    cache_dir: str, jobs: int, source: tuple[str, Mapping], bar,
                    poll: float = 1.0) -> None:
  """Run the units ``todo`` in spawned worker processes (``_unit_worker``), the heaviest first;
  worker i is pinned to every ``jobs``-th usable core from the i-th, so a unit's cores depend on
  ``jobs`` alone, not on how many units were left (min(jobs, len(todo)) workers). The first
  worker runs alone until its first unit reports progress (data prepared, policy loaded,
  programs compiled), so that no two processes build the same files at once. Returns when every
  unit is cached; raises RuntimeError, naming the unit, when a unit fails or the worker holding
  it dies (the other workers are stopped; finished units stay cached, so a rerun resumes)."""
  import multiprocessing
  from multiprocessing.connection import wait

  ctx = multiprocessing.get_context("spawn")
  cpus = usable_cpus()
  tunables = os.environ.get("GLIBC_TUNABLES")
  tasks = ctx.Queue()
  n = min(jobs, len(todo))
  for uid in sorted(todo, key=lambda u: -units[u].weight):
    tasks.put((uid, digest(keys[uid])))
  for _ in range(n):
    tasks.put(None)
  module, config = source
  procs, pipes = [], {}  # pipes: the read end of each started worker's events -> its process
  pending, held = set(todo), {}

  def start(upto):
    # The workers' malloc keeps freed memory for reuse (``WORKER_MALLOC``); a spawned process
    # reads the variable when it starts.
    os.environ["GLIBC_TUNABLES"] = ":".join(filter(None, (tunables, WORKER_MALLOC)))
    try:
      while len(procs) < upto:
        read, write = ctx.Pipe(duplex=False)
        i = len(procs)
        procs.append(ctx.Process(target=_unit_worker, daemon=True,
                                 args=(set(cpus[i::jobs]), module, config, cache_dir, tasks,
                                       write)))
        pipes[read] = procs[-1]
        procs[-1].start()
        write.close()  # the worker holds it: its exit is this end's EOF
    finally:
      if tunables is None:
        del os.environ["GLIBC_TUNABLES"]
      else:
        os.environ["GLIBC_TUNABLES"] = tunables

  try:
    start(1)
    while pending:
      if not pipes:
        raise RuntimeError(f"every worker process ended before finishing units "
                           f"{', '.join(sorted(pending))}")
      for read in wait(list(pipes), timeout=poll):
        try:
          kind, uid, detail = read.recv()
        except EOFError:  # the worker exited
          proc = pipes.pop(read)
          proc.join(timeout=30)
          if held.get(proc) in pending:
            raise RuntimeError(f"unit {held[proc]}: its worker process exited with status "
                               f"{proc.exitcode} before finishing it") from None
          continue
        if kind == "error":
          raise RuntimeError(f"unit {uid or '(building the units)'} failed in its worker "
                             f"process:\n{detail}")
        if kind == "start":
          held[pipes[read]] = uid
          continue
        if len(procs) < n:  # the first unit is past its setup: the others may start
          start(n)
        if kind == "progress":
          bar.set_postfix_str(", ".join(sorted(set(held.values()) & pending)))
          bar.update(detail)
        else:
          pending.discard(uid)
  finally:
    for p in procs:
      if p.is_alive():
        p.terminate()
    for p in procs:
      p.join(timeout=30)
    for read in pipes:
      read.close()


def write(exp: Experiment, report: dict, out_dir: str, *, sync_docs: bool = False) -> dict:
  """Judge ``report`` (``exp.summarize``), then write ``results.json``, ``table.md`` and the
  plots into ``out_dir`` (each file replaced atomically); with ``sync_docs``, the table's
  README's results section too."""
  if not report.get("full"):
    check_starts(exp, report)
  report = jsonable(dict(report, summary=exp.summarize(report)))
  declare(exp.name, report["summary"])
  table = exp.render(report)
  _write_text(os.path.join(out_dir, "table.md"), table)
  report["plots"] = [os.path.basename(p) for p in exp.plot(report, out_dir)]
  _write_text(os.path.join(out_dir, "results.json"), json.dumps(report, indent=1))
  if sync_docs:
    from experiments import docsync

    docsync.sync_all(exp, out_dir)
  print(table)
  return report


def run_full(exp: Experiment, runs_dir: str, out_dir: str, *, prefix: str = "",
             allow_underpowered: bool = False, log: Callable[[str], None] = print) -> dict:
  """Judge full-size runs with the CPU table's code: ``exp.full(runs_dir, prefix)`` returns a
  report (config, data) in the CPU layout, which is summarized, rendered and written to
  ``out_dir`` like a CPU run. Fewer seeds in an arm than the power plan asks for
  (``power_plan``: the stated SD of ``experiments/full_size.py``) raise ``RunsError`` unless
  ``allow_underpowered``, which ``log``s the shortfall and marks the table's header."""
  if exp.full is None:
    raise RunsError(f"{exp.name}: no full-size aggregation (its Experiment has no 'full')")
  config, data = exp.full(runs_dir, prefix)
  need = power_plan(config)
  if config["seeds"] < need:
    short = (f"{exp.name} --full: {config['seeds']} seed(s) in the arm with the fewest; the power "
             f"plan asks for {need} per arm (SD {config['pilot_sd']}: "
             f"{config.get('sd_source') or 'pilot'}; smallest effect of interest "
             f"{config['min_effect']}, 80% power, alpha 0.05)")
    if not allow_underpowered:
      raise RunsError(short + "; run the missing seeds (scripts/launch.py) or pass "
                      "--allow-underpowered")
    log(f"UNDERPOWERED (--allow-underpowered): {short}")
  report = {"experiment": exp.name, "command": f"python scripts/reproduce.py {exp.name} --full "
            f"--runs {runs_dir}" + (f" --prefix {prefix}" if prefix else ""),
            "config": config, "machine": machine(), "seconds": 0.0, "unit_seconds": None,
            "units_run": [], "data": data, "full": True}
  os.makedirs(out_dir, exist_ok=True)
  return write(exp, report, out_dir)


def rejudge(exp: Experiment, out_dir: str, *, sync_docs: bool = False) -> dict:
  """Re-judge the results already in ``out_dir`` with the current statistics (no training).

  ``results.json`` must be this table's: a file that is not JSON (truncated, say), not written by
  the harness, or written for another table (its ``"experiment"``) raises ValueError naming the
  file, before ``exp.summarize`` reads a layout it was not written for.
  """
  return write(exp, read_report(exp, out_dir), out_dir, sync_docs=sync_docs)


def read_report(exp: Experiment, out_dir: str) -> dict:
  """``out_dir/results.json``, checked to be this table's (ValueError naming the file)."""
  path = os.path.join(out_dir, "results.json")
  with open(path, "rb") as f:
    raw = f.read()
  try:
    report = json.loads(raw)
  except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
    raise ValueError(f"{path} is not valid JSON ({e}; truncated or damaged?); restore it or "
                     f"rerun python scripts/reproduce.py {exp.name}") from e
  if not isinstance(report, dict) or "data" not in report or "config" not in report:
    raise ValueError(f"{path} was not written by experiments/harness.py (no 'data'/'config')")
  table = report.get("experiment")
  if table != exp.name:
    elsewhere = f"point --out at a directory holding {exp.name!r} results"
    if not (isinstance(table, str) and table):
      raise ValueError(f"{path} names no table (no 'experiment' entry), so it is not table "
                       f"{exp.name!r}'s results; {elsewhere}")
    raise ValueError(f"{path} holds the results of table {table!r}, not of table {exp.name!r}; "
                     f"re-judge it as {table!r} (scripts/reproduce.py {table} --rejudge), or "
                     f"{elsewhere}")
  return report


def replicate(exp: Experiment, out_dir: str, *, seeds: int | None = None,
              seed_offset: int = 1000, no_progress: bool = False, jobs: int = 1) -> dict:
  """Rerun ``exp``'s main arms with fresh seeds from its pinned start, judge them as the table
  is judged, and compare with the committed ``out_dir/results.json``: writes the new run into
  ``out_dir/replication/`` and the comparison into ``out_dir/replication.md`` (printed).

  Refuses (ValueError) a table without a replication design, and seeds that overlap the
  committed ones."""
  if exp.replicate is None:
    raise ValueError(f"table {exp.name!r} has no replication design (its Experiment has no "
                     "'replicate')")
  committed = read_report(exp, out_dir)
  old = committed["config"]
  seeds = int(seeds or old.get("seeds", 2))
  if seeds < 2:
    raise ValueError(f"--seeds {seeds}: a replication needs >= 2 seeds per arm")
  o0, n0 = int(old.get("seed_offset", 0)), int(old.get("seeds", 0))
  if seed_offset < o0 + n0 and o0 < seed_offset + seeds:
    raise ValueError(f"--seed-offset {seed_offset}: seeds {seed_offset}-{seed_offset + seeds - 1}"
                     f" overlap the committed table's {o0}-{o0 + n0 - 1}; a replication uses "
                     "seeds the table did not use")
  config = exp.replicate(old, seeds, seed_offset)
  units = exp.units(config)
  beds, committed_beds = testbeds_in([u.spec for u in units.values()]), committed.get("testbeds")
  if (exp.pinned and not committed_beds) or beds != (committed_beds or []):
    raise ValueError(
        f"{os.path.join(out_dir, 'results.json')} started from "
        f"{'testbeds ' + ', '.join(committed_beds) if committed_beds else 'an unpinned start'}, "
        f"the replication would start from {', '.join(beds) or 'an unpinned start'}: a "
        f"replication compares seeds, not starts; rerun the table from its pinned testbed "
        f"first (python scripts/reproduce.py {exp.name})")
  rep_dir = replication_dir(out_dir, seeds, seed_offset)
  os.makedirs(rep_dir, exist_ok=True)
  results, secs, ran, provenance = run_units(units, os.path.join(rep_dir, "cache"),
                                             f"{exp.name} replication", no_progress, jobs=jobs,
                                             source=(exp.module, config))
  data = _collect(exp, config, results)
  line = (f"python scripts/reproduce.py {exp.name} --replicate --seeds {seeds} "
          f"--seed-offset {seed_offset}" + (f" --jobs {jobs}" if jobs > 1 else ""))
  report = {"experiment": exp.name, "command": line, "config": config, "machine": machine(),
            "jobs": jobs, "seconds": secs.pop("_total"), "unit_seconds": sum(secs.values()),
            "units_run": ran,
            "units": provenance, "testbeds": beds, "data": data,
            "replication_of": {"commit": committed.get("machine", {}).get("commit"),
                               "seeds": n0, "seed_offset": o0}}
  return _write_replication(exp, committed, report, rep_dir)


def committed_arm(report: Mapping, name: str) -> Mapping | None:
  """The committed result of RL arm ``name`` (``rl_seeds.run_arm``'s output: "seeds" and
  "evals") in a table's report, wherever its ``data`` keeps it; None if it has none."""
  data = report.get("data") or {}
  arm = (data.get("arms") or {}).get(name, data.get(name))
  return arm if isinstance(arm, Mapping) and "evals" in arm and "seeds" in arm else None


def recheck(exp: Experiment, out_dir: str, names: Sequence[str]) -> dict:
  """Retrain the committed table's RL arms ``names`` at its own config and seeds, on this machine
  and code (no cache), and compare every evaluation (its step and every numeric metric of every
  seed) with the committed run: ``{name: {"bitwise", "max_abs_diff", "per_seed_max",
  "seconds"}}``, printed and appended with the machine and commit to ``out_dir/recheck.jsonl``.
  On the machine and code that ran the table the contract is bitwise; elsewhere it says how far
  the arm moved. Refuses (ValueError, before any training) a name that is not a committed RL
  arm."""
  committed = read_report(exp, out_dir)
  units = exp.units(committed["config"])
  arms = [n for n in units if committed_arm(committed, n) is not None]
  for n in names:
    if n not in arms:
      raise ValueError(f"--recheck {n}: not an RL arm of the committed table in "
                       f"{os.path.join(out_dir, 'results.json')} (its arms: "
                       f"{', '.join(arms) or 'none'})")
  out = {}
  for n in names:
    t0 = time.perf_counter()
    new, old = units[n].run(lambda *_: None), committed_arm(committed, n)
    if list(new["seeds"]) != list(old["seeds"]) or len(new["evals"]) != len(old["evals"]):
      raise ValueError(f"--recheck {n}: the rerun's seeds or evaluation points differ from the "
                       "committed ones; the table's design changed since it ran")
    per_seed = [0.0] * len(old["seeds"])
    for e_new, e_old in zip(new["evals"], old["evals"]):
      if e_new["step"] != e_old["step"]:
        raise ValueError(f"--recheck {n}: the rerun evaluates at step {e_new['step']} where the "
                         f"committed run did at {e_old['step']}; the design changed")
      for i, (a, b) in enumerate(zip(e_new["per_seed"], e_old["per_seed"])):
        if set(a) != set(b):
          raise ValueError(f"--recheck {n}: the rerun reports metrics "
                           f"{sorted(set(a) ^ set(b))} that only one run has")
        for key, x in b.items():
          if isinstance(x, (int, float)) and not isinstance(x, bool):
            per_seed[i] = max(per_seed[i], _abs_diff(float(a[key]), float(x)))
    out[n] = {"bitwise": max(per_seed) == 0.0, "max_abs_diff": max(per_seed),
              "per_seed_max": per_seed, "seconds": time.perf_counter() - t0}
    print(f"{n}: seeds {old['seeds'][0]}-{old['seeds'][-1]}, {len(old['evals'])} evaluations: "
          + ("bitwise equal to the committed run" if out[n]["bitwise"] else
             f"largest |difference| {max(per_seed):.3g} (per seed: "
             + ", ".join(f"{d:.2g}" for d in per_seed) + ")")
          + f"; {out[n]['seconds']:.0f} s on {machine_text(machine())}", flush=True)
  record = {"command": f"python scripts/reproduce.py {exp.name} --recheck {' '.join(names)}",
            "machine": machine(), "of_commit": committed.get("machine", {}).get("commit"),
            "arms": out}
  # appended, one JSON line per recheck: earlier records are never rewritten
  with open(os.path.join(out_dir, "recheck.jsonl"), "a") as f:
    f.write(json.dumps(jsonable(record)) + "\n")
  return out


def _abs_diff(a: float, b: float) -> float:
  """|a - b|: 0 where equal (two NaNs count as equal), inf where exactly one is NaN."""
  if math.isnan(a) or math.isnan(b):
    return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
  return 0.0 if a == b else abs(a - b)


def replication_dir(out_dir: str, seeds: int, seed_offset: int) -> str:
  """Where a replication at ``seeds`` seeds from ``seed_offset`` goes: ``out_dir/replication``
  (the table's committed replication, with ``out_dir/replication.md``) when none is there or it
  used the same seeds; otherwise ``out_dir/replication-<offset>x<seeds>`` (its ``replication.md``
  inside), so another seed set never overwrites the committed one."""
  main = os.path.join(out_dir, "replication")
  path = os.path.join(main, "results.json")
  if not os.path.exists(path):
    return main
  with open(path) as f:
    cfg = json.load(f).get("config", {})
  if (int(cfg.get("seeds", -1)), int(cfg.get("seed_offset", 0))) == (seeds, seed_offset):
    return main
  return os.path.join(out_dir, f"replication-{seed_offset}x{seeds}")


def _markdown_path(rep_dir: str) -> str:
  """``replication.md`` beside the committed ``replication/``, inside any other."""
  if os.path.basename(rep_dir) == "replication":
    return os.path.join(os.path.dirname(rep_dir), "replication.md")
  return os.path.join(rep_dir, "replication.md")


def rejudge_replication(exp: Experiment, out_dir: str) -> dict:
  """Re-judge the committed table and its replication (``out_dir/replication/results.json``) with
  the current statistics and rewrite ``replication.md`` (no training)."""
  committed = read_report(exp, out_dir)
  report = read_report(exp, os.path.join(out_dir, "replication"))
  committed = jsonable(dict(committed, summary=declare(exp.name, exp.summarize(committed))))
  return _write_replication(exp, committed, report, os.path.join(out_dir, "replication"))


def _write_replication(exp: Experiment, committed: dict, report: dict, rep_dir: str) -> dict:
  check_starts(exp, report)
  report = jsonable(dict(report, summary=exp.summarize(report)))
  declare(exp.name, report["summary"])
  write_json(os.path.join(rep_dir, "results.json"), report)
  rows = compare(committed.get("summary", {}), report["summary"])
  text = replication_markdown(exp.name, committed, report, rows, report["command"])
  md = _markdown_path(rep_dir)
  _write_text(md, text)
  print(text)
  print(f"written: {md} and {os.path.join(rep_dir, 'results.json')}")
  return {"report": report, "rows": rows, "markdown": md}
