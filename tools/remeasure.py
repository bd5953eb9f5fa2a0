"""Measure every results file again with the command it records, on the Python and packages that run this tool.

Each file in `benchmarks/results/` records the command that wrote it (tools/results.py, `provenance`). This tool
reads those commands back and runs them again, each through the tool that writes its kind of file:

- `NAME.json` (and the `NAME.KEY.json` that `--also` adds) came from `python tools/seeds.py … --save NAME`: the
  command is run as it is;
- `NAME.txt` came from `python tools/capture.py NAME -- COMMAND`: COMMAND is captured again; or, for a tool in
  WRITES_ITS_OWN (tools/grpo_val_sweep.py), from the tool itself: it is run as it is.

    python tools/remeasure.py --list                 # every file: its command, date, seconds and JAX version
    python tools/remeasure.py --stale --list         # only those not measured on this environment's JAX
    python tools/remeasure.py dqn_seeds dqn_run      # these two, again
    python tools/remeasure.py --stale                # every file measured on another JAX, cheapest first
                                                     # (`NAME_py311` files: only from a Python 3.11 venv)
    python tools/remeasure.py --figures              # every capture that draws a figure: every figure, again

A few captures read the folders of earlier runs (`runs/…`); PREREQUISITES runs those first. Then
`python tools/results.py` fills the READMEs from the new files.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import REPO, RESULTS_DIR  # noqa: E402

LADDER = [
    f"python 3_Pendulum/pendulum.py --backend jax --num-seeds 16 --algo {algo} --num-envs 10 --num-steps 200 "
    f"--total-timesteps {steps} --out runs/ladder/{algo}_{steps}"
    for steps in (100000, 500000)
    for algo in ("reinforce", "reinforce-baseline", "a2c", "ppo")
]
# captures that read run folders which no results file writes: the runs that make those folders
PREREQUISITES = {
    "ppo_ladder": LADDER,
    "ppo_jax_seeds_iqm": ["python 3_Pendulum/pendulum.py --backend jax --num-seeds 16 --out runs/pendulum_jax16"],
    "ppo_value_map": ["python 3_Pendulum/pendulum.py"],
    "q_grid_map": ["python 1_Q_Learning/Q_Learning.py --out runs/capture/q_grid"],  # the run whose table it draws
    "q_frozenlake_map": [
        "python 1_Q_Learning/Q_Learning.py --env frozenlake --slippery --out runs/capture/q_frozenlake"
    ],
    "dqn_video": ["python 2_Cart_Pole_DQN/cart_pole_dqn.py --out runs/capture/dqn"],  # the latest/q_network it loads
    "ppo_video": ["python 3_Pendulum/pendulum.py"],
    "ppo_ex5_value_maps": [
        "python 3_Pendulum/pendulum.py",
        "python 3_Pendulum/pendulum.py --no-bootstrap-truncated --out runs/ex5/no_bootstrap",
        "python 3_Pendulum/pendulum.py --algo a2c --out runs/ex5/a2c",
    ],
}


# tools that write their own results file (a provenance header and a table), so they are not run through capture.py
WRITES_ITS_OWN = ("tools/grpo_val_sweep.py",)


class RemeasureError(Exception):
    """Bad input or a failed command: one line, exit status 1."""


def recorded(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """name -> {'command', 'kind' ('seeds' or 'capture'), 'seconds', 'jax', 'date'}, one entry per command
    (a seeds sweep's `NAME.KEY.json` files share their sweep's entry)."""
    found: dict[str, dict] = {}
    for path in sorted(results_dir.glob("*.json")):
        summary = json.loads(path.read_text())
        header, name = summary["provenance"], path.stem.split(".")[0]
        if name not in found:
            found[name] = dict(kind="seeds", command=header["command"], seconds=_sweep_seconds(summary))
            found[name].update(jax=header["versions"].get("jax"), date=header["date"])
    for path in sorted(results_dir.glob("*.txt")):
        header = json.loads(path.read_text().split("\n", 1)[0].removeprefix("# "))
        found[path.stem] = dict(kind="capture", command=header["command"], seconds=header.get("seconds"))
        found[path.stem]["figures"] = header.get("figures", [])
        found[path.stem].update(jax=header["versions"].get("jax"), date=header["date"])
    return found


def _sweep_seconds(summary: dict) -> float | None:
    """A seeds summary's whole sweep in seconds (its runs' median times their number), if it records one."""
    if summary.get("median_seconds") is None:
        return None
    return round(summary["median_seconds"] * summary["n"], 1)


def argv_of(command: str) -> list[str]:
    """A recorded command as argv for this interpreter: a leading `python` is this tool's own sys.executable."""
    argv = shlex.split(command)
    return [sys.executable, *argv[1:]] if argv and argv[0] in ("python", "python3") else argv


def run(argv: list[str]) -> float:
    """Run argv in the repository root, its output streamed through; return its seconds or raise RemeasureError."""
    start = time.perf_counter()
    code = subprocess.run(argv, cwd=REPO).returncode
    if code != 0:
        raise RemeasureError(f"{shlex.join(argv)} exited {code}")
    return time.perf_counter() - start


def remeasure(name: str, entry: dict) -> float:
    """Run the prerequisites of `name`, then its own command through the tool that writes its file."""
    for command in PREREQUISITES.get(name, []):
        run(argv_of(command))
    argv = argv_of(entry["command"])
    if entry["kind"] == "seeds" or argv[1] in WRITES_ITS_OWN:
        return run(argv)
    figures = [a for f in entry.get("figures", []) for a in ("--figure", f)]
    return run([sys.executable, "tools/capture.py", name, *figures, "--", *argv_of(entry["command"])])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="results files to measure again (without .json / .txt)")
    p.add_argument("--stale", action="store_true", help="every file whose recorded JAX is not this environment's")
    p.add_argument("--figures", action="store_true", help="every capture that draws a README's figure")
    p.add_argument("--list", action="store_true", help="only list the files and their commands; run nothing")
    args = p.parse_args(argv)
    entries = recorded()
    unknown = [n for n in args.names if n not in entries]
    if unknown:
        raise RemeasureError(f"no results file named {', '.join(unknown)} in {RESULTS_DIR}")
    jax_here = metadata.version("jax")
    names = args.names or sorted(entries, key=lambda n: entries[n]["seconds"] or 0.0)
    if args.stale:  # a `NAME_py311` file is measured on Python 3.11 on purpose: only a 3.11 run can renew it
        on_311 = sys.version_info[:2] == (3, 11)
        names = [n for n in names if entries[n]["jax"] != jax_here and n.endswith("_py311") == on_311]
    if args.figures:
        names = [n for n in names if entries[n].get("figures")]
    if args.list:
        for n in names:
            e = entries[n]
            print(f"{n}: jax {e['jax']}, {e['date']}, {e['seconds']} s: {e['command']}")
        return
    if not names:
        raise RemeasureError(
            "nothing to measure: name files, or --stale (every file is already on jax " + jax_here + ")"
        )
    for i, n in enumerate(names, 1):
        print(f"remeasure [{i}/{len(names)}] {n}: {entries[n]['command']}", flush=True)
        print(f"remeasure [{i}/{len(names)}] {n}: {remeasure(n, entries[n]):.1f} s", flush=True)


if __name__ == "__main__":
    try:
        main()
    except RemeasureError as e:
        sys.exit(f"error: {e}")
