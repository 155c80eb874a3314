"""One-GPU check of a full-size step: the sampler and a GRPO update of a Qwen2.5-0.5B-shaped
policy at MC-GRPO MATH's row lengths, with memory measured beside XLA's plan.

On one GPU (an H100 80 GB; at most 10 minutes, the script stops itself at ``--time-limit``)::

    python -m scripts.benchmarks.accelerator_check --out results/bench/accelerator_check_h100.json

What it builds: a randomly initialised policy of Qwen2.5-0.5B's shape (Qwen2: hidden 896, 24
layers, 14 query and 2 key-value heads, MLP 4,864, vocabulary 151,936, tied embeddings, q/k/v
biases, RoPE base 1e6) with the full-size runs' model settings (``experiments.full_size.common``:
bfloat16 matmuls over float32 parameters, layers stored stacked, remat, the LM head in 512-token
chunks), and the recipe, optimizer and step settings of the full-size arm
``mc_grpo:math-G2-mean`` (GRPO: KL 0.04 to the reference, clip 0.2; AdamW after global-norm
clipping). Attention of the training passes: ``--attention`` (default ``cudnn`` on an NVIDIA
GPU, ``blockwise`` elsewhere). One device, the first. Nothing is downloaded and no data is read:
prompts and completions are random tokens, rewards alternate 1, 0 within each group of 2.

What it measures, in this order (the update first, so that the device's peak memory after it
is the update's own):

1. update: the trainer's own update function (``rlpost.train.rl.make_train`` from explicit
   parts, ``fns.update``: the reference policy's log-probs, the recipe's advantages, then the
   optimizer step of ``rlpost.train.update.make_update``) on one micro-batch of ``--train-rows``
   rows (default 4, the full-size plan's rows per device) of prompt + completion tokens, one
   epoch, one mini-batch, no accumulation. Trace + lower and compile seconds, the first call,
   then a timed second call (seconds, row tokens per second, useful TFLOP/s of
   ``scripts.benchmarks.common.training_flops``), the loss and the largest parameter change.
   The learning rate is the arm's, held constant (its schedule starts at 0 for the warmup).
2. sampler: ``rlpost.sampling.sample`` as the trainer calls it (one PRNG key per row) on
   ``--rows`` prompts (default 64, the arm's rows per step) of ``--prompt`` tokens, generating
   ``--completion`` tokens each (no stop token, so every row runs to the end): compile seconds,
   a warm-up call, then a timed call (seconds, generated tokens per second, useful TFLOP/s of
   ``common.generation_flops``).
3. plan: XLA's memory analysis of the same programs compiled for the CPU with abstract inputs
   (nothing runs), which is how ``scripts/benchmarks/full_memory.py`` plans the full-size runs
   (a run on the CPU has compiled them already: those compilations are the plan). ``cudnn``
   attention is planned as ``blockwise``, of the same memory class (cuDNN adds its mask bias,
   [B, 1, T, S] in bfloat16: 98 MiB at 4 rows of 3,584 tokens); a GPU's compiler plans its own
   buffers, which is what the comparison shows. Also the gradient pass alone as
   ``full_memory.analyse`` compiles it (``jax.grad`` of a loss over ``completion_scores``), for
   lining up with ``results/bench/full_memory.json``.

Memory, per phase: ``measured`` holds the compiled program's ``memory_analysis()`` on the
device that ran it (argument, output, alias, temporary bytes) and ``device.memory_stats()`` where
the backend has it (GPUs: bytes in use before and after, the process's peak so far, the
allocator's limit; the peak cannot be reset, so the sampler's peak is at least the update's);
``planned`` holds the CPU plan of the same program. Compare the results with
``results/bench/full_memory.json`` and with the roofline prediction of
``scripts/benchmarks/roofline.py``.

Output: one JSON file (``--out``; default ``$OUT/accelerator_check.json`` when the environment
sets OUT, else ``results/bench/accelerator_check.json``), written after every step, with
``complete`` true once every phase ran. An existing file is never overwritten (exit status 2),
nor is a bad flag accepted (one line, exit 2). At ``--time-limit`` seconds (default 540) the
script stops where it is, the file keeping what was measured (``complete`` false, ``stopped``
saying where), and exits with status 3. ``--tiny`` runs a tiny model on short rows (about a
minute on a CPU, mostly compilation; what ``tests/test_accelerator_check.py`` runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import shlex
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from experiments import full_size
from rlpost import sampling, sharding
from rlpost.models import attention as attention_lib
from rlpost.models import transformer as tfm
from rlpost.models import scoring
from rlpost.models.policy import Policy
from rlpost.rollouts import allocate
from rlpost.tasks import base as task_base
from rlpost.tokenizer import CharTokenizer
from rlpost.train import rl
from rlpost.train.rl_config import RLConfig, build_recipe, learning_rate
from scripts.benchmarks import common

ARM = ("mc_grpo", "math-G2-mean")
# Qwen2.5-0.5B's published config.json (Qwen2ForCausalLM).
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, num_layers=24, num_heads=14,
                  num_kv_heads=2, intermediate_size=4864, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, qkv_bias=True, tie_embeddings=True)
# The same family's flags at a width a CPU runs in seconds.
TINY = dict(QWEN25_05B, vocab_size=512, hidden_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, intermediate_size=128)
TINY_SIZES = dict(rows=4, train_rows=4, prompt=16, completion=48, logits_chunk=16)
MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")
EXIT_STOPPED = 3


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    print(f"accelerator_check: {message}", file=sys.stderr)
    raise SystemExit(2)


def arm_config() -> RLConfig:
  """The RLConfig of the full-size arm ``ARM`` (unvalidated: its paths are placeholders)."""
  exp, name = ARM
  cfg = RLConfig.upgrade(dict(importlib.import_module(f"experiments.{exp}.full").FULL[name]))
  known = {f.name for f in dataclasses.fields(RLConfig)}
  return dataclasses.replace(RLConfig(), **{k: v for k, v in cfg.items() if k in known})


def parse(argv, cfg: RLConfig) -> argparse.Namespace:
  parser = _Parser(prog="python -m scripts.benchmarks.accelerator_check",
                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None,
                      help="the JSON to write (never overwritten); default "
                           "$OUT/accelerator_check.json or results/bench/accelerator_check.json")
  parser.add_argument("--tiny", action="store_true",
                      help="a tiny model on short rows (a CPU run of about a minute, mostly "
                           "compilation)")
  parser.add_argument("--rows", type=int, default=None,
                      help=f"sampler rows (default {cfg.allocation_plan().rows}, the arm's rows "
                           "per step)")
  parser.add_argument("--train-rows", type=int, default=None,
                      help=f"update rows (default {full_size.TRAIN_ROWS_PER_DEVICE}, a "
                           "micro-batch of the full-size plan); a multiple of the group size")
  parser.add_argument("--prompt", type=int, default=None,
                      help=f"prompt tokens per row (default {cfg.max_prompt_tokens})")
  parser.add_argument("--completion", type=int, default=None,
                      help=f"completion tokens per row (default {cfg.max_new_tokens})")
  parser.add_argument("--attention", default=None, choices=attention_lib.IMPLS,
                      help="attention of the training passes (default cudnn on an NVIDIA GPU, "
                           "else blockwise)")
  parser.add_argument("--time-limit", type=float, default=540.0, metavar="SECONDS",
                      help="stop cleanly, keeping what was measured, after this many seconds "
                           "(default 540)")
  args = parser.parse_args(argv)
  sizes = (TINY_SIZES if args.tiny else
           dict(rows=cfg.allocation_plan().rows, train_rows=full_size.TRAIN_ROWS_PER_DEVICE,
                prompt=cfg.max_prompt_tokens, completion=cfg.max_new_tokens,
                logits_chunk=cfg.logits_chunk))
  for name in ("rows", "train_rows", "prompt", "completion"):
    value = getattr(args, name)
    if value is None:
      setattr(args, name, sizes[name])
    elif value < 1:
      parser.error(f"--{name.replace('_', '-')} must be a positive int, got {value}")
  args.logits_chunk = sizes["logits_chunk"]
  if args.train_rows % cfg.group_size:
    parser.error(f"--train-rows {args.train_rows} is not a multiple of the arm's group size "
                 f"{cfg.group_size}")
  if not args.time_limit > 0:
    parser.error(f"--time-limit must be positive, got {args.time_limit}")
  backend = jax.default_backend()
  if args.attention is None:
    args.attention = "cudnn" if cuda(jax.devices()[0]) else "blockwise"
  elif args.attention == "cudnn" and backend != "gpu":
    parser.error(f"--attention cudnn needs a GPU; the default backend is {backend!r}")
  try:
    jax.devices("cpu")
  except RuntimeError:
    parser.error("the memory plan compiles for JAX's CPU backend, which JAX_PLATFORMS leaves "
                 "out; add cpu to it")
  return args


def cuda(device) -> bool:
  """Whether ``device`` is an NVIDIA GPU (where cuDNN attention runs)."""
  version = str(getattr(getattr(device, "client", None), "platform_version", "")).lower()
  return device.platform == "gpu" and "rocm" not in version


def default_out() -> str:
  out = os.environ.get("OUT")
  return (os.path.join(out, "accelerator_check.json") if out
          else "results/bench/accelerator_check.json")


def model_config(args, cfg: RLConfig) -> tfm.TransformerConfig:
  shape = TINY if args.tiny else QWEN25_05B
  model = dict(cfg.model or {}, attention=args.attention)
  keep = {f.name for f in dataclasses.fields(tfm.TransformerConfig)}
  return tfm.TransformerConfig(**shape, **{k: v for k, v in model.items() if k in keep},
                               max_seq_len=args.prompt + args.completion)


class _Unscored(task_base.Task):
  """A task that is never scored: the check gives the update its rewards, and ``make_train``'s
  parts only keep the task's scorer for a step's rollouts."""

  name = "accelerator_check"
  character_alphabet = False

  def load(self, log):
    return {"train": [], "test": []}

  def score(self, completion, finished, record):
    raise RuntimeError("accelerator_check: rows are not scored")


def optimizer(cfg: RLConfig) -> optax.GradientTransformation:
  """The trainer's optimizer for ``cfg`` (global-norm clipping, then AdamW), its learning rate
  held constant."""
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip),
      optax.adamw(learning_rate(lr=cfg.lr, schedule="constant", warmup_steps=0, total_steps=1),
                  b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))


def make_fns(model_cfg: tfm.TransformerConfig, graphdef, cfg: RLConfig, spec: rl.StepSpec,
             device) -> rl.TrainFns:
  """The trainer's pure functions (``rl.make_train`` from explicit parts) for one device:
  the arm's recipe and optimizer (its learning rate held constant), a placeholder task."""
  recipe = build_recipe(cfg, spec.max_new_tokens)
  # The update neither samples nor scores: the tokenizer and the task arrays are read for their
  # types and shapes only.
  policy = Policy(graphdef, None, CharTokenizer(), (), 0, model_cfg)
  empty = task_base.TaskArrays(np.zeros((1, 1), np.int32), np.ones((1, 1), bool),
                               np.zeros((1, 1), np.int32), np.zeros((1,), np.int32),
                               np.zeros((1,), np.int32))
  task = rl.TaskData(_Unscored(None), {"train": [], "test": []}, empty, empty)
  mesh = sharding.make_mesh(devices=[device])
  return rl.make_train(policy, task, recipe, "plain", optimizer(cfg), mesh, spec=spec)


def update_program(fns: rl.TrainFns):
  """``(state, allocation, ref_params, key data) -> (state, metrics)``: the trainer's update
  with the step's keys split as ``fns.step`` splits them."""
  def step(state, alloc, ref_params, key_data):
    k_adv, k_mb = jax.random.split(jax.random.wrap_key_data(key_data))
    return fns.update(state, alloc, ref_params, k_adv, k_mb)
  return jax.jit(step)


def sampler_program(graphdef, scfg: sampling.SamplingConfig, rows: int):
  """``(params, prompts, prompt mask, key data) -> SampleOutput``, one key per row as the
  trainer's sampler draws them."""
  def run(params, prompts, pmask, key_data):
    keys = jax.random.split(jax.random.wrap_key_data(key_data), rows)
    return sampling.sample(graphdef, params, prompts, pmask, keys, cfg=scfg)
  return jax.jit(run)


def gradient_pass(graphdef, chunk: int):
  """The program ``scripts/benchmarks/full_memory.py`` plans: ``jax.grad`` of a policy-gradient
  loss over ``completion_scores`` with remat and the LM head in chunks."""
  def loss(w, pt, pm, ct, cm, adv):
    logp, _ = scoring.completion_scores(nnx.merge(graphdef, w), pt, pm, ct, cm, logits_chunk=chunk,
                                        remat=True)
    return -jnp.sum(logp * adv) / jnp.maximum(jnp.sum(cm), 1)
  return jax.jit(jax.grad(loss))


def synthetic_allocation(rng, rows: int, group: int, prompt: int, completion: int,
                         vocab: int) -> allocate.Allocation:
  """An allocation of ``rows`` full-length rows in groups of ``group``: random tokens, sampler
  log-probs of -log V (a freshly initialised policy is close to uniform), rewards 1, 0, ..."""
  n = completion
  tokens = rng.integers(0, vocab, (rows, n), dtype=np.int32)
  logp = np.full((rows, n), -math.log(vocab), np.float32)
  out = sampling.SampleOutput(
      tokens=tokens, mask=np.ones((rows, n), bool), lengths=np.full((rows,), n, np.int32),
      finish_reason=np.full((rows,), sampling.FINISH_LENGTH, np.int32), logprobs=logp,
      policy_logprobs=logp, num_steps=np.int32(n))
  rewards = (np.arange(rows) % group == 0).astype(np.float32)
  ro = allocate.Rollouts(np.arange(rows, dtype=np.int32),
                         rng.integers(0, vocab, (rows, prompt), dtype=np.int32),
                         np.ones((rows, prompt), bool), out, rewards, rewards >= 1.0)
  return allocate.Allocation(ro, np.repeat(np.arange(rows // group, dtype=np.int32), group),
                             np.ones((rows,), bool), np.int32(rows // group), {})


def abstract(tree, device):
  """``tree``'s arrays as ``jax.ShapeDtypeStruct``s placed on ``device``."""
  put = jax.sharding.SingleDeviceSharding(device)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=put), tree)


def compiled_memory(compiled) -> dict | None:
  """Bytes of a compiled program's ``memory_analysis()``; ``total`` = argument + output - alias
  + temp (what it holds at once, at most)."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  out = {f"{k}_bytes": int(getattr(stats, f"{k}_size_in_bytes")) for k in MEMORY_FIELDS}
  out["total_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"]
                        + out["temp_bytes"])
  return out


def device_memory(device) -> dict | None:
  """The allocator's bytes in use, peak so far and limit, where the backend reports them."""
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 - a backend without statistics
    return None
  if not stats:
    return None
  return {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
          if k in stats}


def compile_timed(jitted, args) -> tuple:
  """(compiled program, trace + lower seconds, compile seconds)."""
  t0 = time.perf_counter()
  lowered = jitted.lower(*args)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  return compiled, t1 - t0, time.perf_counter() - t1


def call_timed(fn, *args) -> tuple:
  """(result, seconds until it is computed)."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t0


def param_change(before, after) -> float:
  """The largest |after - before| over every parameter."""
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), after, before))
  return float(jnp.max(jnp.stack(diffs)))


class Report:
  """The output file: claimed at start (never an existing one), rewritten whole after each
  step, and written one last time by the time limit's watchdog if it fires."""

  def __init__(self, path: str, result: dict):
    self.path, self.result = path, result
    self.lock = threading.Lock()
    self.phase = "setup"

  def claim(self) -> bool:
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(self.result, f, indent=2)
    return True

  def merge(self, *path: str, **fields) -> dict:
    """Merge ``fields`` into the dict at ``path`` of the result (made if missing), then write
    the file; returns that dict."""
    with self.lock:
      node = self.result
      for key in path:
        node = node.setdefault(key, {})
      node.update(fields)
      self._write()
    return node

  def _write(self) -> None:
    tmp = f"{self.path}.tmp"
    with open(tmp, "w") as f:
      json.dump(self.result, f, indent=2)
    os.replace(tmp, self.path)

  def stop(self, reason: str) -> None:
    with self.lock:
      self.result.update(complete=False, stopped=reason)
      self._write()
    print(f"accelerator_check: stopped: {reason}; wrote {self.path}", flush=True)


def main(argv=None) -> int:
  start = time.perf_counter()
  cfg = arm_config()
  try:
    args = parse(argv, cfg)
  except SystemExit as e:
    return int(e.code or 0)
  out = args.out or default_out()
  if os.path.exists(out):
    print(f"accelerator_check: {out} exists; refusing to overwrite it (choose another --out)",
          file=sys.stderr)
    return 2
  device = jax.devices()[0]
  model_cfg = model_config(args, cfg)
  group = cfg.group_size
  spec = rl.StepSpec.of(cfg, args.completion)._replace(
      num_prompts=args.train_rows // group, num_iterations=1, num_minibatches=1, grad_accum=1,
      rollout_chunk=0, logits_chunk=args.logits_chunk)
  argv_text = " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
  result = dict(
      command=f"python -m scripts.benchmarks.accelerator_check {argv_text}".strip(),
      backend=jax.default_backend(), device_kind=device.device_kind, device=str(device),
      devices=jax.device_count(), jax=jax.__version__, time_limit_s=args.time_limit,
      model=dict(shape="tiny" if args.tiny else "Qwen2.5-0.5B",
                 config=dataclasses.asdict(model_cfg), params_from_config=model_cfg.num_params()),
      arm=dict(name=":".join(ARM), recipe=cfg.recipe, recipe_args=cfg.recipe_args,
               lr=cfg.lr, lr_schedule="constant (the arm's warmup starts at 0)",
               grad_clip=cfg.grad_clip, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay,
               group_size=group, spec=spec._asdict()),
      sizes=dict(rows=args.rows, train_rows=args.train_rows, prompt=args.prompt,
                 completion=args.completion),
      compare_with=["results/bench/full_memory.json", "scripts/benchmarks/roofline.py"],
      phases={}, plan={}, complete=False, stopped=None)
  report = Report(out, result)
  if not report.claim():
    print(f"accelerator_check: {out} exists; refusing to overwrite it (choose another --out)",
          file=sys.stderr)
    return 2
  left = lambda: args.time_limit - (time.perf_counter() - start)  # noqa: E731

  def fire():
    report.stop(f"time limit of {args.time_limit:g} s reached during {report.phase}")
    os._exit(EXIT_STOPPED)

  watchdog = threading.Timer(max(left(), 0.0), fire)
  watchdog.daemon = True
  watchdog.start()
  try:
    return run(args, cfg, model_cfg, spec, device, report, left)
  except Exception as e:
    report.merge(stopped=f"error during {report.phase}: {type(e).__name__}: {e}"[:2000])
    raise
  finally:
    watchdog.cancel()


def run(args, cfg, model_cfg, spec, device, report: Report, left) -> int:
  t0 = time.perf_counter()
  model = tfm.init_model(model_cfg, seed=0)
  graphdef, params = nnx.split(model)
  del model
  params = jax.block_until_ready(params)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  report.merge("model", params=count, init_s=time.perf_counter() - t0)
  print(f"model {report.result['model']['shape']}: {count:,} parameters, "
        f"{jax.default_backend()} ({device.device_kind})", flush=True)
  rng = np.random.default_rng(0)
  group, v = cfg.group_size, model_cfg.vocab_size
  cpu = jax.devices("cpu")[0]

  def stop_unless(seconds: float, what: str) -> bool:
    if left() >= seconds:
      return False
    report.stop(f"{left():.0f} s left of the time limit, too few for {what}")
    return True

  # 1. The trainer's update on one micro-batch.
  report.phase = "update"
  memory0 = device_memory(device)
  fns = make_fns(model_cfg, graphdef, cfg, spec, device)
  state0 = fns.init(params, 0)
  alloc = jax.device_put(synthetic_allocation(rng, args.train_rows, group, args.prompt,
                                              args.completion, v), device)
  key = jax.device_put(jax.random.key_data(jax.random.key(1)), device)
  update_args = (state0, alloc, params, key)
  update_shapes = abstract(update_args, cpu)
  compiled, lower_s, compile_s = compile_timed(update_program(fns), update_args)
  tokens = args.train_rows * (args.prompt + args.completion)
  report.merge("phases", "update", rows=args.train_rows, tokens=tokens, trace_lower_s=lower_s,
               compile_s=compile_s)
  report.merge("phases", "update", "memory", "measured", compiled=compiled_memory(compiled),
               device_before=memory0)
  (state1, metrics1), first_s = call_timed(compiled, *update_args)
  report.merge("phases", "update", first_run_s=first_s, loss_first=float(metrics1["loss"]))
  if stop_unless(1.5 * first_s + 1.0, "the timed update call"):
    return EXIT_STOPPED
  (state, metrics), run_s = call_timed(compiled, state1, alloc, params, key)
  flops = common.training_flops(model_cfg, args.train_rows, args.prompt, args.completion,
                                reference=True)["update"]
  report.merge("phases", "update", "memory", "measured", device_after=device_memory(device))
  phase = report.merge(
      "phases", "update", run_s=run_s, tokens_per_s=tokens / run_s,
      useful_tflop_per_s=flops / run_s / 1e12, loss=float(metrics["loss"]),
      grad_norm=float(metrics["grad_norm"]), logp_mismatch=float(metrics["logp_mismatch"]),
      metrics={k: float(x) for k, x in metrics.items()},
      param_change_max_abs=param_change(params, state.params))
  print(f"update: compile {compile_s:.1f} s, step {run_s:.3f} s, {tokens / run_s:,.0f} "
        f"tokens/s, loss {phase['loss']:.4g}", flush=True)
  del state0, state1, state, metrics1, metrics, alloc, compiled

  # 2. The sampler.
  report.phase = "sampler"
  if stop_unless(1.0, "the sampler"):
    return EXIT_STOPPED
  scfg = sampling.SamplingConfig(max_new_tokens=args.completion, temperature=cfg.temperature,
                                 top_p=cfg.top_p, stop_tokens=(), pad_id=0)
  prompts = jax.device_put(rng.integers(0, v, (args.rows, args.prompt), dtype=np.int32), device)
  pmask = jax.device_put(np.ones((args.rows, args.prompt), bool), device)
  sample_args = (params, prompts, pmask, key)
  sample_shapes = abstract(sample_args, cpu)
  memory0 = device_memory(device)
  compiled, lower_s, compile_s = compile_timed(
      sampler_program(graphdef, scfg, args.rows), sample_args)
  report.merge("phases", "sampler", rows=args.rows, prompt=args.prompt,
               completion=args.completion, decode_segments=scfg.num_segments,
               trace_lower_s=lower_s, compile_s=compile_s)
  report.merge("phases", "sampler", "memory", "measured", compiled=compiled_memory(compiled),
               device_before=memory0)
  out, first_s = call_timed(compiled, *sample_args)
  report.merge("phases", "sampler", first_run_s=first_s,
               first_tokens_per_s=int(jnp.sum(out.lengths)) / first_s)
  if stop_unless(1.5 * first_s + 1.0, "the timed sampler call"):
    return EXIT_STOPPED
  key2 = jax.device_put(jax.random.key_data(jax.random.key(2)), device)
  out, run_s = call_timed(compiled, params, prompts, pmask, key2)
  generated = int(jnp.sum(out.lengths))
  flops = common.generation_flops(model_cfg, args.rows, args.prompt, args.completion)
  report.merge("phases", "sampler", "memory", "measured", device_after=device_memory(device))
  report.merge("phases", "sampler", run_s=run_s, generated_tokens=generated,
               decode_steps=int(out.num_steps), tokens_per_s=generated / run_s,
               useful_tflop_per_s=flops / run_s / 1e12,
               finite_logprobs=bool(jnp.all(jnp.isfinite(out.policy_logprobs))))
  print(f"sampler: compile {compile_s:.1f} s, {args.rows} rows x {args.completion} tokens in "
        f"{run_s:.2f} s, {generated / run_s:,.0f} tokens/s", flush=True)
  del out, compiled

  # 3. XLA's CPU plan of the same programs (abstract inputs; nothing runs).
  report.phase = "plan"
  plan_cfg = model_cfg.replace(attention="blockwise" if model_cfg.attention == "cudnn"
                               else model_cfg.attention)
  plan_graphdef = nnx.split(nnx.eval_shape(lambda: tfm.Transformer(plan_cfg,
                                                                   rngs=nnx.Rngs(0))))[0]
  report.merge("plan", backend="cpu", attention=plan_cfg.attention)
  b, tp, n = args.train_rows, args.prompt, args.completion
  spec_of = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
      shape, dtype, sharding=jax.sharding.SingleDeviceSharding(cpu))
  programs = (
      ("update", lambda: update_program(make_fns(plan_cfg, plan_graphdef, cfg, spec, cpu)),
       update_shapes),
      ("sampler", lambda: sampler_program(plan_graphdef, scfg, args.rows), sample_shapes),
      ("gradient_pass", lambda: gradient_pass(plan_graphdef, args.logits_chunk),
       (update_shapes[2], spec_of((b, tp), jnp.int32), spec_of((b, tp), bool),
        spec_of((b, n), jnp.int32), spec_of((b, n), bool), spec_of((b, n), jnp.float32))))
  # A run on the CPU compiled the update and the sampler for it already: the same programs.
  same = device.platform == "cpu" and plan_cfg == model_cfg
  for name, make, shapes in programs:
    phase = report.result["phases"].get(name)
    if same and phase is not None:
      planned = dict(phase["memory"]["measured"]["compiled"], compile_s=phase["compile_s"],
                     source="the measured compilation (this run is on the CPU)")
    else:
      if stop_unless(1.0, f"the {name} plan"):
        return EXIT_STOPPED
      compiled, _, compile_s = compile_timed(make(), shapes)
      planned = dict(compiled_memory(compiled) or {}, compile_s=compile_s,
                     source="compiled for the CPU from abstract inputs")
    report.merge("plan", **{name: planned})
    if name == "gradient_pass":
      report.merge("phases", "update", "memory", planned_gradient_pass=planned)
    else:
      report.merge("phases", name, "memory", planned=planned)
  report.merge(complete=True, elapsed_s=args.time_limit - left())
  gib = 2 ** 30
  for name in ("update", "sampler"):
    memory = report.result["phases"][name]["memory"]
    peak = (memory["measured"]["device_after"] or {}).get("peak_bytes_in_use")
    print(f"{name} memory: temporaries {memory['measured']['compiled']['temp_bytes'] / gib:.3f} "
          f"GiB compiled for {jax.default_backend()}, {memory['planned']['temp_bytes'] / gib:.3f} "
          "GiB planned for the CPU"
          + (f"; device peak so far {peak / gib:.2f} GiB" if peak is not None else ""), flush=True)
  print(f"wrote {report.path}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
