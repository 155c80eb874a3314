"""Plain-data configuration of the round-trip experiment: one ``SystemPlan`` per dynamical system.

A plan fixes everything a (system, seed) unit computes: the model and its training budget, the
depths, which start times of which trajectories are rolled out, the sampler, and which extra
models (direction specialists, an undertrained model) are trained beside the bidirectional one.
``full_config()`` is the reported CPU-scale run; ``quick_config()`` the toy size run by the tests.
"""

from __future__ import annotations

import dataclasses

from rlpost.dynamics import model as mdl
from rlpost.dynamics import rollout as rollout_lib
from rlpost.dynamics import train as train_lib

# The systems' roles; "fair": reversible or near-conservative (backward stepping well posed),
# "stress": dissipative, backward stepping ill posed (see rlpost/dynamics/systems.py). ns2d is a
# fair system whose CPU-scale model never passed the skill gate: the full run leaves it out
# (README, "Systems"), a plan may still name it.
ROLES = {"kdv1d": "fair", "ns2d": "fair", "ks1d": "stress"}

# Model kinds trained per (system, seed): the bidirectional model, the two direction specialists
# at the same number of steps, and an undertrained bidirectional model.
KINDS = ("bidir", "forward", "backward", "under")


@dataclasses.dataclass(frozen=True)
class SystemPlan:
  """What one system's units train and evaluate.

  Attributes:
    name: system name (``rlpost.dynamics.systems``).
    train: training configuration of the bidirectional model (specialists and the undertrained
      model change only ``directions`` / ``num_steps``).
    depths: K rollout depths at which E_i and C_i are measured (max depth D).
    start_stride: test start times are 0, stride, 2 stride, ... while start + D fits in a
      trajectory; every test trajectory is rolled out from each of them.
    max_starts: keep only the first this many start times (None: all that fit).
    ood_start_every: OOD rollouts start at every n-th test start time (the negatives of the OOD
      AUROC are the test rollouts from the same start times).
    num_train_traj, num_test_traj, num_ood_traj: leading trajectories of each split used (None:
      all). Calibrator rollouts start once per training trajectory, cycling over the start times.
    sampler_steps: Euler sub-steps of the flow per physical step.
    num_samples: M, stochastic samples per start for the sampling-dispersion baseline.
    specialists: also train forward-only and backward-only models at the same number of steps.
    undertrained_steps: steps of the undertrained bidirectional model (0: none).
    max_seeds: at most this many seeds of this system (None: the experiment's count); a system
      that decides nothing (the stress test) needs fewer than the deciding one.
  """

  name: str
  train: train_lib.TrainConfig
  depths: tuple[int, ...]
  start_stride: int
  ood_start_every: int = 2
  num_train_traj: int | None = None
  num_test_traj: int | None = None
  num_ood_traj: int | None = None
  sampler_steps: int = 8
  num_samples: int = 4
  specialists: bool = False
  undertrained_steps: int = 0
  max_starts: int | None = None
  max_seeds: int | None = None

  @property
  def role(self) -> str:
    return ROLES[self.name]

  def num_seeds(self, seeds: int) -> int:
    """Seeds of this system when the experiment runs ``seeds``."""
    return seeds if self.max_seeds is None else min(seeds, self.max_seeds)

  @property
  def max_depth(self) -> int:
    return max(self.depths)

  def kinds(self) -> tuple[str, ...]:
    out = ["bidir"]
    if self.specialists:
      out += ["forward", "backward"]
    if self.undertrained_steps:
      out.append("under")
    return tuple(out)

  def train_config(self, kind: str) -> train_lib.TrainConfig:
    """The training configuration of one model kind."""
    if kind == "bidir":
      return self.train
    if kind in ("forward", "backward"):
      return self.train.replace(directions=kind)
    if kind == "under":
      return self.train.replace(num_steps=self.undertrained_steps,
                                warmup_steps=min(self.train.warmup_steps,
                                                 self.undertrained_steps // 2))
    raise ValueError(f"unknown model kind {kind!r}; valid: {KINDS}")

  def deterministic_sampler(self) -> rollout_lib.SamplerConfig:
    """The sampler of every measured rollout: Euler from zero noise, so E_i and C_i are fixed
    functions of the start state (no single-sample noise in the ranking)."""
    return rollout_lib.SamplerConfig(num_steps=self.sampler_steps, method="euler", init="zero")

  def stochastic_sampler(self) -> rollout_lib.SamplerConfig:
    """The sampler of the dispersion baseline: Euler from Gaussian noise."""
    return rollout_lib.SamplerConfig(num_steps=self.sampler_steps, method="euler", init="noise")

  def unit_spec(self, kind: str, seed: int, data_seed: int) -> dict:
    """Plain data that determines one (kind, seed) unit: its cache key (``harness.Unit``). The
    system's fingerprint is part of it, so changing a system's parameters retrains its units,
    and so is the pinned dataset's file (its digest) where one is pinned."""
    from experiments import testbeds
    from rlpost.dynamics import systems

    data = testbeds.dataset_file(self.name, data_seed)
    return {"system": self.name, "fingerprint": systems.get_system(self.name).fingerprint(),
            "kind": kind, "seed": seed, "data_seed": data_seed,
            **({"testbed": data} if data else {}),
            "train": dataclasses.asdict(self.train_config(kind)), "depths": list(self.depths),
            "start_stride": self.start_stride, "max_starts": self.max_starts,
            "ood_start_every": self.ood_start_every,
            "num_train_traj": self.num_train_traj, "num_test_traj": self.num_test_traj,
            "num_ood_traj": self.num_ood_traj, "sampler_steps": self.sampler_steps,
            "num_samples": self.num_samples, "version": UNIT_VERSION}


# Bumped when the unit's computation changes, so that cached units are recomputed (it is part
# of every unit's spec, hence of its cache key).
UNIT_VERSION = 4


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """The whole experiment: plans, seeds and the analysis constants.

  seeds: seeds of each system (a plan's ``max_seeds`` caps its own).
  coverage: the kept fraction for selective prediction (the paper's 80%).
  data_seed: the datasets' seed (data is fixed across model seeds).
  seed_offset: the first model seed (a replication runs seeds the table did not use).
  pilot_sd, min_effect, min_seeds: where ``seeds`` came from (``stats.seeds_needed``; None when
    it was not derived from power).
  """

  plans: tuple[SystemPlan, ...]
  seeds: int = 3
  coverage: float = 0.8
  data_seed: int = 0
  pilot_sd: float | None = None
  min_effect: float | None = None
  min_seeds: int | None = None
  seed_offset: int = 0

  def seed_ids(self, plan: SystemPlan) -> range:
    """The model seeds of ``plan``'s system."""
    return range(self.seed_offset, self.seed_offset + plan.num_seeds(self.seeds))

  def plan(self, name: str) -> SystemPlan:
    for p in self.plans:
      if p.name == name:
        return p
    raise KeyError(name)

  @classmethod
  def from_dict(cls, config: dict) -> "ExperimentConfig":
    """The inverse of ``dataclasses.asdict`` (the plain-data config of ``get_config``)."""
    plans = []
    for p in config["plans"]:
      train = dict(p["train"], model=mdl.ModelConfig(**p["train"]["model"]))
      plans.append(SystemPlan(**dict(p, train=train_lib.TrainConfig(**train),
                                     depths=tuple(p["depths"]))))
    return cls(plans=tuple(plans), **{k: v for k, v in config.items() if k != "plans"})


def get_config(quick: bool) -> dict:
  """The experiment as plain data (``harness.Experiment.get_config``): ``"seeds"`` is the seed
  count ``--seeds`` overrides."""
  return dataclasses.asdict(quick_config() if quick else full_config())


def _model_1d(**kw) -> mdl.ModelConfig:
  return mdl.ModelConfig(num_fields=1, spatial_dims=1, **kw)


# Seeds from power (``stats.seeds_needed``, README "The 10-seed run's design"): the pilot SD
# is the worst-depth fixed-depth Spearman's across the 3-seed run's seeds (the first paper
# claim), the minimum effect 0.2 on that scale; floor 8.
PILOT_SD, MIN_EFFECT, MIN_SEEDS = 0.145, 0.2, 8


def seeds_from_power() -> int:
  from rlpost.eval import stats

  return max(MIN_SEEDS, stats.seeds_needed(PILOT_SD, MIN_EFFECT))


def full_config() -> ExperimentConfig:
  """The reported run, budgeted to 30 minutes on two CPU cores (README: timings).

  kdv1d, the deciding system: the default 109k-parameter field model, 1000 steps at batch 64,
  16 start times per test trajectory (frames 0-15), seeds from power. ks1d, the stress test,
  the same model at 3 seeds and 8 start times (stride 3): it decides nothing. ns2d is out of
  the run: at the steps this budget allows its model never beat persistence (skill 0.01 at 3
  seeds), and it took 12 of the 3-seed run's 22 minutes (README, "Systems").
  """
  kdv = SystemPlan(
      name="kdv1d",
      train=train_lib.TrainConfig(model=_model_1d(), num_steps=1000, batch_size=64),
      depths=(1, 2, 4, 8, 16), start_stride=1, max_starts=16, ood_start_every=4,
      sampler_steps=4, specialists=True, undertrained_steps=60)
  ks = SystemPlan(
      name="ks1d",
      train=train_lib.TrainConfig(model=_model_1d(), num_steps=1000, batch_size=64),
      depths=(1, 2, 4, 8, 16), start_stride=3, sampler_steps=4, max_seeds=3)
  return ExperimentConfig(plans=(kdv, ks), seeds=seeds_from_power(), pilot_sd=PILOT_SD,
                          min_effect=MIN_EFFECT, min_seeds=MIN_SEEDS)


def quick_config() -> ExperimentConfig:
  """Toy size: every code path, tiny models, a few trajectories (well under a minute).

  The training, test and OOD window counts are equal, so each rollout function compiles once
  per system (compilation dominates at this size).
  """
  tiny = dict(width=8, num_blocks=1, embed_dim=8)

  def plan(name, model, **kw):
    base = dict(depths=(1, 2, 4), start_stride=6, ood_start_every=2, num_train_traj=36,
                num_test_traj=6, num_ood_traj=12, sampler_steps=2, num_samples=2)
    base.update(kw)
    train = train_lib.TrainConfig(model=model, num_steps=12, batch_size=8, warmup_steps=2,
                                  ae_steps=4, ae_batch_size=4, log_every=4)
    return SystemPlan(name=name, train=train, **base)

  return ExperimentConfig(plans=(
      plan("kdv1d", _model_1d(**tiny), specialists=True, undertrained_steps=3),
      plan("ks1d", _model_1d(**tiny)),
      plan("ns2d", mdl.ModelConfig(num_fields=1, spatial_dims=2, latent=True, latent_channels=2,
                                   ae_width=4, **tiny), depths=(1, 2), start_stride=19,
           num_train_traj=8, num_test_traj=4, num_ood_traj=8),
  ), seeds=2)
