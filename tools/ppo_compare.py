"""Run 3_Pendulum/pendulum.py once per set of flags, and compare the runs' training diagnostics side by side.

Each set of flags is one run of the default backend, `python 3_Pendulum/pendulum.py --seed S --out <out>/run_I
FLAGS`, in its own process, one after another; '' is the defaults. From each run's metrics.json it prints one row:

    final test return    eval_return_mean (20 deterministic episodes)
    entropy              H[π] at the first and at the last update
    kl, clip_frac,       the mean over all updates of the progress line's fields
    outside_frac
    explained_var        the mean over the last 10 updates (the critic once it has had time to learn)

and with --plot FIELD, <out>/FIELD.png: FIELD of every update against environment steps, one line per run.

    python tools/ppo_compare.py --plot entropy -- '' '--sigma state' '--ent-coef 0.01'
    python tools/ppo_compare.py --seed 1 --out runs/compare_clip -- '--clip-eps 0.05' '--clip-eps 0.5'

One seed is one run: a claim about learning needs tools/seeds.py's many seeds; this table shows what the
diagnostics of the progress line do when a flag changes.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import unwritable  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "3_Pendulum" / "pendulum.py"
FIELDS = ("pg_loss", "v_loss", "approx_kl", "clip_frac", "outside_frac", "entropy", "explained_var")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="The sets of flags follow --.")
    p.add_argument("--seed", type=int, default=0, help="the seed of every run")
    p.add_argument("--out", default="runs/compare", help="folder for the runs and the figure")
    p.add_argument("--plot", default="", choices=("", *FIELDS), help="draw this history field of every run")
    argv = sys.argv[1:] if argv is None else argv
    ours, configs = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    a = p.parse_args(ours)
    if not configs:
        p.exit(1, "error: give the sets of flags after --, e.g. -- '' '--sigma state' ('' = the defaults)\n")
    if a.seed < 0:
        p.exit(1, f"error: --seed must be >= 0, got {a.seed}\n")
    if why := unwritable(a.out):
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({why})\n")
    a.configs = configs
    return a


def run(flags: str, seed: int, out: Path) -> dict:
    """One training run in its own process; its metrics.json (<out>/latest: the run's own folder)."""
    out = out.resolve()  # the run's process starts in the repository root
    argv = [sys.executable, str(SCRIPT), "--seed", str(seed), "--out", str(out), *shlex.split(flags)]
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        sys.exit(f"error: pendulum.py {shlex.join(argv[2:])} exited {proc.returncode}: {last}")
    return json.loads((out / "latest" / "metrics.json").read_text())


def row(flags: str, m: dict) -> str:
    h = {name: np.array([u[name] for u in m["history"]]) for name in FIELDS}
    return (
        f"| `{flags or '(defaults)'}` | {m['eval_return_mean']:.1f} | {h['entropy'][0]:.2f} → {h['entropy'][-1]:.2f} | "
        f"{h['approx_kl'].mean():.4f} | {h['clip_frac'].mean():.3f} | {h['outside_frac'].mean():.3f} | "
        f"{h['explained_var'][-10:].mean():.3f} |"
    )


def plot(path: Path, field: str, runs: list[tuple[str, dict]], seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for flags, m in runs:
        steps = [u["step"] for u in m["history"]]
        label = f"{flags or 'defaults'} (test return {m['eval_return_mean']:.0f})"
        ax.plot(steps, [u[field] for u in m["history"]], lw=1.8, label=label)
    ax.set(xlabel="environment steps", ylabel=field, title=f"PPO on Pendulum-v1, seed {seed}: {field} per update")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    a = parse(argv)
    out = Path(a.out)
    runs = [(flags, run(flags, a.seed, out / f"run_{i}")) for i, flags in enumerate(a.configs)]
    print(f"seed {a.seed}, one run per row (python 3_Pendulum/pendulum.py --seed {a.seed} FLAGS)")
    print("| flags | final test return | entropy, first → last update | kl (mean) | clip_frac (mean) | ", end="")
    print("outside_frac (mean) | explained_var (last 10 updates) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for flags, m in runs:
        print(row(flags, m))
    if a.plot:
        plot(out / f"{a.plot}.png", a.plot, runs, a.seed)
        print(f"\nfigure: {out / (a.plot + '.png')}")
    return [m for _, m in runs]


if __name__ == "__main__":
    main()
