"""Tunix (``google-tunix``, the ``peers`` extra) as a peer of rlpost on the same weights.

rlpost's policy is exported with ``rlpost.models.hf.save_pretrained`` and loaded into Tunix's
own Qwen2 (``tunix.models.qwen2.params.create_model_from_safe_tensors``), the path a Tunix user
takes for a Hugging Face checkpoint. Token ids cross Tunix's string interface through
``IdTokenizer``: one character per id, so prompts are exactly the ids rlpost samples from, with
no BOS added and nothing merged.

Tunix pins an older ``transformers`` than the ``oracle`` extra, so it lives in its own
environment: ``python3 -m venv .venv-peers && .venv-peers/bin/pip install -e ".[peers]"``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from scripts.benchmarks.common import timed

# Ids are written as characters from this code point on (a run of printable CJK ideographs).
_BASE = 0x4E00


def available() -> bool:
  import importlib.util
  return importlib.util.find_spec("tunix") is not None


class IdTokenizer:
  """Tunix's tokenizer protocol over raw ids: id i <-> chr(_BASE + i)."""

  def __init__(self, vocab_size: int, eos_id: int, pad_id: int = 0):
    self.vocab_size, self._eos, self._pad = vocab_size, eos_id, pad_id

  @staticmethod
  def text(ids) -> str:
    return "".join(chr(_BASE + int(i)) for i in ids)

  def encode(self, text: str, **_) -> list[int]:
    return [ord(c) - _BASE for c in text]

  def decode(self, ids, **_) -> str:
    return self.text(ids)

  def bos_id(self) -> int:
    return 0  # falsy: Tunix's sampler then prepends no BOS

  def eos_id(self) -> int:
    return self._eos

  def pad_id(self) -> int:
    return self._pad


def model_config(cfg):
  """Tunix's Qwen2 ``ModelConfig`` for an rlpost ``TransformerConfig`` (float32)."""
  from tunix.models.qwen2 import model as qwen2

  if not cfg.qkv_bias:
    raise ValueError("Tunix's Qwen2 has q/k/v biases; the rlpost config has qkv_bias=False")
  return qwen2.ModelConfig(
      num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
      hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.resolved_head_dim,
      num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
      use_tied_embedding=cfg.tie_embeddings)


def load_model(model, workdir: str | Path, name: str = "tunix"):
  """Tunix's Qwen2 holding ``model``'s weights (through a Hugging Face export in ``workdir``)."""
  from tunix.models.qwen2 import params as qwen2_params

  from rlpost.models import hf

  path = hf.save_pretrained(model, Path(workdir) / name, architecture="qwen2", overwrite=True)
  return qwen2_params.create_model_from_safe_tensors(str(path), model_config(model.cfg))


class TunixSampler:
  """``tunix.generate.sampler.Sampler`` on rlpost's weights: greedy, exactly N new tokens.

  No stop token is reachable (EOS is set to an id outside the vocabulary), so every row decodes
  N tokens, like the rlpost and transformers sides of ``bench.py sampler``. A call is Tunix's
  whole user-level ``Sampler.__call__`` (string in, prefill, decode loop, tokens out).
  """

  def __init__(self, model, workdir: str | Path, prompt_len: int, new_tokens: int):
    from tunix.generate import sampler as tunix_sampler

    cfg = model.cfg
    self.prompt_len = prompt_len
    self.tokenizer = IdTokenizer(cfg.vocab_size, eos_id=cfg.vocab_size)
    self.model = load_model(model, workdir)
    cache = tunix_sampler.CacheConfig(cache_size=prompt_len + new_tokens,
                                      num_layers=cfg.num_layers,
                                      num_kv_heads=cfg.num_kv_heads, head_dim=cfg.resolved_head_dim)
    self.sampler = tunix_sampler.Sampler(self.model, self.tokenizer, cache)
    self.version = _version()

  def generate(self, tokens: np.ndarray, new_tokens: int) -> np.ndarray:
    if (tokens == self.tokenizer.pad_id()).any():
      raise ValueError("prompt ids must not use the pad id 0 (Tunix masks pad tokens)")
    out = self.sampler([IdTokenizer.text(row) for row in tokens],
                       max_generation_steps=new_tokens, max_prompt_length=self.prompt_len,
                       temperature=0.0, pad_output=True)
    ids = np.stack([np.asarray(t) for t in out.tokens])
    if ids.shape != (tokens.shape[0], new_tokens):
      raise RuntimeError(f"Tunix generated {ids.shape}, expected {(tokens.shape[0], new_tokens)}")
    return ids


def _version() -> str:
  from importlib import metadata
  return metadata.version("google-tunix")


def describe(cfg) -> dict:
  return {"name": "tunix", "version": _version(),
          "model": dataclasses.asdict(model_config(cfg)) | {"shd_config": None}}


class CharTokenizer:
  """Tunix's tokenizer protocol over ``rlpost.tokenizer.CharTokenizer``'s ids.

  ``decode`` writes one character per id (PAD, BOS and EOS as ``"\\x00"``), so a completion's
  text has as many characters as tokens and the reward can tell truncation from EOS.
  """

  def __init__(self):
    from rlpost import tokenizer
    self._tok = tokenizer.CharTokenizer()
    self._alphabet = tokenizer.ALPHABET

  def encode(self, text: str, **_) -> list[int]:
    return self._tok.encode(text)

  def decode(self, ids, **_) -> str:
    return "".join(self._alphabet[i - 3] if i >= 3 else "\x00" for i in ids)

  def bos_id(self) -> int:
    return self._tok.bos_id

  def eos_id(self) -> int:
    return self._tok.eos_id

  def pad_id(self) -> int:
    return self._tok.pad_id


class GRPOPeer:
  """Tunix's ``GRPOLearner`` set up like ``bench.py train``'s rlpost and TRL sides.

  The same initial policy (actor and frozen reference both loaded from rlpost's export), the
  same prompt set, taken in row order (Tunix prepends the tokenizer's BOS, as rlpost's prompt
  buffer holds it), the
  same graded arithmetic reward through ``rlpost.tasks.arithmetic.reference_reward`` (a
  completion shorter than N tokens ended with EOS), P prompts x G completions, N new tokens at
  temperature 1 (top-p 1, no top-k), one AdamW step per batch (lr, no weight decay, global-norm
  clip), PPO clip epsilon, KL coefficient beta (Tunix skips the reference forward at 0), one
  iteration, the vanilla rollout engine sharing the actor's weights, a 1x1 mesh.

  ``after_step`` is called after each global step, outside its timed window (the benchmark
  runs one rlpost step there, so the two alternate). ``reward_fn(completion, answer)`` replaces
  the arithmetic reward (tests use one that varies under a random policy). ``times`` holds each
  step's wall seconds and ``split`` the generation and generation + reference + reward +
  advantage seconds.
  """

  def __init__(self, trainer, workdir, *, beta: float, lr: float, grad_clip: float,
               clip_eps: float, steps: int, after_step=None, reward_fn=None):
    import jax
    import optax
    from flax import nnx
    from tunix.rl import rl_cluster as rlc
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    from rlpost.tasks import arithmetic

    cfg = trainer.cfg
    self.prompts, self.group, self.n = cfg.num_prompts, cfg.group_size, trainer.max_new_tokens
    self.records = trainer.records["train"]
    self.steps = steps
    policy = trainer.reference_model()
    self.actor = load_model(policy, workdir, f"tunix-actor-{beta}")
    reference = load_model(policy, workdir, f"tunix-reference-{beta}")
    self._initial = [np.array(x) for x in jax.tree.leaves(nnx.state(self.actor, nnx.Param))]
    tp = int(trainer.train_data.prompt_tokens.shape[1])
    # Tunix's sharding rules name fsdp / tp axes and expect Auto (not Explicit) axis types.
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    training = rlc.RLTrainingConfig(
        actor_optimizer=optax.chain(optax.clip_by_global_norm(grad_clip),
                                    optax.adamw(lr, weight_decay=0.0)),
        eval_every_n_steps=10**9, max_steps=steps, pbar_description=None)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=self.n, temperature=1.0, top_p=1.0, top_k=None,
        max_prompt_length=tp, kv_cache_size=tp + self.n, eos_tokens=[CharTokenizer().eos_id()])
    cluster_config = rlc.ClusterConfig(
        role_to_mesh={rlc.Role.ACTOR: mesh, rlc.Role.REFERENCE: mesh, rlc.Role.ROLLOUT: mesh},
        rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
        rollout_config=rollout)
    self.cluster = rlc.RLCluster(actor=self.actor, reference=reference,
                                 tokenizer=CharTokenizer(), cluster_config=cluster_config)
    n = self.n

    def reward(prompts, completions, answer, **_):
      del prompts
      return [arithmetic.reference_reward(c, len(c) < n, str(a), graded=True)
              for c, a in zip(completions, answer)]

    if reward_fn is not None:  # (completion text, answer) -> float, for tests
      def reward(prompts, completions, answer, **_):  # noqa: F811
        del prompts
        return [float(reward_fn(c, str(a))) for c, a in zip(completions, answer)]

    self.learner = grpo_learner.GRPOLearner(
        self.cluster, grpo_learner.GRPOConfig(num_generations=self.group, num_iterations=1,
                                              beta=beta, epsilon=clip_eps, loss_algo="grpo"),
        reward_fns=reward)
    self.times, self.split = [], {"generate": [], "generate_and_score": []}
    learner = self.learner
    run_step = learner._run_global_step

    def timed_step(*a, **k):
      t0 = time.perf_counter()
      run_step(*a, **k)
      self.times.append(time.perf_counter() - t0)
      if after_step is not None:
        after_step()

    learner._run_global_step = timed_step
    # Tunix starts the reference forward without waiting for it: block, so that its time
    # counts as scoring and not as the update that follows.
    learner._generate_and_compute_advantage = timed(learner._generate_and_compute_advantage,
                                                    self.split["generate_and_score"], block=True)
    self.cluster.generate = timed(self.cluster.generate, self.split["generate"], block=True)
    if learner.should_sync_weights:
      raise RuntimeError("Tunix's rollout does not share the actor's weights: a weight sync "
                         "outside the timed step would go unmeasured")

  def batches(self):
    for i in range(self.steps):
      records = self.records[i * self.prompts:(i + 1) * self.prompts]
      if len(records) < self.prompts:
        raise ValueError(f"{len(self.records)} training prompts are too few for {self.steps} "
                         f"steps of {self.prompts}")
      # Tunix repeats each column G times with numpy; plain lists would nest.
      yield {"prompts": np.array([r["prompt"] for r in records]),
             "answer": np.array([r["answer"] for r in records])}

  def train(self) -> None:
    self.learner.train(self.batches())

  def max_param_change(self) -> float:
    """Largest |actor - reference| over all weights: > 0 once Tunix's optimizer has stepped."""
    import jax
    from flax import nnx

    actor = jax.tree.leaves(nnx.state(self.cluster.actor_trainer.model, nnx.Param))
    return max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(actor, self._initial))

