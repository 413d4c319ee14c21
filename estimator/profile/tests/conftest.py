import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SHARED = REPO.parent / "shared" / "data"
sys.path.insert(0, str(HERE.parent))  # carma_profile without installing it

from need import missing  # noqa: E402


@pytest.fixture(scope="session")
def carma_bin() -> Path:
    """The Rust CLI: $CARMA_BIN (CI sets it; it must exist then), else target/debug/carma."""
    env = os.environ.get("CARMA_BIN")
    if env:
        assert Path(env).is_file(), f"CARMA_BIN={env} does not exist"
        return Path(env)
    p = REPO / "target" / "debug" / "carma"
    if not p.is_file():
        missing("the carma binary", "cargo build -p carma, or set CARMA_BIN")
    return p


@pytest.fixture(scope="session")
def shared() -> Path:
    """../shared/data: CI always has it, so its absence fails rather than skips."""
    assert SHARED.is_dir(), f"{SHARED} is missing (the shared data beside the repo)"
    return SHARED
