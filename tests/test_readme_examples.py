"""README "Extending rlpost": every example file is copied verbatim into a temporary folder and
its tests run there, in a fresh process (the examples register names of their own)."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_files() -> dict[str, str]:
  """{path: source} of the README's code blocks that start with ``# file: path``."""
  text = (ROOT / "README.md").read_text()
  section = text[text.index("## Extending rlpost"):]
  section = section[:section.index("\n## ", 1)]
  out = {}
  for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
    first, _, rest = block.partition("\n")
    m = re.fullmatch(r"# file: (\S+)", first)
    if m:
      out[m.group(1)] = rest
  return out


def test_readme_extension_examples_run(tmp_path):
  files = readme_files()
  names = sorted(pathlib.PurePath(p).name for p in files)
  assert names == ["disagreement.py", "length_cost.py", "midrange.py", "parity.py",
                   "running_baseline.py", "test_disagreement.py", "test_length_cost.py",
                   "test_midrange.py", "test_parity.py", "test_running_baseline.py"]
  for path, source in files.items():
    dest = tmp_path / path
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(source)
  (tmp_path / "myext" / "__init__.py").write_text("")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         str(tmp_path / "myext")], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert "8 passed" in proc.stdout, proc.stdout[-2000:]
