"""The trainer package stays readable: one concern per module, none past 600 lines."""

from __future__ import annotations

from pathlib import Path

TRAINER = Path(__file__).resolve().parents[1] / "rlkit" / "trainer"
LIMIT = 600


def test_no_trainer_module_is_over_600_lines():
    sizes = {
        str(path.relative_to(TRAINER)): len(path.read_text().splitlines())
        for path in TRAINER.rglob("*.py")
    }
    assert sizes, "no module found under rlkit/trainer"
    too_long = {name: n for name, n in sizes.items() if n > LIMIT}
    assert not too_long, f"split these by concern (over {LIMIT} lines): {too_long}"
