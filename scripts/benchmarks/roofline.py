"""Roofline of one step of every full-size run (``experiments/*/full.py``), from its config.

Pure arithmetic: nothing is compiled or run. For each run, the FLOPs and HBM bytes of each
phase of one step (sampling: prefill and decode; the reference policy's log-prob pass where
the recipe reads it; the update; the optimizer), and the step time they predict on one node of
8 x H100 SXM and of 8 x TPU v5e at the utilisations below. Every run is planned for 8 devices
(``full_size.DEVICES``, ``mesh_fsdp=8``) and the work is split evenly over them.

Worst case, on purpose: every completion runs to ``max_new_tokens`` and every prompt is
``max_prompt_tokens`` long (the prompt buffer is the longest prompt of the data, at most that),
and a dynamic allocation (DARS) makes every sampling call its plan allows. For this
implementation the worst case is also close to the typical one: the sampler's decode loop runs
until every row of its chunk has stopped (one long completion keeps the chunk's loop going), and
the update is padded (the full-size configs set no ``pack_buckets``), so its work is set by the
maximum lengths, not the mean.

Formulas (per row; N_mm = the layers' matmul weights, L x (E (H + 2K) hd + H hd E + 3 E I);
N_head = V E, the LM head, tied or not; d = H hd; T = Tp + N):

* forward of T tokens scoring S of them: 2 N_mm T + 2 N_head S + L x 4 T^2 d x c, with
  c = ATTENTION_CAUSAL[impl] (the plain attention computes the whole T x T square, the
  blockwise one skips fully masked tiles: about half). The embedding lookup costs no FLOPs.
* prefill (the sampler's cached path, plain attention, LM head on the last prompt token):
  forward(Tp, 1, c=1), at PREFILL_MFU of the peak.
* decode step at cache length s (the sampler runs N - 1 steps over ``decode_segments`` caches,
  each step reading its segment's whole cache): 2 N_mm + 2 N_head + L x 4 s d FLOPs per row;
  HBM bytes per device = the weights as this sampler reads them (``decode_weight_bytes``:
  float32, the attention projections whole, the MLP and LM head sharded) + the rows'
  KV cache (rows per device x s x L x 2 x K x hd x 2 bytes). Time per step = the larger of
  bytes / (HBM bandwidth x DECODE_HBM_UTIL) and FLOPs / (peak x DECODE_MFU).
* reference pass (recipes that read ref_logp, or log_confidence): forward(T, N, c) per row.
  No old-log-prob pass: with num_iterations > 1 the PPO ratio is taken against the sampler's
  log-probs (behaviour_logp), and none of these recipes asks for current_logp.
* update: num_iterations x UPDATE_PASSES x forward(T, N, c) per row (forward, the remat
  recompute, and a backward of two forwards: 8 N T for the weights).
* optimizer: ADAMW_BYTES x params / devices per optimizer update (read p, g, m, v; write p, m,
  v in float32) and ACCUM_BYTES x params / devices per micro-batch (the gradient accumulator),
  at DECODE_HBM_UTIL of the bandwidth.

Not modelled: communication (FSDP's weight all-gathers and gradient reduce-scatters per
micro-batch, the sampler's activation all-gathers), the host's reward scoring, compilation,
evaluation and checkpoints.

    python -m scripts.benchmarks.roofline [--out results/bench/roofline.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json

from experiments import full_size

EXPERIMENTS = ("mc_grpo", "ace", "dars")
DEVICES = full_size.DEVICES


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  bf16_flops: float  # dense bfloat16 matmul peak, FLOP/s
  hbm_bytes_per_s: float
  hbm_gib: float  # per chip, as the datasheet states it (GB), compared as GiB
  source: str


H100 = Chip("H100 SXM", 989e12, 3.35e12, 80.0,
            "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: BF16 Tensor Core 1,979 "
            "TFLOPS with sparsity (989 dense), GPU memory 80 GB, bandwidth 3.35 TB/s")
V5E = Chip("TPU v5e", 197e12, 819e9, 16.0,
           "Google Cloud TPU v5e documentation (system architecture), per chip: 197 TFLOP/s "
           "bf16, 16 GB HBM2, 819 GB/s")
CHIPS = (H100, V5E)

# Stated assumptions (not measured): the fractions of the peaks each phase reaches.
UPDATE_MFU = 0.40  # the update's and the reference pass's matmuls
PREFILL_MFU = 0.40
DECODE_MFU = 0.40  # decode FLOPs, where the step is compute-bound
DECODE_HBM_UTIL = 0.60  # fraction of HBM bandwidth the bandwidth-bound steps reach
UPDATE_PASSES = 4  # forward + remat recompute + backward (two forwards)
# What a decode step reads of the weights, per device: the sampler reads the float32 training
# parameters (rlpost.sampling makes no bfloat16 copy; each matmul converts its operand), and in
# XLA's plan of the call on 8 devices (full_memory --sampler-xla, BENCHMARKS.md "Memory per
# device") the attention projections are gathered whole before the decode loop while the MLP and
# LM-head weights stay sharded (the rows' activations are gathered to them instead). So each
# step reads PARAM_BYTES x (attention projections + (MLP + head) / devices). A sampler holding a
# whole bfloat16 copy would read 2 x (all matmul weights + head) instead: for ACE's 7B, 15.2 GB
# against 6.4 here.
PARAM_BYTES = 4
KV_BYTES = 2  # the KV cache is in the compute dtype, bfloat16
ADAMW_BYTES = 28  # float32: read param, grad, two moments (16), write param, moments (12)
ACCUM_BYTES = 8  # float32 gradient accumulator: read + write per micro-batch
ATTENTION_CAUSAL = {"xla": 1.0, "blockwise": 0.5, "cudnn": 0.5}


def arch(policy: str) -> dict:
  """The widths of ``experiments.full_size.POLICIES[policy]`` (head_dim = hidden / heads)."""
  a = dict(full_size.POLICIES[policy])
  a["head_dim"] = a["hidden_size"] // a["num_heads"]
  return a


def param_counts(a: dict) -> dict:
  """Parameter counts of a Qwen2-style decoder (q/k/v biases, SwiGLU, RMSNorm) of widths ``a``.

  layer: one layer's parameters; attention: its q/k/v/o weights and biases; layer_matmul: its
  matmul weights; head: the LM head's V x E (the embedding itself when tied); total: every
  parameter (embedding, layers, final norm, an untied head)."""
  e, h, k, hd, i, v = (a["hidden_size"], a["num_heads"], a["num_kv_heads"], a["head_dim"],
                       a["intermediate_size"], a["vocab_size"])
  attn_w = e * (h + 2 * k) * hd + h * hd * e
  attention = attn_w + (h + 2 * k) * hd  # + q/k/v biases
  mlp = 3 * e * i
  layer = attention + mlp + 2 * e  # + two norms
  layers = a["num_layers"] * layer
  embed = v * e
  total = embed + layers + e + (0 if a["tie_embeddings"] else v * e)
  return dict(layer=layer, attention=attention, layer_matmul=attn_w + mlp, layers=layers,
              layers_matmul=a["num_layers"] * (attn_w + mlp),
              attention_matmul=a["num_layers"] * attn_w, mlp_matmul=a["num_layers"] * mlp,
              embed=embed, head=v * e, total=total)


def decode_weight_bytes(p: dict, devices: int = DEVICES) -> float:
  """Weight bytes a decode step reads per device (``PARAM_BYTES``: the attention projections
  whole, the MLP and the LM head sharded over ``devices``)."""
  return PARAM_BYTES * (p["attention_matmul"] + (p["mlp_matmul"] + p["head"]) / devices)


def full_runs() -> list[tuple[str, str, dict]]:
  """(experiment, run name, RLConfig dict) of every ``experiments/*/full.py`` run."""
  out = []
  for exp in EXPERIMENTS:
    full = importlib.import_module(f"experiments.{exp}.full").FULL
    out.extend((exp, name, cfg) for name, cfg in full.items())
  return out


def policy_name(cfg: dict) -> str:
  return cfg["policy"].rstrip("/").split("/")[-1]


def needs_reference(cfg: dict) -> bool:
  """Whether a step runs the reference policy's log-prob pass: the recipe reads ref_logp
  (a KL penalty, ACE's confidence), or ``log_confidence`` asks for it
  (``rlpost.train.rl._make_fns``)."""
  from rlpost.train.rl_config import RLConfig, build_recipe

  rc = RLConfig.upgrade(dict(cfg))
  known = {f.name for f in dataclasses.fields(RLConfig)}
  rc = dataclasses.replace(RLConfig(), **{k: v for k, v in rc.items() if k in known})
  return "ref_logp" in build_recipe(rc, rc.max_new_tokens).requires or bool(rc.log_confidence)


def segments(prompt: int, completion: int) -> list[tuple[int, int]]:
  """(decode steps, cache slots) of each decode segment of the sampler (``decode_segments``
  with its default number of segments)."""
  from rlpost import sampling

  n = sampling.SamplingConfig(max_new_tokens=completion).num_segments
  return [(stop - first, slots)
          for first, stop, slots in sampling.decode_segments(prompt, completion, n)]


def sampling_chunks(cfg: dict) -> list[int]:
  """Rows of each sequential sampler call of a step: every allocation call, split into
  ``rollout_chunk`` rows when that is smaller than the call."""
  chunk = cfg.get("rollout_chunk", 0)
  out = []
  for rows in full_size.sampling_plan(cfg).calls:
    c = chunk if 0 < chunk < rows else rows
    out.extend([c] * (rows // c))
  return out


def forward_flops(a: dict, tokens: int, scored: int, causal: float) -> float:
  """FLOPs of one row's forward pass over ``tokens`` tokens, the LM head on ``scored``."""
  p = param_counts(a)
  d = a["num_heads"] * a["head_dim"]
  return (2 * p["layers_matmul"] * tokens + 2 * p["head"] * scored +
          a["num_layers"] * 4 * tokens ** 2 * d * causal)


def kv_bytes_per_slot(a: dict) -> int:
  """KV-cache bytes of one row and one cache slot, every layer (k and v)."""
  return a["num_layers"] * 2 * a["num_kv_heads"] * a["head_dim"] * KV_BYTES


def step_work(cfg: dict, devices: int = DEVICES) -> dict:
  """FLOPs and bytes of one step of ``cfg``, per phase (totals over the devices, except the
  decode, which is listed per decode step and device)."""
  a = arch(policy_name(cfg))
  p = param_counts(a)
  tp, n = cfg["max_prompt_tokens"], cfg["max_new_tokens"]
  plan = full_size.sampling_plan(cfg)
  rows = plan.rows
  impl = cfg.get("model", {}).get("attention", "xla")
  causal = ATTENTION_CAUSAL[impl]
  chunks = sampling_chunks(cfg)
  d = a["num_heads"] * a["head_dim"]
  segs = segments(tp, n)
  weights = decode_weight_bytes(p, devices)
  decode = []  # (decode steps over the step, FLOPs per device-step, bytes per device-step)
  for c in sorted(set(chunks)):
    count = chunks.count(c)
    per_dev = c / devices
    for steps, slots in segs:
      flops = per_dev * (2 * p["layers_matmul"] + 2 * p["head"] +
                         a["num_layers"] * 4 * slots * d)
      decode.append(dict(rows_per_device=per_dev, steps=steps * count, cache_slots=slots,
                         flops=flops, bytes=weights + per_dev * slots * kv_bytes_per_slot(a)))
  ref = needs_reference(cfg)
  it = cfg.get("num_iterations", 1)
  mbs = cfg.get("num_minibatches", 1)
  accum = cfg.get("grad_accum", 1)
  row_fwd = forward_flops(a, tp + n, n, causal)
  return dict(
      policy=policy_name(cfg), params=p["total"], rows=rows, prompt_tokens=tp,
      completion_tokens=n, sampler_calls=len(chunks), reference_pass=ref,
      num_iterations=it, optimizer_updates=it * mbs, micro_batches=it * mbs * accum,
      prefill_flops=sum(chunks) * forward_flops(a, tp, 1, 1.0),
      decode=decode,
      decode_flops=sum(x["steps"] * x["flops"] * devices for x in decode),
      reference_flops=rows * row_fwd if ref else 0.0,
      update_flops=it * rows * UPDATE_PASSES * row_fwd,
      optimizer_bytes=(it * mbs * ADAMW_BYTES + it * mbs * accum * ACCUM_BYTES) * p["total"],
  )


def predict(work: dict, chip: Chip, devices: int = DEVICES) -> dict:
  """Seconds per phase of one step on ``devices`` chips of ``chip``."""
  peak, bw = chip.bf16_flops, chip.hbm_bytes_per_s
  decode = sum(x["steps"] * max(x["bytes"] / (bw * DECODE_HBM_UTIL),
                                x["flops"] / (peak * DECODE_MFU)) for x in work["decode"])
  out = dict(prefill=work["prefill_flops"] / devices / (peak * PREFILL_MFU), decode=decode,
             reference=work["reference_flops"] / devices / (peak * UPDATE_MFU),
             update=work["update_flops"] / devices / (peak * UPDATE_MFU),
             optimizer=work["optimizer_bytes"] / devices / (bw * DECODE_HBM_UTIL))
  out["step"] = sum(out.values())
  return out


def assumptions() -> dict:
  """The named constants of the model, for the JSON."""
  return dict(
      devices=DEVICES, chips={c.name: dataclasses.asdict(c) for c in CHIPS},
      update_mfu=UPDATE_MFU, prefill_mfu=PREFILL_MFU, decode_mfu=DECODE_MFU,
      decode_hbm_util=DECODE_HBM_UTIL, update_passes=UPDATE_PASSES,
      decode_param_bytes=PARAM_BYTES,
      decode_weights="attention projections whole, MLP and LM head / devices",
      kv_bytes=KV_BYTES, adamw_bytes=ADAMW_BYTES,
      accum_bytes=ACCUM_BYTES, attention_causal=ATTENTION_CAUSAL,
      lengths="worst case: every prompt max_prompt_tokens, every completion max_new_tokens")


def rows_of_runs() -> list[dict]:
  """One row per full-size run: its work and the predicted seconds on each chip."""
  out = []
  for exp, name, cfg in full_runs():
    work = step_work(cfg)
    out.append(dict(run=f"{exp}:{name}", **work,
                    decode_steps=sum(x["steps"] for x in work["decode"]),
                    seconds={c.name: predict(work, c) for c in CHIPS}))
  return out


def _fmt_s(s: float) -> str:
  return f"{s:,.0f}" if s >= 10 else f"{s:.1f}"


def table(rows: list[dict]) -> str:
  """Markdown: one line per group of runs with the same predictions."""
  head = ("| runs | policy | rows | prompt + completion | ref pass | PFLOP (prefill / decode / "
          "ref / update) | " + " | ".join(f"{c.name} s: sample / ref / update / opt / **step**"
                                            for c in CHIPS) + " |")
  lines = [head, "|---|---|---:|---|---|---|" + "---|" * len(CHIPS)]
  groups: dict[tuple, list[str]] = {}
  first: dict[tuple, dict] = {}
  for r in rows:
    key = (r["policy"], r["rows"], r["prompt_tokens"], r["completion_tokens"],
           r["reference_pass"], round(r["seconds"][H100.name]["step"], 6))
    groups.setdefault(key, []).append(r["run"])
    first.setdefault(key, r)
  for key, names in groups.items():
    r = first[key]
    pf = " / ".join(f"{r[k] / 1e15:,.1f}" for k in ("prefill_flops", "decode_flops",
                                                     "reference_flops", "update_flops"))
    cols = []
    for c in CHIPS:
      s = r["seconds"][c.name]
      cols.append(" / ".join(_fmt_s(x) for x in (s["prefill"] + s["decode"], s["reference"],
                                                 s["update"], s["optimizer"])) +
                  f" / **{_fmt_s(s['step'])}**")
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    lines.append(f"| {shown} | {r['policy']} | {r['rows']:,} | {r['prompt_tokens']:,} + "
                 f"{r['completion_tokens']:,} | {'yes' if r['reference_pass'] else 'no'} | "
                 f"{pf} | " + " | ".join(cols) + " |")
  return "\n".join(lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="results/bench/roofline.json")
  args = parser.parse_args(argv)
  rows = rows_of_runs()
  result = dict(command="python -m scripts.benchmarks.roofline", assumptions=assumptions(),
                rows=rows)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)
  print(table(rows))
  return result


if __name__ == "__main__":
  main()
