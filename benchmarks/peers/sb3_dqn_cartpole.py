"""Peer: Stable-Baselines3 DQN with RL-Zoo's tuned CartPole-v1 hyperparameters, under the course's protocol.

Protocol (the same as 2_Cart_Pole_DQN/cart_pole_dqn.py): 50,000 environment steps, the final parameters
(no checkpoint picking), then the mean greedy return over 100 episodes whose initial states come from
gymnasium's vectorised CartPole reset with seed 10000. Writes metrics.json with `eval_return_mean`, so
tools/seeds.py can sweep it (from the repository root, in the course's venv; each seed runs in the peers' own):

    python tools/seeds.py --python .venv-peers/bin/python benchmarks/peers/sb3_dqn_cartpole.py \
        --seeds 0-19 --metric eval_return_mean --bar 475

Hyperparameters: rl-baselines3-zoo, hyperparams/dqn.yml, "CartPole-v1" (marked "Almost Tuned" there).
"""

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import DQN

ZOO = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=100_000,
    learning_starts=1000,
    gamma=0.99,
    target_update_interval=10,
    train_freq=256,
    gradient_steps=128,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    policy_kwargs=dict(net_arch=[256, 256]),
)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=50_000)
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--eval-seed", type=int, default=10_000)
    p.add_argument("--out", default="runs/peers/sb3_dqn_cartpole")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=args.seed, device="cpu", verbose=0, **ZOO)
    model.learn(total_timesteps=args.total_timesteps)
    train_seconds = time.perf_counter() - t0
    envs = gym.make_vec("CartPole-v1", num_envs=args.eval_episodes, vectorization_mode="vector_entry_point")
    obs, _ = envs.reset(seed=args.eval_seed)
    returns, alive = np.zeros(args.eval_episodes), np.ones(args.eval_episodes, bool)
    while alive.any():
        action, _ = model.predict(obs, deterministic=True)
        obs, reward, terminated, truncated, _ = envs.step(action)
        returns += reward * alive
        alive &= ~(terminated | truncated)
    metrics = dict(
        eval_return_mean=float(returns.mean()),
        eval_return_std=float(returns.std()),
        eval_return_min=float(returns.min()),
        train_seconds=round(train_seconds, 2),
        seed=args.seed,
        hyperparameters={k: str(v) for k, v in ZOO.items()},
    )
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"seed={args.seed} eval_return_mean={metrics['eval_return_mean']:.1f} train_seconds={train_seconds:.1f}")


if __name__ == "__main__":
    main()
