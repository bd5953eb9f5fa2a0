"""What the tools share: the repository root, and a loader for the course's scripts (their numbered folders are not
Python packages, so a tool imports a script by its path)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def load_script(relpath: str):
    """Import REPO/relpath as the module `course_<name>` (once per process) and return it; the module is registered
    in sys.modules first, because dataclasses look their module up there."""
    path = REPO / relpath
    name = "course_" + path.stem.lower()
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def unwritable(folder: str) -> str | None:
    """Why a tool cannot write into `folder`, or None if it can: the folder is made if missing, then probed with a
    file that is removed again. Tools check this before any work, so a bad --out costs nothing."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".write_test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        return e.strerror or type(e).__name__
    return None
