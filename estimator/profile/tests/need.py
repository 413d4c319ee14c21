"""What a test needs from the machine, and what happens without it.

Locally a missing module, binary or data set skips the test and says how to provide it. Under
`CI=true` it fails instead, naming what is missing: CI must not pass with a real layer left out.
"""

import importlib
import os
from types import ModuleType

import pytest


def strict() -> bool:
    """Whether skips are refused (`CI=true`, as CI sets it)."""
    return os.environ.get("CI", "").strip().lower() == "true"


def missing(what: str, how: str) -> None:
    """Skip (locally) or fail (under CI=true) because `what` is missing; `how` says how to get it."""
    if strict():
        pytest.fail(f"CI=true: {what} is missing, so this test cannot run ({how}); "
                    "unset CI to let it skip on a developer machine", pytrace=False)
    pytest.skip(f"{what} is missing ({how}); under CI=true this fails", allow_module_level=True)


def require(module: str) -> ModuleType:
    """Import `module`, or skip / fail as [`missing`] says."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    missing(f"the Python module {module}", "the venv that ci/lib/profile-venv.sh makes has it")
    raise AssertionError("unreachable: missing() always raises")
