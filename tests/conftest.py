"""Shared test helpers.

The numbered module folders (``1_Q_Learning/`` …) are not importable packages, so
``load_script`` imports a script by its path. Tests then use its ``main``, ``Args`` and
math functions directly, e.g.::

    from conftest import load_script
    ql = load_script("1_Q_Learning/Q_Learning.py")
    ql.main(ql.Args(episodes=300, out=str(tmp_path)))

``run_script`` runs a script's CLI in a subprocess, the way a user does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Tests are CPU-only and reproducible; set before any test imports jax.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")
# Tests write nothing into the repo tree, not even __pycache__ beside the imported scripts.
sys.dont_write_bytecode = True
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

import jax  # noqa: E402

# The tests' own compiled programs go where the scripts keep theirs (JAX's persistent compilation cache, outside the
# repository), so a second `pytest` loads them instead of compiling them again. Set in this process only: a script
# run as a subprocess chooses for itself (--compile-cache; '' turns it off, which the compile-warning tests need).
jax.config.update("jax_compilation_cache_dir", os.path.expanduser("~/.cache/jax-rl-course"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# One loader for tests and tools: tools/course.py imports a script as the module course_<name>, once per process.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from course import REPO, free_port, load_script  # noqa: E402

__all__ = ["REPO", "load_script", "run_script"]


def run_script(relpath: str, *args: str, cwd: Path, timeout: float = 300, env: dict | None = None):
    """Run ``python REPO/relpath args…`` in ``cwd``; return the CompletedProcess (text mode)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(REPO / relpath), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch_processes(relpath: str, flags: list[str], cwd: Path, out, last=lambda i: ()) -> list[subprocess.Popen]:
    """``python REPO/relpath flags`` as 2 processes on this machine joined by --distributed (a free port on
    localhost), started at once; process i writes under out(i) and gets last(i) as its last flags."""
    common = [sys.executable, str(REPO / relpath), *flags, "--distributed", "--num-processes", "2"]
    common += ["--coordinator-address", f"localhost:{free_port()}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return [
        subprocess.Popen([*common, "--process-id", str(i), "--out", str(out(i)), *last(i)], cwd=cwd, env=env, **pipes)
        for i in (0, 1)
    ]


def pytest_configure(config):
    """The unit and smoke tiers check what the code does, not how fast it runs: there XLA compiles with its CPU
    backend's optimizations off (--xla_backend_optimization_level=0, for this process and the scripts it starts),
    which cuts the compiling that a cold `pytest` spends most of its time on. A run with the learning or
    integration tier compiles as a learner's run does. Runs before any test module is imported, so before JAX
    starts its backend."""
    if "not learning" in config.option.markexpr and "not integration" in config.option.markexpr:
        flags = os.environ.get("XLA_FLAGS", "")
        if "--xla_backend_optimization_level" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()


# The heaviest test files first. `--dist loadfile` hands whole files to the workers in the order they were collected,
# so a heavy file collected last (test_interrupt.py, in alphabetical order) would run on one worker while the others
# wait with nothing left to do.
HEAVY_FIRST = ("test_grpo.py", "test_interrupt.py", "test_pendulum.py", "test_dqn.py", "test_sharding.py")


def pytest_collection_modifyitems(items):  # pytest calls it with the collected tests
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: each file keeps its order
