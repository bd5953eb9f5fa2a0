"""The course's compiled DQN against rejax's, paired: the same 16 seeds, the same budget, whole processes, alternated.

    python benchmarks/peers/pair_dqn_rejax.py --rejax-python .venv-rejax/bin/python
    python benchmarks/peers/pair_dqn_rejax.py --rejax-python .venv-rejax/bin/python --total-timesteps 100000 --rounds 1

Run it in the course's venv, from the repository root. Each round runs, one after the other,
`python 2_Cart_Pole_DQN/cart_pole_dqn.py --backend jax --num-seeds N --seed S` (this Python; its compiled
programs come from the compilation cache, which one untimed run fills first) and
`benchmarks/peers/rejax_dqn_cartpole.py --seeds S --num-seeds N` (rejax's venv, --rejax-python; rejax keeps no
compilation cache, so its time includes compiling). Both train N seeds in one vmapped call and score each seed's
parameters on the same 100 gymnasium episodes (reset seed 10000); the course keeps its best validation
parameters (its default), rejax its final ones. The table gives each command's whole-process seconds (median of
the rounds) and each seed's return, which are the same in every round. Timings need a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def run(argv: list[str], out: Path) -> tuple[float, dict]:
    """Whole-process seconds of `argv --out out`, and the metrics.json it wrote. A failed run exits in one line."""
    start = time.perf_counter()
    proc = subprocess.run([*argv, "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        sys.exit(f"error: {' '.join(argv[:2])} failed: {last}")
    course_run = out / "latest" / "metrics.json"  # the course script's run folder; rejax writes into --out itself
    return seconds, json.loads((course_run if course_run.exists() else out / "metrics.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rejax-python", required=True, help="the Python of rejax's venv (requirements_rejax.txt)")
    p.add_argument("--seed", type=int, default=200, help="first seed; seeds S … S+N−1 (default: held-out 200)")
    p.add_argument("--num-seeds", type=int, default=16)
    p.add_argument("--total-timesteps", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds; the median seconds are shown")
    args = p.parse_args()
    if args.rounds < 1 or args.num_seeds < 1:
        sys.exit("error: --rounds and --num-seeds must be >= 1")
    if not Path(args.rejax_python).exists():
        sys.exit(f"error: --rejax-python {args.rejax_python}: no such file")
    seeds = ["--num-seeds", str(args.num_seeds), "--total-timesteps", str(args.total_timesteps)]
    commands = {
        "course (--backend jax)": [sys.executable, "2_Cart_Pole_DQN/cart_pole_dqn.py", "--backend", "jax"]
        + ["--seed", str(args.seed), *seeds],
        "rejax": [args.rejax_python, "benchmarks/peers/rejax_dqn_cartpole.py", "--seeds", str(args.seed), *seeds],
    }
    with tempfile.TemporaryDirectory() as tmp:
        run(commands["course (--backend jax)"], Path(tmp) / "warmup")  # fills the compilation cache, untimed
        seconds = {name: [] for name in commands}
        returns = {}
        for r in range(args.rounds):
            for name, argv in commands.items():
                secs, metrics = run(argv, Path(tmp) / f"{r}_{len(seconds[name])}_{name[:5]}")
                seconds[name].append(secs)
                got = [round(x, 1) for x in metrics["eval_return_per_seed"]]
                if returns.setdefault(name, got) != got:
                    sys.exit(f"error: {name}: round {r + 1} scored other returns than round 1")
    first = args.seed
    last = first + args.num_seeds - 1
    print(f"{args.num_seeds} seeds ({first}–{last}) × {args.total_timesteps} env steps, one vmapped call each")
    print(f"{'':24} {'whole process s (median)':>26} {'rounds':>24} {'solved (>= 475)':>16}")
    for name in commands:
        solved = sum(x >= 475 for x in returns[name])
        rounds = " ".join(f"{s:.1f}" for s in seconds[name])
        print(f"{name:24} {statistics.median(seconds[name]):26.1f} {rounds:>24} {solved:>13}/{args.num_seeds}")
    for name in commands:
        print(f"{name} per seed: " + " ".join(f"{first + i}:{x:.1f}" for i, x in enumerate(returns[name])))


if __name__ == "__main__":
    main()
