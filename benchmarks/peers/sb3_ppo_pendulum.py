"""Peer: Stable-Baselines3 PPO with RL-Zoo's tuned Pendulum-v1 hyperparameters, under the course's protocol.

Protocol (the same as 3_Pendulum/pendulum.py): 100,000 environment steps, the final parameters, then the
mean deterministic (mean-action) return over 20 episodes; episode i resets with seed 10000 + i. Writes
metrics.json with `eval_return_mean`, so tools/seeds.py can sweep it (from the repository root, in the course's venv;
each seed runs in the peers' own):

    python tools/seeds.py --python .venv-peers/bin/python benchmarks/peers/sb3_ppo_pendulum.py \
        --seeds 0-19 --metric eval_return_mean --bar -200

Hyperparameters: rl-baselines3-zoo, hyperparams/ppo.yml, "Pendulum-v1" (marked "Tuned" there).
"""

import argparse
import json
import os
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

ZOO = dict(
    n_steps=1024,
    gae_lambda=0.95,
    gamma=0.9,
    n_epochs=10,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    use_sde=True,
    sde_sample_freq=4,
)
N_ENVS = 4


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-timesteps", type=int, default=100_000)
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--eval-seed", type=int, default=10_000)
    p.add_argument("--out", default="runs/peers/sb3_ppo_pendulum")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    env = make_vec_env("Pendulum-v1", n_envs=N_ENVS, seed=args.seed)
    model = PPO("MlpPolicy", env, seed=args.seed, device="cpu", verbose=0, **ZOO)
    model.learn(total_timesteps=args.total_timesteps)
    train_seconds = time.perf_counter() - t0
    returns = []
    for i in range(args.eval_episodes):
        e = gym.make("Pendulum-v1")
        obs, _ = e.reset(seed=args.eval_seed + i)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = e.step(np.clip(action, -2.0, 2.0))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    metrics = dict(
        eval_return_mean=float(np.mean(returns)),
        eval_return_std=float(np.std(returns)),
        train_seconds=round(train_seconds, 2),
        seed=args.seed,
        hyperparameters={k: str(v) for k, v in ZOO.items()},
        n_envs=N_ENVS,
    )
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"seed={args.seed} eval_return_mean={metrics['eval_return_mean']:.1f} train_seconds={train_seconds:.1f}")


if __name__ == "__main__":
    main()
