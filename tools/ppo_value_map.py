"""What a trained PPO agent learned, drawn over Pendulum's state plane (θ, θ̇).

Loads the actor and critic of one run of 3_Pendulum/pendulum.py (its checkpoint folder params/, and the flags it was
trained with from the metrics.json beside it), evaluates both networks on a grid of states

    θ ∈ [−π, π]  (0 = upright, ±π = hanging down),   θ̇ ∈ [−8, 8]   →   obs = (cos θ, sin θ, θ̇),

and draws two panels:

    left   the critic's V_φ(s) / --reward-scale: the discounted return the agent expects from s, in the
           units of the environment's rewards (the critic was trained on rewards × --reward-scale);
    right  the actor's mean torque μ_θ(s) = 2·tanh(·), the action of the deterministic evaluation.

Over both it draws the path (θ_t, θ̇_t) of one deterministic evaluation episode: the test start closest to
hanging straight down (the episode of the README's GIF), played on gymnasium's Pendulum-v1.

    python 3_Pendulum/pendulum.py --out runs/pendulum
    python tools/ppo_value_map.py runs/pendulum --out runs/value_map
    python tools/ppo_value_map.py runs/pendulum runs/other --out runs/value_maps   # one row of panels per run

Writes <out>/value_map.png and prints a few values read off the grid (for several runs, one table row each).
The course script is imported by path (like tests/conftest.py); the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script, unwritable  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="training runs: a pendulum.py --out folder (its latest run) or a run folder")
    p.add_argument("--grid", type=int, default=201, help="grid points along each axis")
    p.add_argument("--out", default="runs/value_map", help="folder for value_map.png")
    a = p.parse_args(argv)
    for run in map(run_folder, a.runs):
        if not (run / "metrics.json").is_file():
            p.exit(
                1,
                f"error: {run / 'metrics.json'}: no such file (give the --out folder of a pendulum.py training run)\n",
            )
    if a.grid < 2:
        p.exit(1, f"error: --grid must be >= 2, got {a.grid}\n")
    if why := unwritable(a.out):
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({why})\n")
    return a


def run_folder(run: str) -> Path:
    """A run's own folder: <run>/latest for a pendulum.py --out folder, else <run> itself."""
    return Path(run) / "latest" if (Path(run) / "latest").is_dir() else Path(run)


def state_grid(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """θ (n,), θ̇ (n,) and the observations (n, n, 3) of every grid state; row i is θ̇_i, column j is θ_j."""
    th = np.linspace(-np.pi, np.pi, n)
    thdot = np.linspace(-8.0, 8.0, n)
    T, W = np.meshgrid(th, thdot)
    obs = np.stack([np.cos(T), np.sin(T), W], axis=-1).astype(np.float32)
    return th, thdot, obs


def load_agent(pendulum, run: Path):
    """The run's actor and critic, its flags (metrics.json's args) and its observation statistics (a RunningMeanStd
    with --norm-obs, else None), loaded as pendulum.py --load loads them."""
    saved = json.loads((run / "metrics.json").read_text())["args"]
    actor, critic, rms = pendulum.load_params(pendulum.Args(**dict(saved, load=str(run / "params"))))
    return actor, critic, saved, rms


def swing_up_path(pendulum, actor, rms, eval_seed: int, episodes: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(θ_t, θ̇_t) and the return of the deterministic episode whose start hangs lowest (smallest cos θ)."""
    import gymnasium as gym

    starts = []
    for i in range(episodes):
        env = gym.make("Pendulum-v1")
        starts.append(env.reset(seed=eval_seed + i)[0][0])
        env.close()
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=eval_seed + int(np.argmin(starts)))
    path, total, done = [obs], 0.0, False
    while not done:
        mu = np.asarray(actor(pendulum.normalize_obs(obs[None], rms)).loc)[0]  # as the network saw it in training
        obs, r, term, trunc, _ = env.step(np.clip(mu, -2.0, 2.0))
        path.append(obs)
        total += float(r)
        done = term or trunc
    env.close()
    path = np.array(path)
    return np.arctan2(path[:, 1], path[:, 0]), path[:, 2], total


def plot(path: str, th, thdot, rows: list[dict]) -> None:
    """One row per run: V(s) / reward scale (left) and μ(s) (right), each with the swing-up path on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    fig, grid = plt.subplots(n, 2, figsize=(11.5, 4.6 * n), constrained_layout=True, squeeze=False)
    extent = (th[0], th[-1], thdot[0], thdot[-1])
    for axes, r in zip(grid, rows):
        th_t, thdot_t, ret = r["traj"]
        panels = (
            (r["value"], "viridis", None, "critic: V(s) / reward scale  (expected discounted return)"),
            (r["torque"], "coolwarm", (-2.0, 2.0), "actor: mean torque μ(s)"),
        )
        for ax, (img, cmap, lim, name) in zip(axes, panels):
            vmin, vmax = lim if lim else (None, None)
            im = ax.imshow(img, origin="lower", extent=extent, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)
            fig.colorbar(im, ax=ax, shrink=0.9)
            # θ jumps from π to −π when the pendulum passes the bottom: break the line there
            jump = np.flatnonzero(np.abs(np.diff(th_t)) > np.pi) + 1
            for k, (a, b) in enumerate(zip(np.split(th_t, jump), np.split(thdot_t, jump))):
                ax.plot(a, b, color="white", lw=2.4)
                ax.plot(a, b, color="black", lw=1.0, label=f"swing-up episode (return {ret:.0f})" if k == 0 else None)
            ax.plot(th_t[0], thdot_t[0], "o", color="black", mec="white", ms=7)
            ax.plot(0, 0, "*", color="gold", mec="black", ms=13)
            ax.set_xticks([-np.pi, -np.pi / 2, 0, np.pi / 2, np.pi], ["−π (down)", "−π/2", "0 (up)", "π/2", "π (down)"])
            ax.set_xlabel("angle θ")
            ax.set_ylabel("angular velocity θ̇")
            ax.set_title(name if n == 1 else f"{r['title']}\n{name}", fontsize=10)
        axes[1].legend(loc="lower right", fontsize=8)
    if n == 1:
        fig.suptitle(rows[0]["title"], fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_run(pendulum, run: Path, grid: int, th, thdot, obs) -> dict:
    """The critic's value and the actor's mean torque over the grid, the swing-up path and the summary of one run."""
    try:
        actor, critic, saved, rms = load_agent(pendulum, run_folder(run))
    except pendulum.RunError as e:
        sys.exit(f"error: {e}")
    x = pendulum.normalize_obs(obs.reshape(-1, 3), rms)
    value = np.asarray(critic(x)).reshape(grid, grid) / saved["reward_scale"]
    torque = np.asarray(actor(x).loc)[:, 0].reshape(grid, grid)
    traj = swing_up_path(pendulum, actor, rms, saved["eval_seed"], saved["eval_episodes"])
    metrics = json.loads((run_folder(run) / "metrics.json").read_text())
    title = (
        f"{saved['algo'].upper() if saved['algo'] == 'ppo' else saved['algo']} on Pendulum-v1, seed {saved['seed']}, "
        f"{metrics['env_steps']:,} steps: test return {metrics['eval_return_mean']:.1f}"
    )
    mid, down = grid // 2, 0
    summary = dict(
        v_upright_at_rest=float(value[mid, mid]),
        v_down_at_rest=float(value[mid, down]),
        v_min=float(value.min()),
        v_max=float(value.max()),
        share_of_states_above_1_5=float(np.mean(np.abs(torque) > 1.5)),
        swing_up_return=traj[2],
        swing_up_steps_to_upright=int(np.argmax(up)) if (up := np.abs(traj[0]) < 0.1).any() else None,
    )
    return dict(value=value, torque=torque, traj=traj, title=title, summary=summary)


def main(argv=None) -> dict | list[dict]:
    a = parse(argv)
    pendulum = load_script("3_Pendulum/pendulum.py")
    th, thdot, obs = state_grid(a.grid)
    rows = [read_run(pendulum, Path(run), a.grid, th, thdot, obs) for run in a.runs]
    out = os.path.join(a.out, "value_map.png")
    plot(out, th, thdot, rows)
    if len(rows) == 1:
        summary = rows[0]["summary"]
        print(f"V(s) / reward scale, upright at rest: {summary['v_upright_at_rest']:.1f}")
        print(f"V(s) / reward scale, hanging down at rest: {summary['v_down_at_rest']:.1f}")
        print(f"V(s) / reward scale over the grid: {summary['v_min']:.1f} … {summary['v_max']:.1f}")
        print(f"share of grid states with |μ(s)| > 1.5: {summary['share_of_states_above_1_5']:.2f}")
        upright = summary["swing_up_steps_to_upright"]
        print(
            f"swing-up episode: return {summary['swing_up_return']:.1f}, "
            f"|θ| < 0.1 first at step {'never' if upright is None else upright}"
        )
        print(f"figure: {out}")
        return summary
    print("V(s) / reward scale at rest upright and hanging down, and over the grid; the share of grid states where")
    print("the actor's torque is beyond ±1.5; the swing-up episode's return and its first step with |θ| < 0.1")
    print("| run | test return | V upright | V down | V over the grid | μ beyond ±1.5 | swing-up return | upright at |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run, r in zip(a.runs, rows):
        s, ret = r["summary"], r["title"].rsplit(" ", 1)[-1]
        upright = "never" if s["swing_up_steps_to_upright"] is None else s["swing_up_steps_to_upright"]
        print(
            f"| {run} | {ret} | {s['v_upright_at_rest']:.1f} | {s['v_down_at_rest']:.1f} | "
            f"{s['v_min']:.1f} … {s['v_max']:.1f} | {s['share_of_states_above_1_5']:.2f} | "
            f"{s['swing_up_return']:.1f} | {upright} |"
        )
    print(f"figure: {out}")
    return [r["summary"] for r in rows]


if __name__ == "__main__":
    main()
