"""What JAX's persistent compilation cache saves: `pytest` and each module's first run, cold and warm.

Every script that uses JAX keeps its compiled XLA programs in `--compile-cache` (default `~/.cache/jax-rl-course`),
and so do the tests, which run the scripts with their defaults. Each module runs with its defaults. A *cold* run starts
with that folder empty: every program is compiled. A *warm* run finds them all on disk. This tool times both, whole
process, in a fresh HOME so the real cache is never touched (matplotlib keeps its own font cache through
MPLCONFIGDIR):

    python tools/time_tests.py                      # pytest and the five module runs, 3 cold and 3 warm each
    python tools/time_tests.py --repeats 1 --only pytest

For each round it makes an empty HOME, runs the command once (cold), then again in the same HOME (warm), and
prints the median of the rounds, with the size of the compilation cache that the cold run left.
`python tools/capture.py test_timing -- python tools/time_tests.py` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import REPO  # noqa: E402

COMMANDS = {
    # the two docs checks that quote this tool's own results file cannot pass before that file exists; they take
    # milliseconds, so leaving them out does not change the timing
    "pytest": ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    + [
        f"--deselect=tests/test_docs.py::test_quoted_results_match_their_files[{r}]"
        for r in ("README.md", "README_ch.md")
    ],
    "1_Q_Learning": ["1_Q_Learning/Q_Learning.py"],
    "2_Cart_Pole_DQN": ["2_Cart_Pole_DQN/cart_pole_dqn.py"],
    "3_Pendulum": ["3_Pendulum/pendulum.py"],
    "4_GRPO_MNIST": ["4_GRPO_MNIST/grpo_mnist.py"],
    "5_Sharding_Mesh": ["5_Sharding_Mesh/sharding_mesh.py"],
}


CACHE = Path(".cache", "jax-rl-course")  # the scripts' default --compile-cache, under HOME


def folder_bytes(folder: Path) -> int:
    """Bytes of every file below `folder` (0 if it does not exist)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def timed(argv: list[str], home: Path, out: Path) -> float:
    """Seconds of one whole-process run of `python argv` with HOME=home; a script's run writes into `out`."""
    matplotlib_cache = Path(os.environ.get("MPLCONFIGDIR", Path.home() / ".cache" / "matplotlib"))
    env = {**os.environ, "HOME": str(home), "MPLCONFIGDIR": str(matplotlib_cache)}
    extra = [] if argv[0] in ("-m", "-c") else ["--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv, *extra], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        sys.exit(f"error: {' '.join(argv)} exited {proc.returncode}: {last[0]}")
    return seconds


def whole_processes(commands: dict, rounds: int, script: str) -> dict:
    """Run each command (the arguments after `python`) once cold and `rounds` times warm, alternating between the
    commands round by round. Each command keeps its own HOME (`timed`), so a script's compilation cache starts empty
    there and is warm from the second run on. Returns {name: (cold, warm)}, each a list of (seconds, its
    metrics.json for a run of `script`, else None) per run."""
    runs = {name: ([], []) for name in commands}
    with tempfile.TemporaryDirectory(prefix="whole_process_") as tmp:
        for i in range(rounds + 1):
            for k, (name, argv) in enumerate(commands.items()):
                home = Path(tmp, str(k))
                seconds = timed(argv, home, home / "run")
                latest = home / "run" / "latest" / "metrics.json"  # the run's own folder
                metrics = json.loads(latest.read_text()) if argv[0] == script else None
                runs[name][0 if i == 0 else 1].append((seconds, metrics))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="rounds of (cold, warm) per command; the median is shown")
    p.add_argument("--only", nargs="*", choices=sorted(COMMANDS), help="time only these (default: all)")
    args = p.parse_args()
    if args.repeats < 1:
        sys.exit("error: --repeats must be >= 1")
    rounds = "one round" if args.repeats == 1 else f"the median of {args.repeats} rounds"
    print(f"whole process, {rounds}; cold: empty compilation cache, warm: the same run again")
    print(f"{'command':<18} {'cold s':>8} {'warm s':>8} {'saved s':>8} {'cache MB':>9}")
    for name in args.only or COMMANDS:
        cold, warm, sizes = [], [], []
        for _ in range(args.repeats):
            home = Path(tempfile.mkdtemp(prefix="time_tests_"))
            try:
                cold.append(timed(COMMANDS[name], home, home / "run"))
                sizes.append(folder_bytes(home / CACHE) / 1e6)
                warm.append(timed(COMMANDS[name], home, home / "run"))
            finally:
                shutil.rmtree(home, ignore_errors=True)
        c, w = statistics.median(cold), statistics.median(warm)
        shown = "pytest" if name == "pytest" else "python " + " ".join(COMMANDS[name])
        mb = statistics.median(sizes)
        print(f"{name:<18} {c:8.1f} {w:8.1f} {c - w:8.1f} {mb:9.1f}   {shown}", flush=True)


if __name__ == "__main__":
    main()
