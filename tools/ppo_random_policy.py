"""The floor of Pendulum-v1: a uniform-random torque on the 20 test episodes that 3_Pendulum/pendulum.py scores.

Test episode i resets with seed 10000 + i (pendulum.py's --eval-seed); the random policy draws every action
from the action space, seeded with i. Prints each episode's return and their mean and standard deviation.

    python tools/ppo_random_policy.py
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np


def random_returns(episodes: int, eval_seed: int) -> np.ndarray:
    """The return of a uniform-random policy on each test episode."""
    returns = []
    for i in range(episodes):
        env = gym.make("Pendulum-v1")
        env.reset(seed=eval_seed + i)
        env.action_space.seed(i)
        total, done = 0.0, False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
        env.close()
        returns.append(total)
    return np.array(returns)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=20, help="test episodes (pendulum.py's --eval-episodes)")
    p.add_argument("--eval-seed", type=int, default=10_000, help="episode i resets with this + i")
    a = p.parse_args(argv)
    if a.episodes < 1:
        p.exit(1, f"error: --episodes must be >= 1, got {a.episodes}\n")
    rets = random_returns(a.episodes, a.eval_seed)
    print("per episode: " + " ".join(f"{r:.1f}" for r in rets))
    print(
        f"random policy: eval_return_mean={rets.mean():.1f} eval_return_std={rets.std():.1f} over {a.episodes} episodes"
    )


if __name__ == "__main__":
    main()
