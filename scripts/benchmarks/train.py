"""``bench.py train``: one GRPO step of rlpost against TRL's ``GRPOTrainer``, and its time split.

Both sides train the same random-weight Qwen2-style policy (rlpost's weights exported with
``rlpost.models.hf.save_pretrained`` and loaded by ``transformers``) on the same arithmetic
prompts, with the same character vocabulary (a ``tokenizers`` WordLevel copy of
``rlpost.tokenizer.CharTokenizer``), the same reward (the graded arithmetic reward: rlpost
scores it in JAX inside the step, TRL calls ``rlpost.tasks.arithmetic.reference_reward``, the
Python oracle the JAX reward is tested against), and the same hyperparameters: P prompts x G
completions, at most N new tokens at temperature 1, one optimizer step of AdamW (lr 1e-4, no
weight decay, gradient clip 1.0), PPO clip 0.2, KL coefficient beta (0 and 0.04 by default).

A step is rollout + scoring + reference log-probs (beta > 0) + update. The two alternate: a
TRL callback runs one rlpost step after each TRL step, outside TRL's timed window. The first
step of each (compilation, allocator warm-up) is dropped; the table gives medians and the
min-max spread. With random weights both samplers run until every row has met EOS or N tokens,
so the decode length is set by the slowest row on both sides.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from scripts.benchmarks.common import (generation_flops, measure_matmul_peak, timed as _timed,
                                       training_flops)

# The policy: the sampler benchmark's 1m model on the character vocabulary (0.81M parameters).
POLICY = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384,
              qkv_bias=True, tie_embeddings=True)
TOY_POLICY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                  intermediate_size=64, qkv_bias=True, tie_embeddings=True)


def add_args(p) -> None:
  p.add_argument("--quick", action="store_true", help="toy model and batch (seconds)")
  p.add_argument("--prompts", type=int, default=16)
  p.add_argument("--group-size", type=int, default=8)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--betas", default="0,0.04", help="KL coefficients to measure (comma list)")
  p.add_argument("--repeats", type=int, default=5, help="timed steps per side and beta")
  p.add_argument("--no-trl", action="store_true", help="skip the baseline (any --peer)")
  p.add_argument("--peer", choices=("trl", "tunix"), default="trl",
                 help="the baseline: TRL's GRPOTrainer (the oracle extra) or Tunix's "
                      "GRPOLearner (the peers extra, its own environment)")
  p.add_argument("--torch-threads", type=int, default=0, help="0: os.cpu_count()")
  p.add_argument("--data-dir", default=None, help="task data directory (default: the trainer's)")
  p.add_argument("--pack-buckets", default="",
                 help="rlpost's padding-free update: comma list of RLConfig.pack_buckets "
                      "fractions (empty: the padded update)")


def _config(args, beta: float) -> dict:
  cfg = dict(task="arithmetic", graded_reward=True, sft_steps=0, recipe="grpo",
             recipe_args={"kl_coef": beta}, num_prompts=args.prompts, group_size=args.group_size,
             max_new_tokens=args.new_tokens, temperature=1.0, lr=1e-4, weight_decay=0.0,
             grad_clip=1.0, model=dict(POLICY), num_train=2000, num_test=100,
             eval_problems=0)
  if args.quick:
    cfg.update(model=dict(TOY_POLICY), num_train=200, num_test=40)
  if getattr(args, "pack_buckets", ""):
    cfg["pack_buckets"] = tuple(float(f) for f in args.pack_buckets.split(","))
  if args.data_dir:
    cfg["data_dir"] = args.data_dir
  return cfg


def char_tokenizer_for_hf():
  """A ``transformers`` fast tokenizer with exactly ``CharTokenizer``'s ids (one per char)."""
  import tokenizers
  import transformers
  from tokenizers import decoders, models, pre_tokenizers

  from rlpost.tokenizer import ALPHABET

  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(ALPHABET)}}
  backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
  backend.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
  backend.decoder = decoders.Fuse()
  backend.add_special_tokens(["<pad>", "<s>", "</s>"])
  return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                              bos_token="<s>", eos_token="</s>")


class _Interleave:
  """TRL callback: times each TRL step, then runs (and times) one rlpost step."""

  def __init__(self, rlpost_step):
    import transformers

    self.rlpost_step = rlpost_step
    self.trl, self.ours = [], []
    self.t0 = 0.0
    self.callback = type("Interleave", (transformers.TrainerCallback,), {
        "on_step_begin": lambda cb, *a, **k: self._begin(),
        "on_step_end": lambda cb, *a, **k: self._end()})()

  def _begin(self):
    self.t0 = time.perf_counter()

  def _end(self):
    self.trl.append(time.perf_counter() - self.t0)
    self.ours.append(self.rlpost_step())


def _trl_trainer(trainer, workdir: str, beta: float, args, steps: int, callback):
  """TRL GRPOTrainer on an exported copy of the rlpost trainer's initial policy."""
  import datasets
  import torch
  import transformers
  import trl

  from rlpost.models import hf
  from rlpost.tasks import arithmetic

  transformers.utils.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  datasets.disable_progress_bars()
  path = hf.save_pretrained(trainer.reference_model(), Path(workdir) / f"policy-{beta}", architecture="qwen2",
                            overwrite=True)
  records = trainer.records["train"][: args.prompts * (steps + 1)]
  data = datasets.Dataset.from_list([{"prompt": "<s>" + r["prompt"], "answer": r["answer"]}
                                     for r in records])
  n_max = trainer.max_new_tokens

  def reward(prompts, completions, completion_ids, answer, **_):
    del prompts
    return [arithmetic.reference_reward(c, len(ids) < n_max or ids[-1] == 2, a, graded=True)
            for c, ids, a in zip(completions, completion_ids, answer)]

  config = trl.GRPOConfig(
      output_dir=str(Path(workdir) / f"trl-{beta}"), use_cpu=True, report_to="none",
      save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
      per_device_train_batch_size=args.prompts * args.group_size,
      num_generations=args.group_size, max_completion_length=n_max, temperature=1.0,
      top_p=1.0, learning_rate=1e-4, lr_scheduler_type="constant", weight_decay=0.0,
      max_grad_norm=1.0, beta=beta, epsilon=0.2, num_iterations=1, loss_type="grpo",
      max_steps=steps, dataloader_num_workers=0)
  model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  out = trl.GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                        processing_class=char_tokenizer_for_hf(), callbacks=[callback])
  out.remove_callback(transformers.PrinterCallback)  # the end-of-training summary line
  # TRL's own split: generation, and generation + scoring + reference/old log-probs +
  # advantages; the rest of its step is the loss forward, backward and optimizer step.
  out.timings = {"generate": [], "generate_and_score": []}
  for name, attr in (("generate", "_generate"),
                     ("generate_and_score", "_generate_and_score_completions")):
    setattr(out, attr, _timed(getattr(out, attr), out.timings[name]))
  return out


def _peer_split(timings: dict, steps: list[float]) -> dict:
  """A peer's step split, medians over the timed steps (its first, warm-up step dropped):
  generation, then scoring + reference/old log-probs + advantages, then the rest (update)."""
  gen, prep = timings["generate"][1:], timings["generate_and_score"][1:]
  return {"generate_s": statistics.median(gen),
          "score_and_ref_s": statistics.median([p - g for p, g in zip(prep, gen)]),
          "update_s": statistics.median([t - p for t, p in zip(steps, prep)])}


def _flops(trainer, beta: float, peak_gflops: float, row: dict) -> dict:
  """The step's useful FLOPs, its time at this machine's matmul peak, and what that bounds.

  Sampling as ``generation_flops`` (every row decodes N tokens: with random weights the batch
  runs to the limit), the update as ``training_flops`` (with a reference forward when beta > 0).
  ``max_ratio_vs_peer`` (also ``max_ratio_vs_trl`` for TRL): the peer's measured step over the
  step's time at 100% of the peak, i.e. the largest speed-up any implementation doing the same
  work could show here.
  """
  cfg = trainer.model_cfg
  rows = trainer.cfg.num_prompts * trainer.cfg.group_size
  tp = int(trainer.train_data.prompt_tokens.shape[1])
  n = trainer.max_new_tokens
  sample = generation_flops(cfg, rows, tp, n)
  update = training_flops(cfg, rows, tp, n, reference=beta > 0)["update"]
  at_peak = (sample + update) / (peak_gflops * 1e9)
  out = {"sample": sample, "update": update, "peak_gflops": peak_gflops,
         "step_at_peak_s": at_peak,
         "rlpost_fraction_of_peak": at_peak / row["rlpost"]["median_s"]}
  peer = row.get("baseline", "trl")
  if row.get(peer):
    out[f"{peer}_fraction_of_peak"] = at_peak / row[peer]["median_s"]
    out["max_ratio_vs_peer"] = row[peer]["median_s"] / at_peak
    if peer == "trl":
      out["max_ratio_vs_trl"] = out["max_ratio_vs_peer"]
  return out


def _stats(times: list[float]) -> dict:
  med = statistics.median(times)
  return {"median_s": med, "min_s": min(times), "max_s": max(times),
          "spread": (max(times) - min(times)) / med, "seconds": times}


def run(args) -> dict:
  from rlpost.train import profile, rl

  repeats = 2 if args.quick else args.repeats
  if args.quick:
    args.prompts, args.group_size, args.new_tokens = 4, 4, 8
  betas = [float(b) for b in args.betas.split(",")]
  peer = args.peer
  have_peer = not args.no_trl
  if have_peer and peer == "tunix":
    from scripts.benchmarks import tunix_peer
    if not tunix_peer.available():
      print("Tunix baseline skipped: google-tunix is not installed (the peers extra)",
            flush=True)
      have_peer = False
  elif have_peer:
    try:
      import torch
      import trl  # noqa: F401
      torch.set_num_threads(args.torch_threads or os.cpu_count())
    except ImportError as e:
      print(f"TRL baseline skipped: {e}", flush=True)
      have_peer = False
  workdir = tempfile.mkdtemp(prefix="rlpost_bench_train_")
  peak = measure_matmul_peak(512 if args.quick else 2048, 3 if args.quick else 8)
  print(f"f32 matmul peak: {peak['gflops_best']:.1f} GFLOP/s", flush=True)
  results = []
  for beta in betas:
    trainer = rl.make_train(_config(args, beta), log=lambda s: None)
    state = [trainer.init_state()]
    lengths, shares = [], {}

    def rlpost_step():
      t0 = time.perf_counter()
      state[0], metrics = trainer.step(state[0])
      jax.block_until_ready((state[0], metrics))
      lengths.append(float(metrics["response_length"]))
      for k in ("real_tokens", "packed_slots"):  # padding-free update only
        if k in metrics:
          shares.setdefault(k, []).append(float(metrics[k]))
      return time.perf_counter() - t0

    t0 = time.perf_counter()
    rlpost_step()  # compile
    compile_s = time.perf_counter() - t0
    row = {"beta": beta, "params": trainer.model_cfg.num_params(), "compile_s": compile_s,
           "baseline": peer}
    if have_peer and peer == "tunix":
      tunix = tunix_peer.GRPOPeer(trainer, workdir, beta=beta, lr=1e-4, grad_clip=1.0,
                                  clip_eps=0.2, steps=repeats + 1,
                                  after_step=lambda: ours.append(rlpost_step()))
      ours = []
      tunix.train()
      ours, theirs = ours[1:], tunix.times[1:]
      if len(theirs) != repeats:
        raise RuntimeError(f"Tunix ran {len(tunix.times)} steps, expected {repeats + 1}")
      row["tunix"] = _stats(theirs)
      row["tunix"]["version"] = tunix_peer.describe(trainer.model_cfg)["version"]
      row["tunix"]["max_param_change"] = tunix.max_param_change()
      row["tunix"]["split"] = _peer_split(tunix.split, theirs)
    elif have_peer:
      inter = _Interleave(rlpost_step)
      trl_trainer = _trl_trainer(trainer, workdir, beta, args, repeats + 1, inter.callback)
      trl_trainer.train()
      ours, theirs = inter.ours[1:], inter.trl[1:]
      row["trl"] = _stats(theirs)
      row["trl"]["torch_threads"] = torch.get_num_threads()
      row["trl"]["split"] = _peer_split(trl_trainer.timings, theirs)
    else:
      ours = [rlpost_step() for _ in range(repeats)]
      row[peer] = None
    row["rlpost"] = _stats(ours)
    row["rlpost"]["mean_response_length"] = float(np.mean(lengths))
    # Shares of the padded slots: holding a real token, and computed by the packed update.
    row["rlpost"].update({f"mean_{k}_share": float(np.mean(v)) for k, v in shares.items()})
    row["ratio"] = row[peer]["median_s"] / row["rlpost"]["median_s"] if have_peer else None
    row["compilations"] = trainer.num_traces
    row["flops"] = _flops(trainer, beta, peak["gflops_best"], row)
    # The time split of the rlpost step (each part compiled on its own; see profile.py).
    row["split"] = profile.time_split(trainer, state[0], repeats=repeats)
    results.append(row)
    _print_row(row, args)
  print()
  print(format_table(results))
  return {"benchmark": "train", "matmul_peak": peak,
          "settings": {"quick": bool(args.quick), "prompts": args.prompts,
                       "group_size": args.group_size, "new_tokens": args.new_tokens,
                       "repeats": repeats, "betas": betas, "config": _config(args, betas[0]),
                       "peer": peer,
                       "order": f"alternating {peer} step, rlpost step; first of each dropped"},
          "results": results}


def _print_row(row: dict, args) -> None:
  peer = row["baseline"]
  trl_s = f"{row[peer]['median_s']:.3f} s" if row[peer] else "-"
  print(f"beta {row['beta']}: rlpost {row['rlpost']['median_s'] * 1e3:.1f} ms/step, "
        f"{peer} {trl_s}, "
        f"{args.prompts}x{args.group_size} rollouts, mean completion "
        f"{row['rlpost']['mean_response_length']:.1f} tokens, compilations "
        f"{row['compilations']}", flush=True)


def format_table(rows: list[dict]) -> str:
  peer = rows[0].get("baseline", "trl") if rows else "trl"
  name = {"trl": "TRL", "tunix": "Tunix"}[peer]
  lines = [f"| beta | rlpost ms/step (spread) | {name} ms/step (spread) | {name} / rlpost | "
           f"rlpost sample / score / update / fused | {name} generate / score+ref / update | "
           "GFLOP | ms at peak | rlpost % of peak | bound |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    r = dict(r, trl=r.get(peer))
    ours = f"{r['rlpost']['median_s'] * 1e3:,.1f} ({r['rlpost']['spread']:.0%})"
    theirs = (f"{r['trl']['median_s'] * 1e3:,.0f} ({r['trl']['spread']:.0%})" if r["trl"]
              else "-")
    ratio = f"{r['ratio']:.1f}x" if r["ratio"] else "-"
    s = r["split"]
    parts = " / ".join(f"{s[k + '_s'] * 1e3:.0f}" for k in ("sample", "score", "update",
                                                             "fused_step"))
    trl_parts = (" / ".join(f"{v * 1e3:.0f}" for v in r["trl"]["split"].values())
                 if r["trl"] else "-")
    f = r["flops"]
    bound = f"{f['max_ratio_vs_peer']:.1f}x" if "max_ratio_vs_peer" in f else "-"
    lines.append(f"| {r['beta']} | {ours} | {theirs} | {ratio} | {parts} | {trl_parts} | "
                 f"{(f['sample'] + f['update']) / 1e9:.1f} | {f['step_at_peak_s'] * 1e3:.0f} | "
                 f"{f['rlpost_fraction_of_peak']:.0%} | {bound} |")
  lines.append("(split columns in ms; rlpost's parts are each compiled on their own. GFLOP: "
               "useful work of the step; at peak: its time at the measured f32 matmul peak; "
               f"bound: {name}'s step over that, the most any implementation of the same work "
               "could gain here)")
  return "\n".join(lines)
