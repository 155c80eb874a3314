"""Memory of every full-size run (``experiments/*/full.py``): a training micro-batch, the step.

For each distinct (policy, prompt + completion length, rows per device) of the full-size
configurations, XLA's memory analysis of the policy-gradient pass (``jax.grad`` of a loss over
``completion_scores`` with the run's remat and LM-head chunks) is read off the compiled program,
with ``attention="xla"`` and ``"blockwise"``, and with the layers stored one by one and stacked
(``stacked_layers``; the full-size configurations use blockwise attention and stacked layers).
Nothing runs: the inputs are abstract (``jax.ShapeDtypeStruct``) and the model is built with
``nnx.eval_shape``.

Reported per program: the parameter bytes (arguments), the gradient bytes (outputs) and XLA's
temporaries: what one device needs beyond its parameters, gradients and optimizer state. The
analysis is of the CPU compilation (one device, no sharding); an accelerator's compiler plans
its own buffers, so these are estimates of the same program, not device measurements.

    python -m scripts.benchmarks.full_memory [--out results/bench/full_memory.json]

The whole step, per device (``--whole-step``, ``whole_step``; results/bench/full_step.json):
every full-size run is planned for 8 devices (``mesh_fsdp=8``, ``param_sharding="fsdp"``), so
float32 parameters, gradients and AdamW's two float32 moments are split 8 ways, and so are the
step's rows. A step has two phases whose buffers are not live together, sampling and the update
(the reference pass's forward sits between them and needs less than the update's gradient
pass), over buffers that live through the whole step. The plan per device is

    peak = persistent + max(sampling, update)

with these terms (N parameters, D = 8 devices, L layers, E the hidden width, H query heads,
K key-value heads of hd dims, I the MLP width, V the vocabulary; r rows of a sampler call per
device, Tp prompt and C completion tokens):

* persistent: the parameters 4N/D; the reference parameters 4N/D (the trainer holds the
  starting policy as ``ref_params`` whatever the recipe, sharded as the parameters); AdamW's
  moments 8N/D; the step's batch, rows/D x (Tp x 5 (int32 tokens, bool mask) + C x 13 (int32
  tokens, bool mask, float32 sampling and policy log-probs) + C x 4 (float32 advantages, counted
  per token) + C x 4 (float32 reference log-probs, where the recipe reads them)). ``rows`` is
  the allocation's static maximum (``full_size.sampling_plan(cfg).rows``; DARS-B's breadth arms
  98,304 and 196,608). Not counted: the train split's prompt arrays (records x Tp x 5 bytes).
* sampling, what ``rlpost.sampling.sample`` holds under ``rlpost.train.rl``'s ``sample``:
  - its layer weights: it unstacks the stacked layers once per call
    (``tfm.with_layers_stacked(model, False)``), a float32 copy of the layer weights kept in
    the parameters' sharding, 4 x layers / D. It makes no bfloat16 copy: each matmul converts
    its float32 operand. In XLA's plan of the call for an 8-device mesh (read off the HLO of
    its CPU compilation on 8 virtual devices) the attention projections are gathered whole, in
    float32, before the decode loop (4 x L x attention weights per device), while the MLP and
    LM-head weights stay sharded and the rows' activations are gathered for them instead;
  - the larger of the prefill and the decode:
    prefill: the KV cache of Tp slots, r x Tp x L x 2 x K x hd x 2 bytes (bfloat16), the
    scores of one layer (the cached path uses the plain attention), two float32 copies of
    r x H x Tp^2, one layer's MLP activations, r x Tp x I x 2 (gate, up) x 2 bytes, and the
    MLP weights of every layer and the embedding table gathered whole in float32,
    4 x (L x 3 x E x I + V x E): XLA's plan gathers them for the prefill ahead of their use,
    many layers at once (the buffer assignment of the CPU compilation), so they are counted
    whole;
    decode: the KV cache of the last decode segment, Tp + C - 1 slots, plus the previous
    segment's cache while ``extend_cache`` copies it into the last one, and the float32 logits
    of a decode step, r x V x 4;
  with r = rollout_chunk / D, or a whole sampling call's rows / D when ``rollout_chunk`` is 0.
* update: the gradient accumulator 4N/D (when ``grad_accum`` > 1) and the micro-batch's
  gradient 4N/D, AdamW's updates 4N/D, FSDP's transients (one layer's float32 weights
  gathered and its float32 gradient before the reduce-scatter: 8 x one layer), and the
  gradient pass's temporaries: XLA's plan above for the run's micro-batch (rows per device,
  layers stored as configured, the configured attention), read from full_memory.json.

These are arithmetic and an XLA plan on CPU, not device measurements. JAX on GPUs allocates 75%
of the memory by default (``XLA_PYTHON_CLIENT_MEM_FRACTION``), so a plan near a chip's capacity
needs that raised. ``--sampler-xla`` (``all``, or runs by name) compiles the runs' largest
sampler call for an 8-device mesh of virtual CPU devices (``sampler_plan``, once per distinct
shape, 1-2 minutes each) and records XLA's temporaries beside the arithmetic; the row's
``peak_xla_gib`` then takes XLA's figure for the sampling phase. XLA's scheduling is not a sum
of terms: it keeps gathered weights live into the decode where the caches are small, and
frees some before the largest prefill buffers where they are large. ``--grad-from`` names the
gradient pass's file (a micro-batch it lacks is compiled).

    python -m scripts.benchmarks.full_memory --whole-step [--sampler-xla EXP:RUN,...]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

from experiments import full_size
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from scripts.benchmarks import roofline

EXPERIMENTS = ("mc_grpo", "ace", "dars")
GIB = 2 ** 30


def runs() -> dict[tuple, list[str]]:
  """(policy name, prompt tokens, completion tokens, rows per device, remat, logits chunk) ->
  the full-size runs with that training micro-batch."""
  out: dict[tuple, list[str]] = {}
  for exp in EXPERIMENTS:
    full = importlib.import_module(f"experiments.{exp}.full").FULL
    for name, cfg in full.items():
      rows = full_size.sampling_plan(cfg).rows
      per_device = rows // cfg.get("num_minibatches", 1) // cfg.get("grad_accum", 1)
      per_device //= full_size.DEVICES
      key = (cfg["policy"].rstrip("/").split("/")[-1], cfg["max_prompt_tokens"],
             cfg["max_new_tokens"], per_device, cfg.get("remat", False),
             cfg.get("logits_chunk", 0))
      out.setdefault(key, []).append(f"{exp}:{name}")
  return out


def model_config(policy: str, attention: str) -> tfm.TransformerConfig:
  arch = dict(full_size.POLICIES[policy])
  arch.pop("architecture")
  return tfm.TransformerConfig(**arch, qkv_bias=True, dtype="bfloat16", param_dtype="float32",
                               attention=attention)


def analyse(policy: str, prompt: int, completion: int, rows: int, remat: bool, chunk: int,
            attention: str, stacked_layers: bool = False) -> dict:
  """Bytes of the compiled gradient pass of one micro-batch (abstract; nothing runs).

  ``stacked_layers``: ``TransformerConfig.stacked_layers`` (layers stored as one [L, ...]
  parameter each, which the remat scan reads in place and whose gradients it writes stacked);
  otherwise layers stored one by one, which the scan stacks (a copy of the weights in, and of
  their gradients out)."""
  cfg = model_config(policy, attention).replace(max_seq_len=prompt + completion,
                                                stacked_layers=stacked_layers)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: tfm.Transformer(cfg, rngs=nnx.Rngs(0))))
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
  args = (params, spec((rows, prompt), jnp.int32), spec((rows, prompt), bool),
          spec((rows, completion), jnp.int32), spec((rows, completion), bool),
          spec((rows, completion), jnp.float32))
  merged = functools.partial(nnx.merge, graphdef)

  def loss(w, pt, pm, ct, cm, adv):
    logp, _ = scoring.completion_scores(merged(w), pt, pm, ct, cm, logits_chunk=chunk, remat=remat)
    return -jnp.sum(logp * adv) / jnp.maximum(jnp.sum(cm), 1)

  start = time.perf_counter()
  stats = jax.jit(jax.grad(loss)).lower(*args).compile().memory_analysis()
  return dict(attention=attention, compile_seconds=round(time.perf_counter() - start, 1),
              argument_gib=stats.argument_size_in_bytes / GIB,
              output_gib=stats.output_size_in_bytes / GIB,
              temp_gib=stats.temp_size_in_bytes / GIB)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None, help="default: results/bench/full_memory.json, or "
                      "results/bench/full_memory_P+C.json with --tokens, or "
                      "results/bench/full_step.json with --whole-step")
  parser.add_argument("--tokens", default=None, metavar="P,C",
                      help="analyse every run's micro-batch at P prompt + C completion tokens "
                           "instead of its own (e.g. 64,64: what does not depend on the sequence)")
  parser.add_argument("--whole-step", action="store_true",
                      help="the whole step's plan per device of every run (whole_step)")
  parser.add_argument("--grad-from", default="results/bench/full_memory.json",
                      help="with --whole-step: the gradient pass's temporaries from this file; "
                           "a micro-batch it lacks is compiled")
  parser.add_argument("--sampler-xla", default="", metavar="all|EXP:RUN,...",
                      help="with --whole-step: also compile these runs' sampler call for an "
                           f"{full_size.DEVICES}-device mesh of virtual CPU devices and report "
                           "XLA's temporaries beside the arithmetic (1-2 minutes per shape)")
  args = parser.parse_args(argv)
  if args.whole_step:
    return main_whole_step(args)
  if args.tokens:
    short = tuple(int(x) for x in args.tokens.split(","))
    if len(short) != 2 or min(short) < 1:
      parser.error(f"--tokens takes two positive ints P,C, got {args.tokens!r}")
  out = args.out or ("results/bench/full_memory.json" if not args.tokens
                     else f"results/bench/full_memory_{short[0]}+{short[1]}.json")
  rows = []
  for (policy, prompt, completion, per_device, remat, chunk), names in runs().items():
    if args.tokens:
      prompt, completion = short
    for stacked, attention in itertools.product((False, True), ("xla", "blockwise")):
      row = dict(policy=policy, prompt_tokens=prompt, completion_tokens=completion,
                 rows_per_device=per_device, remat=remat, logits_chunk=chunk, runs=names,
                 layers="stacked" if stacked else "stored",
                 **analyse(policy, prompt, completion, per_device, remat, chunk, attention,
                           stacked_layers=stacked))
      print(json.dumps(row), flush=True)
      rows.append(row)
  command = "python -m scripts.benchmarks.full_memory" + (
      f" --tokens {args.tokens}" if args.tokens else "")
  result = dict(command=command, backend=jax.default_backend(), jax=jax.__version__, rows=rows)
  with open(out, "w") as f:
    json.dump(result, f, indent=2)
  print(table(rows))
  return result


COLUMNS = (("stored", "xla"), ("stored", "blockwise"), ("stacked", "xla"),
           ("stacked", "blockwise"))


def table(rows: list[dict]) -> str:
  """Markdown: one line per micro-batch, the temporaries (GiB) of each (layers, attention)."""
  lines = ["| policy | tokens (prompt + completion) | rows/device | runs | params GiB | " +
           " | ".join(f"temp GiB, {layers}, {attention}" for layers, attention in COLUMNS) + " |",
           "|---|---|---:|---|---:|" + "---:|" * len(COLUMNS)]
  by_key: dict[tuple, dict] = {}
  for r in rows:
    key = (r["policy"], r["prompt_tokens"], r["completion_tokens"], r["rows_per_device"])
    by_key.setdefault(key, {"runs": r["runs"], "params": r["argument_gib"]})[
        (r.get("layers", "stored"), r["attention"])] = r["temp_gib"]
  for (policy, p, c, n), v in by_key.items():
    temps = " | ".join(f"{v[col]:.1f}" if col in v else "-" for col in COLUMNS)
    lines.append(f"| {policy} | {p:,} + {c:,} | {n} | {', '.join(v['runs'])} | "
                 f"{v['params']:.1f} | {temps} |")
  return "\n".join(lines)


# --- The whole step, per device (module docstring) ----------------------------------------------

H100_GIB = roofline.H100.hbm_gib
V5E_GIB = roofline.V5E.hbm_gib


def grad_pass_temps(path: str) -> dict[tuple, float]:
  """(policy, prompt, completion, rows per device, layers, attention) -> temp GiB of the
  gradient pass, from a ``full_memory`` JSON."""
  with open(path) as f:
    rows = json.load(f)["rows"]
  return {(r["policy"], r["prompt_tokens"], r["completion_tokens"], r["rows_per_device"],
           r.get("layers", "stored"), r["attention"]): r["temp_gib"] for r in rows}


def grad_key(cfg: dict, devices: int = full_size.DEVICES) -> tuple:
  """The key of ``cfg``'s gradient micro-batch in ``grad_pass_temps``."""
  model = cfg.get("model", {})
  rows = full_size.sampling_plan(cfg).rows
  per_device = rows // cfg.get("num_minibatches", 1) // cfg.get("grad_accum", 1) // devices
  return (roofline.policy_name(cfg), cfg["max_prompt_tokens"], cfg["max_new_tokens"],
          per_device, "stacked" if model.get("stacked_layers") else "stored",
          model.get("attention", "xla"))


def whole_step(cfg: dict, grad_temp_gib: float, devices: int = full_size.DEVICES) -> dict:
  """The plan of one step of ``cfg`` per device, in GiB, term by term (module docstring).

  ``grad_temp_gib``: the temporaries of the run's gradient micro-batch (``analyse``)."""
  a = roofline.arch(roofline.policy_name(cfg))
  p = roofline.param_counts(a)
  n = p["total"]
  tp, c = cfg["max_prompt_tokens"], cfg["max_new_tokens"]
  rows = full_size.sampling_plan(cfg).rows
  ref = roofline.needs_reference(cfg)
  g = lambda b: b / GIB  # noqa: E731
  per_row = tp * 5 + c * 13 + c * 4 + (c * 4 if ref else 0)
  persistent = dict(params=g(4 * n / devices), reference_params=g(4 * n / devices),
                    adam_moments=g(8 * n / devices), batch=g(rows * per_row / devices))
  r = max(roofline.sampling_chunks(cfg)) / devices
  kv = roofline.kv_bytes_per_slot(a)
  segs = roofline.segments(tp, c)
  prefill = dict(prefill_cache=g(r * tp * kv),
                 prefill_scores=g(2 * r * a["num_heads"] * tp ** 2 * 4),
                 prefill_mlp=g(r * tp * a["intermediate_size"] * 2 * 2),
                 prefill_gathered=g(4 * (a["num_layers"] * 3 * a["hidden_size"] *
                                         a["intermediate_size"] + p["embed"])))
  decode = dict(kv_cache=g(r * segs[-1][1] * kv),
                kv_cache_previous_segment=g(r * segs[-2][1] * kv) if len(segs) > 1 else 0.0,
                decode_logits=g(r * a["vocab_size"] * 4))
  weights = dict(sampler_layers=g(4 * p["layers"] / devices),
                 sampler_attention_gathered=g(4 * a["num_layers"] * p["attention"]))
  accum = cfg.get("grad_accum", 1) > 1
  update = dict(grad_accumulator=g(4 * n / devices) if accum else 0.0,
                micro_grads=g(4 * n / devices), adam_updates=g(4 * n / devices),
                fsdp_layer=g(8 * p["layer"]), grad_pass_temps=grad_temp_gib)
  sampling = sum(weights.values()) + max(sum(prefill.values()), sum(decode.values()))
  total = sum(persistent.values()) + max(sampling, sum(update.values()))
  return dict(policy=roofline.policy_name(cfg), rows=rows, sampler_rows_per_device=r,
              micro_rows_per_device=grad_key(cfg, devices)[3], reference_pass=ref,
              persistent=persistent, sampling_weights=weights, prefill=prefill, decode=decode,
              update=update, persistent_gib=sum(persistent.values()), sampling_gib=sampling,
              update_gib=sum(update.values()), peak_gib=total,
              fits={"H100 80": total <= H100_GIB, "v5e 16": total <= V5E_GIB})


def sampler_shape(cfg: dict) -> tuple:
  """What ``sampler_plan`` depends on."""
  model = cfg.get("model", {})
  return (roofline.policy_name(cfg), max(roofline.sampling_chunks(cfg)),
          cfg["max_prompt_tokens"], cfg["max_new_tokens"], bool(model.get("stacked_layers")),
          model.get("attention", "xla"), cfg.get("param_sharding", "fsdp"))


def sampler_plan(cfg: dict, devices: int = full_size.DEVICES) -> dict:
  """XLA's plan (GiB per device) of ``cfg``'s largest sampler call under ``devices``-way FSDP:
  abstract inputs, compiled, nothing run. Needs ``devices`` devices (on CPU, virtual ones:
  ``--xla_force_host_platform_device_count``)."""
  from jax.sharding import NamedSharding
  from rlpost import sampling, sharding

  policy = roofline.policy_name(cfg)
  tp, n = cfg["max_prompt_tokens"], cfg["max_new_tokens"]
  model = cfg.get("model", {})
  mcfg = model_config(policy, model.get("attention", "xla")).replace(
      max_seq_len=tp + n, stacked_layers=bool(model.get("stacked_layers")))
  graphdef, params = nnx.split(nnx.eval_shape(lambda: tfm.Transformer(mcfg, rngs=nnx.Rngs(0))))
  mesh = sharding.make_mesh(fsdp=devices, devices=jax.devices()[:devices])
  shards = sharding.param_shardings(params, mesh, mode=cfg.get("param_sharding", "fsdp"))
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        params, shards)
  rows = max(roofline.sampling_chunks(cfg))
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
      shape, dtype, sharding=NamedSharding(mesh, sharding.batch_spec(len(shape))))
  scfg = sampling.SamplingConfig(max_new_tokens=n)
  fn = jax.jit(lambda w, pt, pm, k: sampling.sample(graphdef, w, pt, pm,
                                                     jax.random.wrap_key_data(k), cfg=scfg))
  start = time.perf_counter()
  stats = fn.lower(params, spec((rows, tp), jnp.int32), spec((rows, tp), bool),
                   spec((rows, 2), jnp.uint32)).compile().memory_analysis()
  return dict(rows=rows, devices=devices, compile_seconds=round(time.perf_counter() - start, 1),
              argument_gib=stats.argument_size_in_bytes / GIB,
              temp_gib=stats.temp_size_in_bytes / GIB)


def main_whole_step(args) -> dict:
  """``--whole-step``: one row per full-size run, written to results/bench/full_step.json."""
  wanted = [x for x in args.sampler_xla.split(",") if x]
  if wanted:  # virtual CPU devices, set before JAX starts its backend
    flag = f"--xla_force_host_platform_device_count={full_size.DEVICES}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
  temps = grad_pass_temps(args.grad_from) if os.path.exists(args.grad_from) else {}
  runs_ = roofline.full_runs()
  if wanted == ["all"]:
    wanted = [f"{e}:{n}" for e, n, _ in runs_]
  unknown = set(wanted) - {f"{e}:{n}" for e, n, _ in runs_}
  if unknown:
    raise SystemExit(f"--sampler-xla: unknown runs {sorted(unknown)}")
  samplers: dict[tuple, dict] = {}
  rows = []
  for exp, name, cfg in runs_:
    key = grad_key(cfg)
    if key not in temps:
      policy, prompt, completion, per_device, layers, attention = key
      temps[key] = analyse(policy, prompt, completion, per_device, cfg.get("remat", False),
                           cfg.get("logits_chunk", 0), attention,
                           stacked_layers=layers == "stacked")["temp_gib"]
    row = dict(run=f"{exp}:{name}", **whole_step(cfg, temps[key]))
    if f"{exp}:{name}" in wanted:
      shape = sampler_shape(cfg)
      if shape not in samplers:
        samplers[shape] = sampler_plan(cfg)
        print(f"{exp}:{name} sampler", json.dumps(samplers[shape]), flush=True)
      row["sampler_xla"] = samplers[shape]
      row["peak_xla_gib"] = row["persistent_gib"] + max(samplers[shape]["temp_gib"],
                                                        row["update_gib"])
      worst = max(row["peak_gib"], row["peak_xla_gib"])
      row["fits"] = {"H100 80": worst <= H100_GIB, "v5e 16": worst <= V5E_GIB}
    rows.append(row)
  command = "python -m scripts.benchmarks.full_memory --whole-step" + (
      f" --sampler-xla {args.sampler_xla}" if wanted else "")
  result = dict(command=command, grad_from=args.grad_from, devices=full_size.DEVICES,
                capacity_gib={"H100": H100_GIB, "TPU v5e": V5E_GIB}, rows=rows)
  with open(args.out or "results/bench/full_step.json", "w") as f:
    json.dump(result, f, indent=2)
  print(step_table(rows))
  return result


def step_table(rows: list[dict]) -> str:
  """Markdown: one line per group of runs with the same plan, its terms and the peak (GiB);
  with XLA's sampler plan, its sampling figure and the peak it gives. A run fits a chip when
  the larger peak does."""
  lines = ["| runs | policy | rows | sampler rows / device | persistent: params + ref + Adam + "
           "batch | sampling: weights + max(prefill, decode) | sampling, XLA | update: grads + "
           "Adam + FSDP + grad pass | **peak / device** (XLA sampler) | H100 80 | v5e 16 |",
           "|---|---|---:|---:|---|---|---:|---|---:|---|---|"]
  groups: dict[tuple, list[str]] = {}
  first: dict[tuple, dict] = {}
  for r in rows:
    key = (r["policy"], r["rows"], round(r["peak_gib"], 6), round(r["sampling_gib"], 6),
           round(r.get("peak_xla_gib", -1), 6))
    groups.setdefault(key, []).append(r["run"])
    first.setdefault(key, r)
  f = lambda x: f"{x:.1f}"  # noqa: E731
  for key, names in groups.items():
    r = first[key]
    p, u = r["persistent"], r["update"]
    pre, dec = sum(r["prefill"].values()), sum(r["decode"].values())
    w = sum(r["sampling_weights"].values())
    xla = r.get("sampler_xla")
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    lines.append(
        f"| {shown} | {r['policy']} | {r['rows']:,} | {r['sampler_rows_per_device']:g} | "
        f"{f(p['params'])} + {f(p['reference_params'])} + {f(p['adam_moments'])} + "
        f"{f(p['batch'])} = {f(r['persistent_gib'])} | {f(w)} + max({f(pre)}, {f(dec)}) = "
        f"{f(r['sampling_gib'])} | {f(xla['temp_gib']) if xla else '-'} | "
        f"{f(u['grad_accumulator'] + u['micro_grads'])} + "
        f"{f(u['adam_updates'])} + {f(u['fsdp_layer'])} + {f(u['grad_pass_temps'])} = "
        f"{f(r['update_gib'])} | **{f(r['peak_gib'])}**"
        + (f" ({f(r['peak_xla_gib'])})" if xla else "") + " | "
        f"{'fits' if r['fits']['H100 80'] else '**no**'} | "
        f"{'fits' if r['fits']['v5e 16'] else '**no**'} |")
  return "\n".join(lines)

if __name__ == "__main__":
  main()
