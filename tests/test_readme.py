"""The README's promises: its Python example runs, its commands match CI."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks, "README has no Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert namespace["loss"].grad_fn is not None or namespace["loss"].requires_grad
    assert set(namespace["metrics"]) >= {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"}


def test_ci_runs_the_readme_test_command():
    command = ".venv/bin/python -m pytest -q"
    assert command in README
    assert command in (ROOT / ".ci" / "run").read_text()


def test_readme_main_command_names_an_existing_experiment():
    match = re.search(r"rlkit train (experiments/\S+\.gin)", README)
    assert match and (ROOT / match.group(1)).is_file()
