"""The GPU check runs at its tiny size on CPU through its wrapper (no timing assertions)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "update step",
    "rollout",
    "fused log-prob",
    "remove padding",
    "shared prefix",
    "fsdp2",
    "tensor parallel",
    "vllm rollout",
)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown row of the table, header and rule left out."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| section ") and "---" not in line:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_tiny_run_prints_every_section_and_none_errors(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    env["RUNS_DIR"] = str(tmp_path / "runs")
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--tiny", "--device", "cpu", "--budget-s", "300"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = table_rows(proc.stdout)
    assert all(len(r) == 5 for r in rows), rows
    by_section = {name: [r for r in rows if r[0] == name] for name in SECTIONS}
    for name, section_rows in by_section.items():
        metrics = [r[2] for r in section_rows]
        assert "section wall s" in metrics, (name, section_rows)
        assert len(metrics) >= 2, (name, section_rows)  # a result row besides its timing
        assert "error" not in metrics and "skipped" not in metrics, (name, section_rows)
    assert {r[0] for r in rows} == set(SECTIONS)

    update = [r for r in by_section["update step"] if r[2] == "tokens/s"]
    assert len(update) == 2 and all(float(r[3].replace(",", "")) > 0 for r in update)
    assert [r[3] for r in by_section["update step"] if r[2] == "MFU"] == ["n/a", "n/a"]
    rollout = [r for r in by_section["rollout"] if r[2] == "tokens/s"]
    assert len(rollout) == 2 and all("all rows ran to length" in r[4] for r in rollout)
    # vLLM is installed here (.venv-vllm): its server ran the tiny model.
    served = [r for r in by_section["vllm rollout"] if r[2] == "tokens/s"]
    assert len(served) == 2 and all(float(r[3].replace(",", "")) > 0 for r in served)
    (sync,) = [r for r in by_section["vllm rollout"] if r[2] == "weight sync s"]
    assert float(sync[3]) > 0 and "reload from disk" in sync[4]
    memory = {r[2]: r for r in by_section["fused log-prob"]}
    assert "151,936" in memory["fused peak GiB"][1]
    assert float(memory["fused / naive memory"][3]) < 1.0  # the naive kernel holds V-wide logits
    (speedup,) = [r for r in by_section["remove padding"] if r[2].startswith("speedup")]
    assert speedup[3].endswith("x") and "attention sdpa" in speedup[4]
    (shared,) = [r for r in by_section["shared prefix"] if r[2].startswith("speedup")]
    assert shared[3].endswith("x") and "2 prompts x 2 responses" in shared[1]
    # The same log-probs, compared in float32 (the timed passes run under bf16 autocast,
    # where the layouts round differently on CPUs with native bf16 products).
    for row in (speedup, shared):
        assert row[4].endswith(" (float32)")
        assert float(row[4].rsplit("max abs logp diff ", 1)[1].split()[0]) < 1e-4
    split = [r for r in by_section["tensor parallel"] if r[2] == "step s"]
    assert [r[1] for r in split] == ["1 process", "2 processes, t = 2"]
    assert all(float(r[3]) > 0 and "MiB per process" in r[4] for r in split)
    fsdp = {r[2]: r for r in by_section["fsdp2"]}
    assert fsdp["loss finite"][3] == "yes" and "sharded=True" in fsdp["step s (after the first)"][4]

    copy = (tmp_path / "out" / "gpu_check.md").read_text()
    assert table_rows(copy) == rows
    assert len(list((tmp_path / "runs").glob("gpu_check_*.md"))) == 1
    # The progress log holds every row too (echoed as added), so a killed run keeps them.
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert [r[0] for r in rows] == [
        line.strip().split(" | ")[0]
        for line in log.splitlines()
        if line.startswith("  ") and " | " in line
    ]
    assert len(list((tmp_path / "runs").glob("gpu_check_*.log"))) == 1


def test_without_gin_or_its_wheel_the_wrapper_stops_naming_the_wheel_to_fetch(tmp_path):
    # A package named gin that fails to import stands for a machine without gin-config.
    (tmp_path / "hidden" / "gin").mkdir(parents=True)
    (tmp_path / "hidden" / "gin" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'gin'\")\n"
    )
    (tmp_path / "wheels").mkdir()
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(tmp_path / "hidden"))
    env.update(WHEELS=str(tmp_path / "wheels"), RUNS_DIR=str(tmp_path / "runs"))
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--tiny", "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "rlkit needs gin-config" in proc.stderr
    assert f"gin-config==0.5.0 -d {tmp_path / 'wheels'}" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "runs").exists()  # stopped before any work


def test_a_section_whose_cleanup_fails_becomes_an_error_row_and_the_run_goes_on(tmp_path):
    # After a CUDA error, freeing memory between sections raises too; that must not lose
    # the table the earlier sections filled.
    gpu_check = load_benchmark("gpu_check.py")

    class BrokenDevice(gpu_check.Context):
        def free(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    ctx = BrokenDevice(
        device=torch.device("cpu"),
        autocast_dtype=None,
        sizes=gpu_check.TINY,
        table=gpu_check.Table(),
        budget_s=60.0,
        start=0.0,
        workdir=tmp_path,
        platform=None,
    )
    ctx.table.add("update step", "tiny", "tokens/s", "1,000")
    with gpu_check.timed_section(ctx, "rollout"):
        ctx.table.add("rollout", "tiny", "tokens/s", "500")
    rows = [row[:4] for row in ctx.table.rows]
    assert rows[:3] == [
        ("update step", "tiny", "tokens/s", "1,000"),
        ("rollout", "tiny", "tokens/s", "500"),
        ("rollout", "-", "error", "ERROR"),
    ]
    assert "freeing memory: RuntimeError: CUDA error" in ctx.table.rows[2][4]
    assert rows[3][:3] == ("rollout", "total", "section wall s")
