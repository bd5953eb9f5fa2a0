"""What the tools share: the repository root, a loader for the course's scripts (their numbered folders are not
Python packages, so a tool imports a script by its path), and a way to run tests on a copy of a script with one
line changed (the exercises' "change this line" answers)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port on localhost that nothing listens on, for a --distributed run's coordinator."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


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


def changed_source(script: str, name: str, piece: str, replacement: str) -> str:
    """REPO/script's source with `piece` replaced; the change called `name` must match the source exactly once."""
    source = (REPO / script).read_text(encoding="utf-8")
    if source.count(piece) != 1:
        raise SystemExit(f"error: the change {name!r} does not match {script} exactly once; update CHANGES")
    return source.replace(piece, replacement)


def pytest_on_a_changed_copy(script: str, source: str, parts: tuple[str, ...], pytest_args: list[str]) -> str:
    """Copy `parts` of the repository (and pytest.ini) into a temporary folder, write `source` as `script` there, run
    pytest with `pytest_args` in that copy: 'fails', 'PASSES', or the error. The repository itself is not touched."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for part in parts:
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "assets"))
        shutil.copy(REPO / "pytest.ini", root / "pytest.ini")
        (root / script).write_text(source, encoding="utf-8")
        command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", ""]
        proc = subprocess.run([*command, *pytest_args], cwd=root, capture_output=True, text=True)
    return {0: "PASSES", 1: "fails"}.get(proc.returncode, f"error (pytest exit status {proc.returncode})")
