"""Test-split evaluation of a policy: pass@k, greedy pass@1, maj@k and token entropy.

``make_evaluate(...)`` returns ``evaluate(params, *, num_problems, num_samples, seed, progress)
-> dict``, a host loop over jitted sampling calls of whole problems (``eval_batch`` rows at a
time), with a progress bar over the problems when ``progress`` is set.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlpost import progress as progress_lib
from rlpost import sampling
from rlpost.eval import metrics as evm
from rlpost.models.policy import Policy
from rlpost.tasks.base import TaskArrays, Task


def make_evaluate(*, policy: Policy, task: Task, records: list[dict], data: TaskArrays,
                  sampling_cfg: sampling.SamplingConfig, reward: Callable, eval_problems: int,
                  eval_samples: int, eval_batch: int) -> Callable:
  """The evaluation of ``policy``-shaped parameters on ``data`` (the test split's arrays, whose
  rows are ``records``); ``reward(tokens, mask, idx) -> (rewards, correct)`` scores them."""
  fns = {}

  def eval_fn(rows: int, greedy: bool):
    if (rows, greedy) not in fns:
      scfg = dataclasses.replace(sampling_cfg, temperature=0.0) if greedy else sampling_cfg

      def fn(params, idx, key):
        out = sampling.sample(policy.graphdef, params, data.prompt_tokens[idx],
                              data.prompt_mask[idx], key, cfg=scfg)
        return out, reward(out.tokens, out.mask, idx)[1]

      fns[(rows, greedy)] = jax.jit(fn)
    return fns[(rows, greedy)]

  def evaluate(params, *, num_problems: int | None = None, num_samples: int | None = None,
               seed: int = 1234, progress: bool = False) -> dict:
    """pass@k (k = 1, 2, 4, ... n), accuracy, greedy pass@1, maj@k and token entropy on the
    test split, overall and per difficulty. Sampling at the training temperature."""
    n_test = data.prompt_tokens.shape[0]
    n_prob = min(num_problems or eval_problems or n_test, n_test)
    n = num_samples or eval_samples
    per_call = max(1, eval_batch // n)  # whole problems per call
    fn, greedy_fn = eval_fn(per_call * n, False), eval_fn(per_call, True)
    correct, answers, surprisal, tokens_count, greedy = [], [], 0.0, 0, []
    bar = progress_lib.bar(total=n_prob, desc="eval", unit="problem", disable=not progress,
                           leave=False)
    for start in range(0, n_prob, per_call):
      prob = np.arange(start, start + per_call) % n_test
      key = jax.random.fold_in(jax.random.key(seed), start)
      out, r_ok = fn(params, jnp.asarray(np.repeat(prob, n), jnp.int32), key)
      keep = min(per_call, n_prob - start)
      correct.append(np.asarray(r_ok).reshape(per_call, n)[:keep])
      toks = np.asarray(out.tokens).reshape(per_call, n, -1)[:keep]
      msk = np.asarray(out.mask).reshape(per_call, n, -1)[:keep]
      for pt, pm in zip(toks, msk):
        answers.append([task.final_answer(policy.tokenizer.decode(t[m])) for t, m in zip(pt, pm)])
      lp = np.asarray(out.policy_logprobs).reshape(per_call, n, -1)[:keep]
      surprisal += float(-(lp * msk).sum())
      tokens_count += int(msk.sum())
      _, g_ok = greedy_fn(params, jnp.asarray(prob, jnp.int32), key)
      greedy.append(np.asarray(g_ok)[:keep])
      bar.update(keep)
    bar.close()
    correct = np.concatenate(correct)
    diff = np.asarray(data.difficulty)[:n_prob]
    res = evm.summarize_passk(correct, diff, evm.ks_up_to(n))
    res["greedy_pass@1"] = float(np.concatenate(greedy).mean())
    refs = [task.reference_answer(r) for r in records[:n_prob]]
    for k in [k for k in evm.ks_up_to(n) if k > 1][:3]:
      res[f"maj@{k}"] = evm.majority_at_k(answers, refs, k)
    res["token_entropy"] = surprisal / max(tokens_count, 1)
    return res

  return evaluate
