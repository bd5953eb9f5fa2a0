"""Table and figure of the policy-gradient ladder from many-seed runs of 3_Pendulum/pendulum.py --backend jax.

Each folder is the --out of a `--num-seeds N` run, whose <folder>/latest/metrics.json holds its per-seed returns; this
tool summarises them with tools/seeds.py's seed_summary (the IQM with a 95 % bootstrap CI, and how many reach −200):

    for steps in 100000 500000; do for algo in reinforce reinforce-baseline a2c ppo; do
      python 3_Pendulum/pendulum.py --backend jax --num-seeds 16 --algo $algo --num-envs 10 --num-steps 200 \\
        --total-timesteps $steps --out runs/ladder/${algo}_${steps}
    done; done
    python tools/pg_ladder.py runs/ladder/*_100000 runs/ladder/*_500000 --out runs/ladder

Writes <out>/ladder.md (a table to paste into a README) and <out>/ladder.png (every seed's return per rung).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeds import seed_summary  # noqa: E402

ORDER = ("reinforce", "reinforce-baseline", "a2c", "ppo")


def load(folders):
    runs = []
    for f in folders:
        path = Path(f) / "latest" / "metrics.json"  # the --out folder's newest complete run
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"error: {path}: cannot read it ({type(e).__name__})")
        if len(m.get("eval_return_per_seed", [])) < 2:
            sys.exit(f"error: {path} is a one-seed run; the ladder needs --num-seeds > 1")
        across = seed_summary(m["eval_return_per_seed"], -200.0)
        runs.append(dict(m, algo=m["args"]["algo"], across_seeds=across))  # the rung, from the flags the run saved
    return sorted(runs, key=lambda m: (m["env_steps"], ORDER.index(m["algo"]) if m["algo"] in ORDER else 9))


def table(runs) -> str:
    lines = [
        "| rung (`--algo`) | env steps per seed | seeds | IQM [95 % CI] | mean | min | max | solved (≥ −200) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in runs:
        a = m["across_seeds"]
        ci = "[{:.0f}, {:.0f}]".format(*a["iqm_ci"]) if a["iqm_ci"] else ""
        lines.append(
            f"| `{m['algo']}` | {m['env_steps']:,} | {a['n']} | {a['iqm']:.0f} {ci} | {a['mean']:.0f} | "
            f"{a['min']:.0f} | {a['max']:.0f} | {a['solved']}/{a['n']} |"
        )
    return "\n".join(lines)


def plot(path, runs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = sorted({m["env_steps"] for m in runs})
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    width = 0.8 / len(budgets)
    rng = np.random.default_rng(0)  # horizontal jitter only
    for j, b in enumerate(budgets):
        for m in (m for m in runs if m["env_steps"] == b):
            x = ORDER.index(m["algo"]) + (j - (len(budgets) - 1) / 2) * width
            y = np.asarray(m["eval_return_per_seed"])
            ax.scatter(
                x + rng.uniform(-0.25, 0.25, len(y)) * width,
                y,
                s=12,
                alpha=0.7,
                color=f"C{j}",
                label=f"{b // 1000}k steps per seed" if m["algo"] == runs[0]["algo"] else None,
            )
            ax.hlines(m["across_seeds"]["iqm"], x - width / 2, x + width / 2, color="k", lw=2)
    ax.axhline(-200, color="gray", ls=":", lw=0.8)
    ax.set_xticks(range(len(ORDER)), ORDER)
    ax.set_ylabel("final deterministic return (gymnasium, 20 episodes)")
    ax.set_title("The policy-gradient ladder on Pendulum-v1: every seed, black bar = IQM", fontsize=10)
    ax.legend(fontsize=8, loc="center left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="--out folders of --num-seeds runs (each read at latest/metrics.json)")
    p.add_argument("--out", default="runs/ladder", help="folder for ladder.md and ladder.png")
    a = p.parse_args(argv)
    runs = load(a.runs)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    md = table(runs)
    Path(a.out, "ladder.md").write_text(md + "\n")
    plot(Path(a.out, "ladder.png"), runs)
    print(md + f"\n\nwrote {a.out}/ladder.md and {a.out}/ladder.png")


if __name__ == "__main__":
    main()
