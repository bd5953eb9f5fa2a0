"""The Q-table of one run of 1_Q_Learning/Q_Learning.py drawn as a map, next to value iteration's.

    python 1_Q_Learning/Q_Learning.py --env frozenlake --slippery
    python tools/q_map.py runs/q_learning                     # its latest run; or name a run's own folder
    python tools/q_map.py runs/q_learning --out runs/q_map

The script prints the learned table as a board, the greedy arrow and max_a Q(s, a) in each state, next to value
iteration's π*(s) and V*(s) = max_a Q*(s, a). This tool draws the same two boards as a picture: the values as colour
on one scale, the arrows over them, the holes and the goal marked. A run keeps no table, so the tool trains it again
from the flags its metrics.json records (the same flags and seed give the same run) and refuses, in one line, when
the metrics come out different. It prints each state whose learned greedy action is not π*'s, with what that action
gives up under Q*, and writes <out>/q_map.png. The course script is imported by path (like tests/conftest.py); the
script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script, unwritable  # noqa: E402

SCRIPT = "1_Q_Learning/Q_Learning.py"


def run_folder(run: str) -> Path:
    """A run's own folder: <run>/latest for a Q_Learning.py --out folder, else <run> itself."""
    return Path(run) / "latest" if (Path(run) / "latest").is_dir() else Path(run)


def train_again(ql, recorded: dict):
    """The run's table, trained again as main trains it: (args, env, q, reference, the metrics it gives)."""
    args = ql.Args(**recorded["args"])
    env = ql.make_env(args)
    env.reset(seed=args.seed)
    model = ql.env_model(env)
    reference = ql.solve_reference(model, args)
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines: the run printed them already
        q, log = ql.train(env, model, reference, args, np.random.default_rng(args.seed))
    metrics = ql.collect_metrics(args, reference, log, ql.evaluate_final(env, log.evals[-1].policy, args))
    return args, env, q, reference, metrics


def plot_q_map(path: str, tiles: np.ndarray, tables: list[tuple[str, np.ndarray]], title: str, arrows: str) -> None:
    """One map per (panel title, Q-table), on one colour scale: max_a Q(s, a) as colour, the greedy arrow over it;
    `tiles` is the map row by row ('H' hole, 'G' goal), `arrows` the action symbols."""
    from matplotlib.figure import Figure  # drawn straight into a file: no window, no pyplot

    low = min(float(q.max(axis=1).min()) for _, q in tables)
    high = max(float(q.max(axis=1).max()) for _, q in tables)
    fig = Figure(figsize=(9.5, 4.6))
    axes = fig.subplots(1, len(tables))
    for ax, (panel, q) in zip(axes, tables):
        values, policy = q.max(axis=1), q.argmax(axis=1)
        image = ax.imshow(values.reshape(4, 4), cmap="viridis", vmin=low, vmax=high)
        for s, tile in enumerate(tiles):
            row, col = divmod(s, 4)
            if tile in "HG":
                ax.fill_between([col - 0.5, col + 0.5], row - 0.5, row + 0.5, color="0.85" if tile == "H" else "gold")
                ax.text(col, row, "hole" if tile == "H" else "goal", ha="center", va="center", fontsize=11)
                continue
            color = "white" if values[s] < low + 0.55 * (high - low) else "black"
            ax.text(col, row - 0.12, arrows[policy[s]], ha="center", va="center", fontsize=22, color=color)
            ax.text(col, row + 0.3, f"{values[s]:.2f}", ha="center", va="center", fontsize=9, color=color)
        ax.set(title=panel, xticks=range(4), yticks=range(4), xlabel="column", ylabel="row")
        ax.title.set_fontsize(10)
    fig.colorbar(image, ax=axes, shrink=0.8, label="value")
    fig.suptitle(title)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", help="a Q_Learning.py --out folder (its latest run) or a run's own folder")
    p.add_argument("--out", default="runs/q_map", help="folder for q_map.png")
    a = p.parse_args(argv)
    if not (run_folder(a.run) / "metrics.json").is_file():
        p.exit(1, f"error: {run_folder(a.run) / 'metrics.json'}: no such file (give a Q_Learning.py --out folder)\n")
    if why := unwritable(a.out):
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({why})\n")
    return a


def main(argv=None) -> list[int]:
    """Draw the map; return the states whose learned greedy action differs from π*."""
    a = parse(argv)
    ql, folder = load_script(SCRIPT), run_folder(a.run)
    recorded = json.loads((folder / "metrics.json").read_text())
    args, env, q, reference, metrics = train_again(ql, recorded)
    changed = sorted(k for k in metrics if k != "train_seconds" and metrics[k] != recorded.get(k))
    if changed:
        sys.exit(f"error: trained again, {folder} gives other metrics ({', '.join(changed)}): another script version?")
    print(
        f"{folder}: {metrics['env']}, seed {args.seed}, {metrics['episodes']} episodes, trained again: the same "
        f"metrics (greedy_success_rate_exact={metrics['greedy_success_rate_exact']:.4f} "
        f"value_gap={metrics['value_gap']:.3g} episodes_to_optimal={metrics['episodes_to_optimal']})"
    )
    tiles = env.unwrapped.desc.astype(str).flatten()
    learned, best = ql.greedy_policy(q), ql.greedy_policy(reference.q_star)
    differ = [s for s in range(len(tiles)) if tiles[s] not in "HG" and learned[s] != best[s]]
    print(f"states where the learned greedy action is not π*'s: {len(differ)}, with V*(s) − Q*(s, learned action)")
    for s in differ:
        given_up = float(reference.v_star[s] - reference.q_star[s, learned[s]])  # V* = max_a Q*: never negative
        print(f"  state {s}: {ql.ARROWS[learned[s]]} (π* {ql.ARROWS[best[s]]})  {given_up:.4f}")
    path = os.path.join(a.out, "q_map.png")
    tables = [
        ("learned: max_a Q(s, a) and argmax", q),
        (f"value iteration (γ = {args.gamma}): V*(s) and π*(s)", reference.q_star),
    ]
    title = f"Q-table as a map, {metrics['env']}, seed {args.seed}, {metrics['episodes']} episodes"
    plot_q_map(path, tiles, tables, title, ql.ARROWS)
    print(f"wrote {path}")
    return differ


if __name__ == "__main__":
    main()
