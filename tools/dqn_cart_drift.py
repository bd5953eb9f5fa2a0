"""Figure: where the cart goes during one greedy episode, for a DQN agent trained with γ = 0.99 and one with 0.999.

Both agents are trained by 2_Cart_Pole_DQN/cart_pole_dqn.py's own `main` with the default flags, the same
--seed, and only --gamma changed (or loaded from <out>/seed_<seed>_gamma_<γ>/latest/q_network when that checkpoint
exists and --retrain is not given). Each then plays the same greedy episode: one CartPole-v1 whose initial state comes
from --episode-seed (the default is the script's --eval-seed, the episode its --video records). The figure
shows the cart's position x(t) against the track's ends at ±2.4, and the pole's angle θ(t) against ±12° (the
script's X_LIMIT and THETA_LIMIT, where CartPole-v1 ends an episode):

    python tools/dqn_cart_drift.py                  # seed 0 -> 2_Cart_Pole_DQN/assets/cart_drift.png
    python tools/dqn_cart_drift.py --seed 3 --figure runs/dqn_cart_drift/seed3.png

It prints one line per agent: γ, the training run's 100-episode evaluation (how its test episodes ended, and on which
side the cart left the track), and how this episode went (x at its end: x < 0 is left of the centre, x > 0 right).
The course script is imported by path; the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script  # noqa: E402

GAMMAS = (0.99, 0.999)
COLORS = {0.99: "tab:red", 0.999: "tab:blue"}


def trained_agent(dqn, seed: int, gamma: float, out: Path, retrain: bool):
    """The Q-network of `cart_pole_dqn.py --seed SEED --gamma GAMMA` (trained now, or loaded) and its metrics."""
    from flax import nnx

    folder = out / f"seed_{seed}_gamma_{gamma:g}"  # the script's runs, each in a folder of its own; latest: the last
    if retrain or not (folder / "latest" / "metrics.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "train.log", "w") as log, contextlib.redirect_stdout(log):  # its progress lines
            dqn.main(dqn.Args(seed=seed, gamma=gamma, out=str(folder)))
    args = dqn.Args(seed=seed, gamma=gamma)
    q_network = dqn.build_agent(args, nnx.Rngs(0)).q_network  # the script's shapes
    nnx.update(q_network, dqn.load_checkpoint(str(folder / "latest" / "q_network"), args))
    metrics = json.loads((folder / "latest" / "metrics.json").read_text())
    return q_network, metrics


def greedy_episode(q_network, episode_seed: int) -> tuple[np.ndarray, bool]:
    """Observations (T + 1, 4) of one greedy episode from reset(seed=episode_seed); True if it was truncated."""
    import gymnasium as gym
    import jax.numpy as jnp
    from flax import nnx

    act = nnx.jit(lambda model, obs: jnp.argmax(model(obs[None]), axis=-1)[0])
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=episode_seed)
    trajectory, terminated, truncated = [obs], False, False
    while not (terminated or truncated):
        obs, _, terminated, truncated, _ = env.step(int(act(q_network, obs)))
        trajectory.append(obs)
    env.close()
    return np.array(trajectory), bool(truncated)


def sides_left(dqn, act, n_episodes: int, seed: int) -> dict:
    """Of `n_episodes` episodes played side by side as the script's evaluate() plays its test episodes (reset seed
    `seed`), with act(obs (n, 4)) -> actions (n,): how many ended with the cart off the track on the left (x < −2.4)
    and on the right (x > 2.4)."""
    envs = dqn.make_envs(n_episodes)
    obs, _ = envs.reset(seed=seed)
    last_x, alive = np.zeros(n_episodes), np.ones(n_episodes, bool)
    while alive.any():
        obs, _, terminated, truncated, _ = envs.step(np.asarray(act(obs)))
        ended = alive & (terminated | truncated)
        last_x[ended] = obs[ended, 0]  # NEXT_STEP autoreset: the ending step returns the final observation
        alive &= ~ended
    envs.close()
    return dict(left=int((last_x < -dqn.X_LIMIT).sum()), right=int((last_x > dqn.X_LIMIT).sum()))


def how_it_ended(dqn, trajectory: np.ndarray, truncated: bool) -> str:
    """As the script's evaluate() tells it, from the last observation and the script's limits."""
    x, theta = trajectory[-1, 0], trajectory[-1, 2]
    if truncated:
        return "time_limit"
    return "cart_left_track" if abs(x) > dqn.X_LIMIT else "pole_fell" if abs(theta) > dqn.THETA_LIMIT else "?"


def plot(path: Path, runs: dict, seed: int, episode_seed: int, x_limit: float, theta_limit: float) -> None:
    """x_limit: where the track ends; theta_limit: the pole angle, in radians, past which the pole is down."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_x, ax_theta) = plt.subplots(2, 1, figsize=(7, 5), sharex=True, height_ratios=(2, 1))
    for gamma, (trajectory, ended) in runs.items():
        t = np.arange(len(trajectory))
        label = f"γ = {gamma:g}: {len(trajectory) - 1} steps, {ended.replace('_', ' ')}"
        ax_x.plot(t, trajectory[:, 0], color=COLORS[gamma], label=label)
        ax_theta.plot(t, np.degrees(trajectory[:, 2]), color=COLORS[gamma], lw=1)
    for ax, limit, name in ((ax_x, x_limit, "track ends"), (ax_theta, np.degrees(theta_limit), "pole down")):
        ax.axhline(limit, color="gray", ls="--", lw=1, label=name if ax is ax_x else None)
        ax.axhline(-limit, color="gray", ls="--", lw=1)
        ax.axhline(0, color="lightgray", lw=0.5)
    ax_x.set(ylabel="cart position x", ylim=(-3, 3))
    ax_x.set_title(f"One greedy episode (episode seed {episode_seed}), agents trained with seed {seed}", fontsize=10)
    ax_x.legend(loc="upper left", fontsize=8)
    ax_theta.set(xlabel="time step", ylabel="pole angle θ (°)", ylim=(-15, 15), xlim=(0, 505))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="training seed of both agents (the script's --seed)")
    p.add_argument("--episode-seed", type=int, default=None, help="the episode's reset seed (default: --eval-seed)")
    p.add_argument("--out", default="runs/dqn_cart_drift", help="folder for the two training runs")
    p.add_argument("--figure", default="2_Cart_Pole_DQN/assets/cart_drift.png", help="where the PNG goes")
    p.add_argument("--retrain", action="store_true", help="train again even if a checkpoint is there")
    args = p.parse_args(argv)

    os.chdir(REPO)  # --out and --figure are relative to the repository root
    dqn = load_script("2_Cart_Pole_DQN/cart_pole_dqn.py")
    dqn.use_sequential_xla_scheduler()  # as the script's command line does, before JAX starts its backend
    import jax.numpy as jnp
    from flax import nnx

    episode_seed = dqn.Args().eval_seed if args.episode_seed is None else args.episode_seed
    runs = {}
    for gamma in GAMMAS:
        q_network, metrics = trained_agent(dqn, args.seed, gamma, Path(args.out), args.retrain)
        trajectory, truncated = greedy_episode(q_network, episode_seed)
        ended = how_it_ended(dqn, trajectory, truncated)
        runs[gamma] = (trajectory, ended)
        ends = " ".join(f"{k}={v}" for k, v in metrics["eval_ends"].items())
        act = nnx.jit(lambda model, obs: jnp.argmax(model(obs), axis=-1))
        sides = sides_left(dqn, partial(act, q_network), metrics["eval_episodes"], dqn.Args().eval_seed)
        print(
            f"gamma={gamma:g} seed={args.seed}: 100-episode evaluation eval_return_mean="
            f"{metrics['eval_return_mean']:.1f} ({ends}; off the track left={sides['left']} "
            f"right={sides['right']}); episode seed {episode_seed}: "
            f"{len(trajectory) - 1} steps, ended {ended} at x={trajectory[-1, 0]:+.3f}, "
            f"max |x|={np.abs(trajectory[:, 0]).max():.3f}, "
            f"max |θ|={np.degrees(np.abs(trajectory[:, 2])).max():.1f}°",
            flush=True,
        )
    plot(Path(args.figure), runs, args.seed, episode_seed, dqn.X_LIMIT, dqn.THETA_LIMIT)
    print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
