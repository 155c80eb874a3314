"""Checkpoint averaging as transforms over parameter pytrees (in training) and over orbax
checkpoint directories (post hoc), streaming in float32 and shard-local.

In training (jit-safe, state in the carry)::

    avg = averaging.lawa(k=5, every=50)          # or ema, swa, power_ema, named, parse_specs
    s = avg.init(params); s = avg.update(params, s); eval_params = avg.result(s, params)

Post hoc::

    src = averaging.CheckpointSource(ckpt_dir, like=state, select=lambda s: s.params)
    plan = averaging.plan_lawa(src.steps, k=5, every=200)
    params = averaging.average(src.load, plan, progress=True)
    averaging.write_params(out_dir, params, plan.to_json())

LoRA runs: average the merged weights W + alpha / r * A B of each checkpoint, never the factors
A and B (the product is bilinear, so averaged factors do not give averaged weights). The run loop
does (``Trainer.averaging_params``), and so does ``rlpost.train.export`` (``--average``);
``scripts/average.py``, which sees flat leaves only, refuses LoRA checkpoints.

See ``transforms``, ``weights``, ``streaming``, ``checkpoints`` and ``posthoc``.
"""

from rlpost.averaging.checkpoints import (CheckpointSource, list_steps, metrics_from_jsonl,
                                          param_key_indices, parse_key_ranges, read_params,
                                          scan_steps, write_params)
from rlpost.averaging.posthoc import (Plan, average, greedy_soup, into_train_state,
                                      lawa_trajectory, plan_ema, plan_lawa, plan_mwa,
                                      plan_posthoc_ema, plan_swa, plan_uniform)
from rlpost.averaging.spec import Tracker, parse_spec, parse_specs, plan_from_spec, spec_name
from rlpost.averaging.streaming import SlidingWindowMean, StreamingMean, accumulate_hlo
from rlpost.averaging.transforms import (AveragingTransform, EmaState, LawaState, PowerEmaState,
                                         SwaState, ema, ema_lag_matched_decay, lawa, named,
                                         power_ema, swa)
from rlpost.averaging.weights import (ema_weights, gamma_to_sigma_rel, loss_power, loss_softmin,
                                      mwa_weights, posthoc_ema_weights, power_profile,
                                      select_all, select_from, select_latest, select_log_spaced,
                                      sigma_rel_to_gamma, step_power, uniform_weights)
