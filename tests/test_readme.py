"""The README's promises: its Python example runs, its commands match CI, its links resolve."""

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


def test_readme_states_both_commands_exactly():
    assert "bash scripts/setup.sh && .venv/bin/rlkit train experiments/demo.gin" in README
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in README


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown`` (code blocks skipped)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    for heading in re.findall(r"^#{1,6}\s+(.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_readme_links_resolve():
    text = re.sub(r"```.*?```", "", README, flags=re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else ROOT / "README.md"
        missing_anchor = (
            path.exists() and anchor and path.suffix == ".md"
        ) and anchor not in _anchors(path.read_text())
        if not path.exists() or missing_anchor:
            broken.append(link)
    assert not broken, f"README links to missing files or headings: {broken}"
