"""The shared-prefix decode benchmark runs end to end on a tiny decoder (no timing assertions)."""

from __future__ import annotations

from tests.benchmark_scripts import load_benchmark


def _table(out: str, header: str) -> list[list[str]]:
    lines = out[out.index(header) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_benchmark_prints_both_tables_with_agreeing_results(capsys):
    sizes = ["--hidden-size", "16", "--layers", "2", "--prompts", "2", "--n", "3"]
    benchmark = load_benchmark("shared_prefix_decode.py")
    argv = [*sizes, "--widths", "5,9", "--own", "1,3", "--shapes", "5x6,40x4"]
    assert benchmark.main([*argv, "--pairs", "2", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    attention = _table(out, "| prompt tokens")
    assert [row[:2] for row in attention] == [["5", "1"], ["5", "3"], ["9", "1"], ["9", "3"]]
    assert all(float(row[-1]) < 1e-5 for row in attention)  # the two outputs agree
    loop = _table(out, "| prompt + new tokens")
    assert [row[0] for row in loop] == ["5 + 6", "40 + 4"]
    for row in loop:
        assert len(row[3].split(" / ")) == 2  # one ratio per pair
        assert row[5] == "yes" and float(row[6]) < 1e-4  # same tokens, log-probs agree
