"""What the Q-network believes near the 500-step time limit, with and without a bootstrap at the cut.

Two agents are trained by 2_Cart_Pole_DQN/cart_pole_dqn.py's own `main` with the default flags and the same --seed,
one of them with --no-bootstrap-truncated (or loaded from <out>/<run>/latest/q_network when that checkpoint exists
and --retrain is not given). Each plays the same greedy episode (reset seed --episode-seed, the default the script's
--eval-seed), and the tool prints Q(s, ·) at a few time steps of it, beside what a policy that never drops the pole
is worth at that step, and the step of each agent's saved parameters (the best validation checkpoint):

- bootstrapped at the cut (the default), the 500th step is not an end: V = 1 / (1 − γ) at every step;
- with the cut treated as a failure, V_t = (1 − γ^(500 − t)) / (1 − γ): 500 − t rewards left, then nothing.

    python tools/dqn_q_near_limit.py                 # seed 0, one line per agent, then the table
    python tools/dqn_q_near_limit.py --seed 3 --retrain

The course script is imported by path; the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script  # noqa: E402

AGENTS = {"bootstrap": True, "no_bootstrap": False}  # name -> --bootstrap-truncated
STEPS = (0, 100, 250, 400, 450, 490, 499)  # time steps of the episode at which Q is printed


def trained_agent(dqn, name: str, seed: int, out: Path, retrain: bool, total_timesteps: int):
    """The Q-network of `cart_pole_dqn.py --seed SEED [--no-bootstrap-truncated]` (trained now, or loaded), its
    metrics and its Args."""
    from flax import nnx

    args = dqn.Args(seed=seed, bootstrap_truncated=AGENTS[name], total_timesteps=total_timesteps)
    folder = out / f"seed_{seed}_{name}_{total_timesteps}"  # the script's runs, each in a folder of its own
    if retrain or not (folder / "latest" / "metrics.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "train.log", "w") as log, contextlib.redirect_stdout(log):  # its progress lines
            dqn.main(dqn.Args(**{**vars(args), "out": str(folder)}))
    q_network = dqn.build_agent(args, nnx.Rngs(0)).q_network  # the script's shapes
    nnx.update(q_network, dqn.load_checkpoint(str(folder / "latest" / "q_network"), args))
    return q_network, json.loads((folder / "latest" / "metrics.json").read_text()), args


def q_along_episode(q_network, episode_seed: int) -> np.ndarray:
    """Q(s_t, ·) at every step t of one greedy CartPole-v1 episode from reset(seed=episode_seed), (T, 2)."""
    import gymnasium as gym
    import jax.numpy as jnp
    from flax import nnx

    q_of = nnx.jit(lambda model, obs: model(obs[None])[0])
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=episode_seed)
    qs, done = [], False
    while not done:
        q = np.asarray(q_of(q_network, jnp.asarray(obs)))
        qs.append(q)
        obs, _, terminated, truncated, _ = env.step(int(q.argmax()))
        done = terminated or truncated
    env.close()
    return np.array(qs)


def value_if_never_failing(gamma: float, t: int, bootstrap: bool, limit: int = 500) -> float:
    """What a policy that never drops the pole is worth at step t: 1/(1 − γ) when the cut bootstraps, else the
    discounted sum of the limit − t rewards left."""
    return 1 / (1 - gamma) if bootstrap else (1 - gamma ** (limit - t)) / (1 - gamma)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="training seed of both agents (the script's --seed)")
    p.add_argument("--episode-seed", type=int, default=None, help="the episode's reset seed (default: --eval-seed)")
    p.add_argument("--total-timesteps", type=int, default=50_000, help="the script's --total-timesteps")
    p.add_argument("--out", default="runs/dqn_q_near_limit", help="folder for the two training runs")
    p.add_argument("--retrain", action="store_true", help="train again even if a checkpoint is there")
    args = p.parse_args(argv)

    os.chdir(REPO)  # --out is relative to the repository root
    dqn = load_script("2_Cart_Pole_DQN/cart_pole_dqn.py")
    dqn.use_sequential_xla_scheduler()  # as the script's command line does, before JAX starts its backend
    episode_seed = dqn.Args().eval_seed if args.episode_seed is None else args.episode_seed
    qs, gamma = {}, dqn.Args().gamma
    for name in AGENTS:
        q_network, metrics, run_args = trained_agent(
            dqn, name, args.seed, Path(args.out), args.retrain, args.total_timesteps
        )
        qs[name], gamma = q_along_episode(q_network, episode_seed), run_args.gamma
        ends = " ".join(f"{k}={v}" for k, v in metrics["eval_ends"].items())
        calls = dqn.Args(**{**vars(run_args), "total_timesteps": metrics["best_step"]}).n_train_calls
        print(
            f"{name}: seed={args.seed} bootstrap_truncated={run_args.bootstrap_truncated} "
            f"saved parameters from step {metrics['best_step']}, after {calls} training calls; "
            f"eval_return_mean={metrics['eval_return_mean']:.1f} "
            f"episodes ended: {ends}; "
            f"episode seed {episode_seed}: {len(qs[name])} steps",
            flush=True,
        )
    print(f"\nQ(s_t, left) / Q(s_t, right) along that episode, and V_t of a policy that never fails (γ = {gamma:g})")
    print(f"{'t':>4} | {'bootstrap: Q':>17} {'V_t':>7} | {'no_bootstrap: Q':>17} {'V_t':>7}")
    for t in STEPS:
        cells = []
        for name, bootstrap in AGENTS.items():
            if t < len(qs[name]):
                q = qs[name][t]
                cells.append(f"{q[0]:8.1f} {q[1]:8.1f} {value_if_never_failing(gamma, t, bootstrap):7.1f}")
            else:
                cells.append(f"{'(ended)':>17} {'':>7}")
        print(f"{t:>4} | {cells[0]} | {cells[1]}")
    for name, q in qs.items():
        top = q.max(axis=1)
        print(f"{name}: max_a Q over the episode from {top.min():.1f} to {top.max():.1f}, mean {top.mean():.1f}")


if __name__ == "__main__":
    main()
