"""Bad input to a training run fails at start, before any data or model work, with one message
that names the config key, the file or the line.

Most checks call ``load_config_file``, ``main`` or ``from_dict`` in-process and assert the
exception; two subprocess runs of ``scripts/train.py`` check the command-line contract (exit
status 2, one ``error:`` line on stderr, no traceback). Nothing here generates data, warm-starts
or trains.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlpost import cli
from rlpost import objectives as O
from rlpost.objectives import recipes
from rlpost.train import config as config_lib
from rlpost.train import rl
from scripts import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(ROOT, "experiments", "smoke.py")


def _cfg(**values):
  return config_lib.from_dict(rl.RLConfig, values)


def _write(path, text: str) -> str:
  path.write_text(text)
  return str(path)


# ------------------------------------------------------------------------- D9: the config file
def test_config_file_that_is_a_directory(tmp_path):
  with pytest.raises(IsADirectoryError, match="is a directory"):
    train.load_config_file(str(tmp_path))


def test_config_file_with_a_syntax_error_names_file_and_line(tmp_path):
  path = _write(tmp_path / "bad.py", "CONFIG = dict(\n  steps=2,\n  x = = 3)\n")
  with pytest.raises(ValueError) as e:
    train.load_config_file(path)
  assert str(e.value) == f"config file {path}, line 3: invalid syntax"
  assert cli.is_user_error(e.value)


def test_config_file_importing_a_missing_module(tmp_path):
  path = _write(tmp_path / "imp.py", "import no_such_module_rlpost\nCONFIG = {}\n")
  with pytest.raises(ValueError) as e:
    train.load_config_file(path)
  assert str(e.value) == (f"config file {path}, line 1: No module named "
                          "'no_such_module_rlpost'")


def test_config_file_that_raises_names_the_line(tmp_path):
  path = _write(tmp_path / "boom.py", "CONFIG = {}\nx = 1\nCONFIG['a'] = 1 / 0\n")
  with pytest.raises(ValueError) as e:
    train.load_config_file(path)
  assert str(e.value) == f"config file {path}, line 3: ZeroDivisionError: division by zero"


def test_config_file_of_another_kind(tmp_path):
  path = _write(tmp_path / "cfg.yaml", "steps: 2\n")
  with pytest.raises(ValueError, match=r"cfg.yaml: expected a Python \(.py\) or JSON"):
    train.load_config_file(path)


def test_truncated_json_config_names_file_and_line(tmp_path):
  path = _write(tmp_path / "cut.json", '{"steps": 2,\n "seed": ')
  with pytest.raises(ValueError) as e:
    train.load_config_file(path)
  assert str(e.value).startswith(f"config file {path}, line 2: invalid JSON")


# ------------------------------------------------------------------ D15: options among overrides
def test_options_may_follow_overrides(tmp_path):
  # The unknown key is reported by the config, so the arguments around it were accepted.
  argv = [SMOKE, "steps=2", "--no-progress", f"run_dir={tmp_path / 'r'}", "no_such_key=1"]
  with pytest.raises(ValueError, match=r"unknown config key\(s\) \['no_such_key'\]"):
    train.main(argv)


# ------------------------------------------------------------------------ D13: config values
def test_model_widths_are_checked_before_the_data(tmp_path):
  data_dir, cache_dir = tmp_path / "data", tmp_path / "cache"
  argv = [SMOKE, 'model={"hidden_size": 63}', f"data_dir={data_dir}", f"cache_dir={cache_dir}",
          f"run_dir={tmp_path / 'r'}", "--no-progress"]
  with pytest.raises(ValueError, match=r"config key 'model'.*hidden_size \(63\) is not "
                                       r"divisible by num_heads \(4\)"):
    train.main(argv)
  assert not data_dir.exists() and not cache_dir.exists()


@pytest.mark.parametrize("model, expected", [
    ({"num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
    ({"hidden_size": 0}, "hidden_size must be a positive int"),
    ({"num_layers": -1}, "num_layers must be a positive int"),
    ({"hidden_size": 96, "num_heads": 4, "head_dim": 5}, "head_dim must be even"),
])
def test_model_config_errors_name_the_key(model, expected):
  with pytest.raises(ValueError, match=r"^config key 'model'") as e:
    _cfg(model=model)
  assert expected in str(e.value)


@pytest.mark.parametrize("key", ["data_seed", "model_seed", "seed"])
@pytest.mark.parametrize("value", [-1, 2**32])
def test_seeds_are_non_negative_32_bit(key, value):
  with pytest.raises(ValueError, match=rf"^config key '{key}': must be a non-negative integer"):
    _cfg(**{key: value})


def test_recipe_argument_types_name_the_argument():
  with pytest.raises(ValueError, match=r"^config key 'recipe_args': argument 'alpha' of recipe "
                                       r"'ace' must be a number or None, got 'x'$"):
    _cfg(recipe="ace", recipe_args={"alpha": "x"})
  with pytest.raises(ValueError, match=r"config key 'recipe_args': argument 'odd_only' .* must "
                                       r"be true or false, got 1"):
    _cfg(recipe="mc_grpo", recipe_args={"odd_only": 1})
  with pytest.raises(ValueError, match=r"config key 'recipe_args': loss field 'kl_coef' .* must "
                                       r"be a number, got 'high'"):
    _cfg(recipe="grpo", recipe_args={"kl_coef": "high"})
  assert _cfg(recipe="ace", recipe_args={"alpha": 1}).recipe_args == {"alpha": 1}


def test_registered_recipe_arguments_are_checked_from_the_signature():
  def scaled(*, factor: float = 1.0, note="x"):
    del note
    return O.make_recipe("test_scaled", O.center_by_group_mean(), O.PolicyLossConfig(
        kl_coef=0.0 * factor))

  name = "test_bad_input_scaled"
  recipes.register_recipe(name, scaled)
  try:
    with pytest.raises(ValueError, match="argument 'factor' .* must be a number, got '2'"):
      _cfg(recipe=name, recipe_args={"factor": "2"})
    with pytest.raises(ValueError, match="argument 'note' .* must be a string, got 3"):
      _cfg(recipe=name, recipe_args={"note": 3})
    assert _cfg(recipe=name, recipe_args={"factor": 2, "note": "y"}).recipe == name
  finally:
    recipes._REGISTRY.pop(name)


# ------------------------------------------------------------------------- D14: task_spec types
@pytest.mark.parametrize("task, spec, expected", [
    ("arithmetic", {"max_digits": 2.5}, "field 'max_digits' must be an integer, got 2.5"),
    ("arithmetic", {"terms": True}, "field 'terms' must be an integer, got True"),
    ("arithmetic", {"allow_minus": 1}, "field 'allow_minus' must be true or false, got 1"),
    ("arithmetic", {"digits": 2}, "unknown field(s) ['digits']; known: ['min_digits', "
                                  "'max_digits', 'terms', 'allow_minus']"),
    ("arithmetic", {"min_digits": 3, "max_digits": 2}, "min_digits <= max_digits"),
    ("countdown", {"max_value": "20"}, "field 'max_value' must be an integer, got '20'"),
    ("countdown", {"max_numbers": 4.0}, "field 'max_numbers' must be an integer, got 4.0"),
    ("countdown", {"max_target": 0}, "max_target must be >= 1"),
    ("countdown", {"numbers": 3}, "unknown field(s) ['numbers']"),
])
def test_synthetic_task_spec_is_checked(task, spec, expected):
  with pytest.raises(ValueError, match=rf"^config key 'task_spec' \(task '{task}'\)") as e:
    _cfg(task=task, task_spec=spec)
  assert expected in str(e.value)


def test_good_task_specs_pass():
  assert _cfg(task_spec={"min_digits": 1, "max_digits": 2, "allow_minus": True}).task_spec
  assert _cfg(task="countdown", task_spec={"max_numbers": 3}).task == "countdown"


@pytest.mark.parametrize("task, train_path, expected", [
    ("gsm8k", 3, "field 'train' must be a file path, got 3"),
    ("gsm8k", ["a.jsonl"], "field 'train' must be a file path, got ['a.jsonl']"),
    ("math", [], "field 'train' must be a file path or a list of them, got []"),
    ("math", ["a.json", 1], "must be a file path or a list of them"),
])
def test_file_task_spec_paths_are_strings(task, train_path, expected):
  with pytest.raises(ValueError, match="^config key 'task_spec'") as e:
    _cfg(task=task, policy="/models/p", max_new_tokens=8,
         task_spec={"train": train_path, "test": "t.jsonl"})
  assert expected in str(e.value)


# ------------------------------------------------------------ group_size=1 and group baselines
@pytest.mark.parametrize("recipe, args", [
    ("grpo", {}), ("dr_grpo", {}), ("dapo", {}), ("rloo", {}), ("mc_grpo", {}),
    ("ace", {"alpha": 0.5}), ("gspo", {}), ("dars", {}),
])
def test_group_relative_recipes_refuse_one_rollout_per_group(recipe, args):
  rule = {"allocation": "plain"} if recipe == "dars" else {}  # DARS's GRPO baseline
  with pytest.raises(ValueError, match=rf"^config key 'group_size': recipe '{recipe}' .*every "
                                       r"advantage is exactly 0"):
    _cfg(recipe=recipe, recipe_args=args, group_size=1, **rule)
  assert _cfg(recipe=recipe, recipe_args=args, group_size=2, **rule).group_size == 2


def _batch_mean_baseline():
  """REINFORCE with one baseline over the batch: learns from single rollouts."""

  def fn(adv, batch, key):
    valid = batch.valid
    mean = (adv.values * valid).sum() / valid.sum()
    return adv._replace(values=adv.values - mean)

  return O.stateless(fn)


def test_registered_recipes_are_probed():
  loss = O.PolicyLossConfig(kl_coef=0.0)
  made = {
      "test_batch_baseline": lambda: O.make_recipe("b", O.chain(_batch_mean_baseline()), loss),
      "test_group_baseline": lambda: O.make_recipe("g", O.chain(O.center_by_group_mean()), loss),
  }
  for name, factory in made.items():
    recipes.register_recipe(name, factory)
  try:
    assert _cfg(recipe="test_batch_baseline", group_size=1).group_size == 1
    with pytest.raises(ValueError, match="config key 'group_size': recipe "
                                         "'test_group_baseline'"):
      _cfg(recipe="test_group_baseline", group_size=1)
  finally:
    for name in made:
      recipes._REGISTRY.pop(name)


def test_dars_allocation_may_merge_single_rollouts():
  # Stage-2 rollouts join the stage-1 rollout's group, so groups can hold several.
  assert _cfg(recipe="dars", group_size=1, allocation="dars",
              allocation_args={"schedule": "et"}).group_size == 1


# -------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("bad_input")
  bad = tmp / "bad.py"
  bad.write_text("CONFIG = dict(\n  steps=2,\n  x = = 3)\n")
  runs = {
      "syntax": ["scripts/train.py", str(bad), "steps=2"],
      "model": ["scripts/train.py", "experiments/smoke.py", "steps=2", "--no-progress",
                'model={"hidden_size": 63}', f"data_dir={tmp / 'data'}",
                f"cache_dir={tmp / 'cache'}", f"run_dir={tmp / 'run'}"],
  }

  def run(item):
    name, args = item
    env = {k: v for k, v in os.environ.items() if k != cli.DEBUG_ENV}
    env.update(JAX_PLATFORMS="cpu")
    return name, subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=120)

  with ThreadPoolExecutor(max_workers=2) as pool:
    return tmp, dict(pool.map(run, runs.items()))


def _one_error_line(proc) -> str:
  lines = proc.stderr.splitlines()
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  assert "Traceback" not in proc.stderr
  return lines[0]


def test_command_line_syntax_error_is_one_line(script_runs):
  tmp, procs = script_runs
  assert _one_error_line(procs["syntax"]) == f"error: config file {tmp / 'bad.py'}, line 3: " \
                                             "invalid syntax"


def test_command_line_model_error_comes_before_the_data(script_runs):
  tmp, procs = script_runs
  line = _one_error_line(procs["model"])
  assert line.startswith("error: config key 'model'") and "hidden_size (63)" in line, line
  assert procs["model"].stdout == "" and not (tmp / "data").exists()
