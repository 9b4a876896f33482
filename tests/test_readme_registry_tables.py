"""The README's registry tables are generated from the registries and kept current."""

import subprocess
import sys
from pathlib import Path

from rlkit.listing import (
    README_INDEX_KEY,
    REGENERATE_COMMAND,
    main,
    markdown_table,
    readme_drift,
    readme_tables,
    update_readme,
)
from rlkit.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_registry_tables_match_the_registries():
    # A fresh interpreter: tests in this process may have registered entries of their own.
    proc = subprocess.run(
        [sys.executable, "-m", "rlkit.listing", "--check-readme", str(README)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"README.md's registry tables are not those of the registries:\n{proc.stderr}"
        f"Regenerate them with: {REGENERATE_COMMAND}"
    )


def test_readme_shows_every_generated_table():
    text = README.read_text(encoding="utf-8")
    for key in readme_tables():
        assert f"<!-- registry:{key} -->" in text, key


def test_a_drifted_table_is_named_and_the_command_given(tmp_path, capsys):
    text = update_readme(README.read_text(encoding="utf-8"))
    assert readme_drift(text) == []
    drifted = text.replace("| `grpo` |", "| `grpo_old` |", 1)
    problems = readme_drift(drifted)
    assert len(problems) == 1 and "'estimators'" in problems[0], problems

    path = tmp_path / "README.md"
    path.write_text(drifted, encoding="utf-8")
    assert main(["--check-readme", str(path)]) == 1
    err = capsys.readouterr().err
    assert "'estimators' drifted" in err and REGENERATE_COMMAND in err
    assert path.read_text(encoding="utf-8") == drifted  # checking writes nothing

    assert main(["--update-readme", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == text


def test_missing_unclosed_and_unknown_tables_are_reported():
    tables = readme_tables()
    complete = "".join(
        f"<!-- registry:{key} -->\n{table}\n\n<!-- /registry -->\n" for key, table in tables.items()
    )
    assert readme_drift(complete) == []
    missing = complete.replace(f"<!-- registry:{README_INDEX_KEY} -->", "")
    assert any(f"{README_INDEX_KEY!r} is missing" in p for p in readme_drift(missing))
    unknown = complete + "<!-- registry:nonesuch -->\n\n<!-- /registry -->\n"
    assert any("unknown registry table 'nonesuch'" in p for p in readme_drift(unknown))
    unclosed = "<!-- registry:losses -->\n" + complete.split("<!-- registry:losses -->\n")[0]
    assert any("no closing" in p for p in readme_drift(unclosed))


def test_markdown_cells_keep_the_table_intact():
    registry = Registry("demo thing")

    @registry.register("odd", aliases=("o",), paper="arXiv:2402.03300")
    def odd():
        """|x| < 1 uses <think> tags."""

    table = markdown_table(registry)
    row = table.splitlines()[2]
    assert row == (
        "| `odd` | `o` | \\|x\\| &lt; 1 uses &lt;think&gt; tags | "
        "[arXiv:2402.03300](https://arxiv.org/abs/2402.03300) |"
    )


def test_list_markdown_prints_the_table(capsys):
    assert main(["--markdown", "estimators"]) == 0
    out = capsys.readouterr().out
    assert "| `grpo` | `grpo_vectorized` |" in out
