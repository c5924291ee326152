"""Where the seed scripts live: ``../shared/seeds`` next to the repository (or next to an ancestor,
for a git worktree nested deeper). Tests that need them skip with the path in the reason."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _find() -> Path:
    for parent in ROOT.parents:
        candidate = parent / "shared" / "seeds"
        if candidate.is_dir():
            return candidate
    return ROOT.parent / "shared" / "seeds"


SEEDS = _find()


def seed(number: str) -> Path | None:
    """The seed file whose name starts with ``number`` (``"004"``), or ``None``."""
    found = sorted(SEEDS.glob(f"{number}_*.txt")) if SEEDS.is_dir() else []
    return found[0] if found else None
