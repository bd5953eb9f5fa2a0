"""PPO (actor-critic, GAE, clipped surrogate) that swings up and balances Pendulum-v1, in JAX + Flax NNX.

The lesson, in the order the algorithm runs: Args (the flags, and the sizes they imply, which the compiled code reads) →
environments → actor (a tfd.Normal) / critic → GAE → losses → the update (`ppo_update`) → `--backend jax`, the whole
training as one compiled program (a JAX port of Pendulum-v1; `make_train(args)` returns a pure `train(key)`) → the
default backend's rollout and training loop (gymnasium envs stepped from Python) → evaluation. One iteration collects
`--num-envs × --num-steps` transitions, computes GAE(λ) advantages and runs `--update-epochs` epochs of minibatch steps
on the clipped surrogate (actor) and the value regression (critic). `--algo` picks a rung of the ladder (`ladder`; the
rungs below PPO are `ppo_update` with parts left out). Below the `# Plumbing` line: the run's folder, errors and command
line, the checks, `train_jax`, which vmaps `train` over seeds and shards it over devices, then checkpoints, GIF, plot,
metrics.json and main. Each run writes its own folder, <--out>/<date>-<time>-seed<seed>; <--out>/latest is the newest
complete one.

    python 3_Pendulum/pendulum.py                  # train with the defaults (100k steps), then evaluate
    python 3_Pendulum/pendulum.py --preset untuned  # a first, untuned PPO (UNTUNED_PRESET): see the common bugs
    python 3_Pendulum/pendulum.py --backend jax --num-seeds 16 [--algo reinforce]   # 16 seeds in one vmapped run
    python 3_Pendulum/pendulum.py --load runs/pendulum/latest/params --video   # -> runs/pendulum/eval/<run>/episode.gif
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from operator import ge, gt, le
from pathlib import Path
from typing import NamedTuple

if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load waits for main(), which reports it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from gymnasium.wrappers.utils import RunningMeanStd
from gymnasium.wrappers.vector import RecordEpisodeStatistics
from tensorflow_probability.substrates.jax import distributions as tfd  # TFP on JAX: no TensorFlow needed

MAX_TORQUE = 2.0  # Pendulum-v1's action space is [-2, 2]
ENV_ID = "Pendulum-v1"
EPISODE_STEPS = 200  # Pendulum-v1's TimeLimit: every episode is truncated after 200 steps, none terminates
ALGOS = ("reinforce", "reinforce-baseline", "a2c", "ppo")  # the policy-gradient ladder


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag, with the bounds check_flags tests."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: jax.random.key, nnx.Rngs, env resets, NumPy's Generator", min=0)
    preset: str = flag(
        "default", "'untuned': UNTUNED_PRESET (a first PPO's settings) as defaults", choices=("default", "untuned")
    )
    backend: str = flag(
        "gymnasium", "NumPy envs in a loop, or 'jax': one compiled make_train", choices=("gymnasium", "jax")
    )
    num_seeds: int = flag(1, "with --backend jax, train seeds --seed … --seed+N−1 together through jax.vmap", min=1)
    host_devices: int = flag(-1, "jax: shard the seeds over N CPU devices (-1 one per core, 0 as is)", min=-1)
    algo: str = flag("ppo", "rung of the ladder; the reinforce rungs default to 10 envs × 200 steps", choices=ALGOS)
    total_timesteps: int = flag(100_000, "environment steps to train for (summed over all envs)", min=1)
    num_envs: int = flag(16, "parallel Pendulum-v1 copies in a gymnasium SyncVectorEnv", min=1)
    num_steps: int = flag(125, "steps per env in one rollout of num_envs × num_steps transitions", min=1)
    update_epochs: int = flag(10, "passes over each rollout (K)", min=1)
    minibatch_size: int = flag(250, "transitions per gradient step", min=1)
    gamma: float = flag(0.99, "discount factor γ", min=0.0, max=1.0)
    gae_lambda: float = flag(0.95, "GAE λ: 0 = one-step TD error, 1 = Monte Carlo return minus V", min=0.0, max=1.0)
    clip_eps: float = flag(0.2, "PPO clip range ε: the ratio is clipped to [1-ε, 1+ε]", gt=0.0)
    actor_learning_rate: float = flag(1e-3, "Adam learning rate of the actor", gt=0.0, max=1.0)
    critic_learning_rate: float = flag(1e-3, "Adam learning rate of the critic", gt=0.0, max=1.0)
    anneal_lr: bool = flag(True, "decay both learning rates linearly to 0 over training")
    ent_coef: float = flag(0.0, "entropy bonus coefficient (0 = off)", min=0.0, max=1.0)
    max_grad_norm: float = flag(0.5, "clip each network's gradient to this global norm (0 = off)", min=0.0)
    norm_obs: bool = flag(False, "normalise observations with running mean/std (updated after each rollout)")
    reward_scale: float = flag(0.1, "multiply rewards by this before GAE (logged returns are not)", gt=0.0, max=1e3)
    bootstrap_truncated: bool = flag(True, "bootstrap from V(final obs) at a time limit (no: a common bug)")
    sigma: str = flag("param", "σ: one learned log σ, or 'state': σ(s), a softplus head", choices=("param", "state"))
    hidden_size: int = flag(64, "width of the two hidden layers of actor and critic", min=1)
    activation: str = flag("tanh", "hidden-layer activation", choices=("tanh", "relu"))
    eval_episodes: int = flag(20, "deterministic (mean-action) evaluation episodes after training", min=1)
    eval_seed: int = flag(10_000, "evaluation episode i resets with seed eval_seed + i, for every training seed")
    out: str = flag("runs/pendulum", "each run writes <out>/<date>-<time>-seed<seed>/; <out>/latest is the newest")
    load: str = flag("", "evaluate the checkpoint folder <run>/params instead of training (into <out>/eval/)")
    video: bool = flag(False, "also write one deterministic episode of the final policy to the run's episode.gif")
    compile_cache: str = flag(
        "~/.cache/jax-rl-course", "JAX's persistent compilation cache: later runs skip compiling ('' turns it off)"
    )

    # The sizes the flags imply. The compiled functions read Args itself (bound with functools.partial before anything
    # is traced): the flags, these and the rung of --algo (ladder), never recomputed inside a trace.
    @property
    def batch_size(self) -> int:  # transitions per rollout
        return self.num_envs * self.num_steps

    @property
    def num_minibatches(self) -> int:  # gradient steps per epoch (a remainder smaller than a minibatch is dropped)
        return self.batch_size // self.minibatch_size

    @property
    def num_updates(self) -> int:  # rollouts in the whole run
        return max(1, self.total_timesteps // self.batch_size)


# A first, untuned PPO: one env with 2,048-step rollouts, minibatches of 64, Adam at 3e-4 without decay for the
# actor, no gradient clipping, raw rewards, ReLU networks with a softplus σ(s) head, and the time limit treated as
# a termination; the rest as the defaults (K = 10, γ 0.99, λ 0.95, ε 0.2, …). (Not the (B,1)−(B,) value-loss
# broadcast: value_loss_fn refuses that shape.) --preset untuned makes these the defaults, and flags given explicitly
# win; from Python: Args(preset="untuned", **UNTUNED_PRESET).
UNTUNED_PRESET = dict(
    num_envs=1,
    num_steps=2048,
    minibatch_size=64,
    actor_learning_rate=3e-4,
    anneal_lr=False,
    max_grad_norm=0.0,
    reward_scale=1.0,
    bootstrap_truncated=False,
    sigma="state",
    activation="relu",
)
WHOLE_EPISODES = dict(num_envs=10, num_steps=EPISODE_STEPS)  # the reinforce rungs' default rollout size


class Rung(NamedTuple):
    """What one rung of the policy-gradient ladder changes; everything else is shared."""

    psi: str  # Ψ_t: "G" = G_t, "G-V" = G_t − V(s_t) (targets G_t), "GAE" = A_t (targets A_t + V(s_t))
    batch_steps: int  # actor steps on the whole rollout before the epochs, with Ψ as it is (REINFORCE: 1)
    actor_epochs: int  # epochs in which every minibatch also steps the actor (A2C 1, PPO K)
    critic_epochs: int  # epochs in which every minibatch steps the critic (0: no critic)
    clip: bool  # the clipped surrogate (PPO) or the plain −mean(log π·Ψ)


def ladder(args: Args) -> Rung:
    """reinforce → reinforce-baseline → a2c → ppo, as the update reads them."""
    k = args.update_epochs
    return {
        "reinforce": Rung("G", batch_steps=1, actor_epochs=0, critic_epochs=0, clip=False),
        "reinforce-baseline": Rung("G-V", batch_steps=1, actor_epochs=0, critic_epochs=k, clip=False),
        "a2c": Rung("GAE", batch_steps=0, actor_epochs=1, critic_epochs=k, clip=False),
        "ppo": Rung("GAE", batch_steps=0, actor_epochs=k, critic_epochs=k, clip=True),
    }[args.algo]


# ---------------------------------------------------------------------------------------------- Environments
def make_envs(n: int) -> gym.vector.VectorEnv:
    """n Pendulum-v1 copies. SAME_STEP autoreset: when an episode ends, step() already returns the
    first observation of the next episode, and the true final observation is in info["final_obs"]."""
    mode = gym.vector.AutoresetMode.SAME_STEP
    return gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="sync", vector_kwargs=dict(autoreset_mode=mode))


def true_next_obs(obs: np.ndarray, done: np.ndarray, info: dict) -> np.ndarray:
    """s_{t+1} of each env: the returned obs, except where an episode just ended (there obs is already
    the reset of the next episode, and the real s_{t+1} is info["final_obs"])."""
    nxt = obs.copy()
    for i in np.flatnonzero(done):
        nxt[i] = info["final_obs"][i]
    return nxt


def normalize_obs(obs: np.ndarray, rms: RunningMeanStd | None) -> np.ndarray:
    """(obs − mean) / √(var + 1e-8), clipped to ±10, as float32 (--norm-obs); the obs as float32 without statistics.
    rms is gymnasium's RunningMeanStd (parallel-variance update, Chan et al.), updated after each rollout."""
    if rms is None:
        return obs.astype(np.float32)
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + 1e-8), -10, 10).astype(np.float32)


class Rollout(NamedTuple):
    """num_steps × num_envs transitions of the current policy, every field (T, N, …), on both backends."""

    obs: np.ndarray | jax.Array  # (T, N, 3) s_t, normalised with --norm-obs
    actions: np.ndarray | jax.Array  # (T, N, 1) the UNCLIPPED sample a_t (the env got clip(a_t, −2, 2))
    logp: np.ndarray | jax.Array  # (T, N) log π_old(a_t|s_t)
    rewards: np.ndarray | jax.Array  # (T, N) r_t × --reward-scale
    terminated: np.ndarray | jax.Array  # (T, N) 1.0 where the MDP ended (--no-bootstrap-truncated: see rollout_batch)
    truncated: np.ndarray | jax.Array  # (T, N) 1.0 where the time limit cut the episode
    next_obs: np.ndarray | jax.Array  # (T, N, 3) the TRUE s_{t+1}, also where the env was reset


# ---------------------------------------------------------------------------------------------- Networks
ACTIVATIONS = {"tanh": jnp.tanh, "relu": nnx.relu}


def linear(n_in: int, n_out: int, scale: float, rngs: nnx.Rngs) -> nnx.Linear:
    """Orthogonal weights with gain `scale`, zero bias (the usual PPO initialisation)."""
    return nnx.Linear(n_in, n_out, kernel_init=nnx.initializers.orthogonal(scale), rngs=rngs)


class Actor(nnx.Module):
    """π_θ(a|s) = Normal(μ_θ(s), σ). μ = 2·tanh(·) keeps the mean inside the torque range."""

    def __init__(self, obs_dim, act_dim, hidden_size, sigma: str, activation: str, log_std_init=0.0, *, rngs):
        self.activation = activation
        self.fc1 = linear(obs_dim, hidden_size, math.sqrt(2), rngs)
        self.fc2 = linear(hidden_size, hidden_size, math.sqrt(2), rngs)
        self.mu = linear(hidden_size, act_dim, 0.01, rngs)  # small gain: the first policy is ≈ Normal(0, σ)
        if sigma == "state":
            self.sigma_head = linear(hidden_size, act_dim, 0.01, rngs)
        else:
            self.log_std = nnx.Param(jnp.full((act_dim,), log_std_init, jnp.float32))

    def __call__(self, obs: jax.Array) -> tfd.Normal:  # obs (B, obs_dim) → batch of Normals (B, act_dim)
        nonlinearity = ACTIVATIONS[self.activation]
        h = nonlinearity(self.fc2(nonlinearity(self.fc1(obs))))
        loc = MAX_TORQUE * jnp.tanh(self.mu(h))
        if hasattr(self, "sigma_head"):
            scale = nnx.softplus(self.sigma_head(h)) + 1e-5  # state-dependent σ(s) > 0
        else:
            scale = jnp.broadcast_to(jnp.exp(self.log_std[...]), loc.shape)  # one σ for all states
        # Independent Gaussians N(μ, σ²), (B, act_dim), each action dimension on its own (callers sum over -1):
        # .sample(seed=key) is a = μ + σ·z, z ~ N(0, 1); .log_prob(x) = −½((x − μ)/σ)² − log σ − ½ log 2π;
        # .entropy() = ½ + ½ log 2π + log σ.
        return tfd.Normal(loc, scale)


class Critic(nnx.Module):
    """V_φ(s): obs (B, obs_dim) → (B,), squeezed here once: a (B, 1) value minus (B,) targets would be B×B."""

    def __init__(self, obs_dim: int, hidden_size: int, activation: str, *, rngs: nnx.Rngs):
        self.activation = activation
        self.fc1 = linear(obs_dim, hidden_size, math.sqrt(2), rngs)
        self.fc2 = linear(hidden_size, hidden_size, math.sqrt(2), rngs)
        self.out = linear(hidden_size, 1, 1.0, rngs)

    def __call__(self, obs: jax.Array) -> jax.Array:
        nonlinearity = ACTIVATIONS[self.activation]
        return self.out(nonlinearity(self.fc2(nonlinearity(self.fc1(obs)))))[..., 0]


def make_optimizer(model: nnx.Module, learning_rate: float, config: Args, total_grad_steps: int) -> nnx.Optimizer:
    """Adam after an optional global-norm clip, its rate decaying linearly if --anneal-lr; step: .update(model, g)"""
    schedule = optax.linear_schedule(learning_rate, 0.0, total_grad_steps) if config.anneal_lr else learning_rate
    clip = [optax.clip_by_global_norm(config.max_grad_norm)] if config.max_grad_norm > 0 else []
    return nnx.Optimizer(model, optax.chain(*clip, optax.adam(schedule, eps=1e-5)), wrt=nnx.Param)


class Agent(NamedTuple):
    """One seed's networks and their optimizers. nnx.state(agent) names its parts the same: state["actor"], …"""

    actor: Actor
    critic: Critic
    actor_opt: nnx.Optimizer
    critic_opt: nnx.Optimizer


def new_agent(config: Args, actor_key, critic_key) -> Agent:
    """The Agent of one seed; each optimizer's learning-rate decay spans that network's Adam steps in the whole run."""
    c, rung = config, ladder(config)
    actor_steps = c.num_updates * (rung.batch_steps + rung.actor_epochs * c.num_minibatches)
    critic_steps = max(1, c.num_updates * rung.critic_epochs * c.num_minibatches)  # REINFORCE's critic never steps
    actor = Actor(3, 1, c.hidden_size, c.sigma, c.activation, rngs=nnx.Rngs(actor_key))
    critic = Critic(3, c.hidden_size, c.activation, rngs=nnx.Rngs(critic_key))
    actor_opt = make_optimizer(actor, c.actor_learning_rate, c, actor_steps)
    return Agent(actor, critic, actor_opt, make_optimizer(critic, c.critic_learning_rate, c, critic_steps))


# ---------------------------------------------------------------------------------------------- GAE(λ)
def compute_gae(rewards, values, next_values, terminated, truncated, gamma: float, lam: float):
    """Advantages and returns for a rollout; every input is (T, N) (time, env). next_values[t] = V(s_{t+1}) of the
    TRUE next state: at a truncation, V(final obs) of the episode that just ended, not of the reset obs.
    A termination cuts the bootstrap (the future is worth 0); a truncation keeps it. Either one stops the
    recursion: A_t must not leak into the next episode."""
    not_term = 1.0 - terminated
    not_done = 1.0 - jnp.maximum(terminated, truncated)
    deltas = rewards + gamma * next_values * not_term - values  # δ_t = r_t + γ·V(s_{t+1})·(1 − term_t) − V(s_t)

    def backward(adv_next, x):
        delta, nd = x
        adv = delta + gamma * lam * nd * adv_next  # A_t = δ_t + γλ·(1 − done_t)·A_{t+1}
        return adv, adv

    _, adv = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, not_done), reverse=True)
    return adv, adv + values  # returns R_t = A_t + V(s_t) are the critic's targets


def monte_carlo_returns(rewards, dones, gamma: float):
    """G_t = r_t + γ·(1 − done_t)·G_{t+1}, (T, N): the discounted return to the episode's end, no bootstrap from V.
    The rollout must hold whole episodes (done = terminated or truncated), so that G restarts at each end."""

    def backward(g_next, x):
        reward, done = x
        g = reward + gamma * (1.0 - done) * g_next
        return g, g

    _, g = jax.lax.scan(backward, jnp.zeros_like(rewards[0]), (rewards, dones), reverse=True)
    return g


def signal_and_targets(rung: Rung, rollout: Rollout, values, next_values, gamma: float, lam: float):
    """The rung's Ψ_t (the actor's signal) and the critic's targets, each (T, N)."""
    if rung.psi == "GAE":  # Ψ = A_t, targets A_t + V(s_t)
        return compute_gae(rollout.rewards, values, next_values, rollout.terminated, rollout.truncated, gamma, lam)
    g = monte_carlo_returns(rollout.rewards, jnp.maximum(rollout.terminated, rollout.truncated), gamma)
    return g - values * (rung.psi == "G-V"), g  # Ψ = G_t − V(s_t) with the baseline, G_t without


# ---------------------------------------------------------------------------------------------- Losses
def reinforce_loss(logp, psi):
    """L = −mean(log π(a_t|s_t) · Ψ_t), all inputs (B,). Ψ is data (no gradient flows into it):
    G_t for REINFORCE, G_t − V(s_t) with a baseline, the GAE advantage for A2C. Its gradient is the
    policy-gradient estimate −mean(∇ log π · Ψ)."""
    return -jnp.mean(logp * jax.lax.stop_gradient(psi))


def ppo_clip_loss(logp_new, logp_old, adv, clip_eps: float):
    """L = −mean(min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)), ρ = π_new(a|s) / π_old(a|s); all inputs (B,)."""
    ratio = jnp.exp(logp_new - logp_old)
    return -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv))


def clip_fractions(ratio, adv, clip_eps: float, clip: bool = True) -> dict:
    """clip_frac: the share of samples (B,) where the clip binds and zeroes the gradient (ρ > 1+ε with A > 0, or
    ρ < 1−ε with A < 0; none without the clip); outside_frac: the share with |ρ − 1| > ε, whatever A's sign."""
    binds = ((ratio > 1.0 + clip_eps) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
    return dict(clip_frac=jnp.mean(binds & clip), outside_frac=jnp.mean(jnp.abs(ratio - 1.0) > clip_eps))


def actor_loss_fn(actor: Actor, obs, actions, logp_old, adv, clip_eps: float, ent_coef: float, clip: bool = True):
    """PPO's clipped surrogate (clip=True) or the plain policy gradient −mean(log π · A) (clip=False),
    minus the entropy bonus; with the KL estimate and the clip fractions as diagnostics."""
    dist = actor(obs)
    logp = dist.log_prob(actions).sum(-1)  # (B,): log π(a|s) of the UNCLIPPED sample
    entropy = dist.entropy().sum(-1).mean()
    surrogate = ppo_clip_loss(logp, logp_old, adv, clip_eps) if clip else reinforce_loss(logp, adv)
    log_ratio = logp - logp_old
    approx_kl = jnp.mean(jnp.exp(log_ratio) - 1.0 - log_ratio)  # low-variance KL(π_old‖π_new) estimate
    return surrogate - ent_coef * entropy, dict(
        entropy=entropy, approx_kl=approx_kl, **clip_fractions(jnp.exp(log_ratio), adv, clip_eps, clip)
    )


def value_loss_fn(critic: Critic, obs, returns):
    """Mean squared error between V(s) (B,) and the critic's targets (B,)."""
    values = critic(obs)
    if values.shape != returns.shape:  # checked while tracing: (B,1) vs (B,) would silently become B×B
        raise ValueError(f"value shape {values.shape} != return shape {returns.shape}")
    return jnp.mean((values - returns) ** 2)


# ---------------------------------------------------------------------------------------------- The update
# act and the updates take nnx.split's (graphdef, state) and nnx.merge inside the trace; the training loops bind
# graphdef and the Args with functools.partial and compile each once with jax.jit.
def act(graphdef, state, obs, key):
    """a ~ π(·|s) for obs (N, obs_dim): the UNCLIPPED a (N, act_dim) (the env clips it), log π(a|s) (N,), next key."""
    key, k = jax.random.split(key)
    dist = nnx.merge(graphdef, state)(obs)
    action = dist.sample(seed=k)
    return action, dist.log_prob(action).sum(-1), key


class Batch(NamedTuple):
    """A rollout flattened to B = T·N transitions, with its targets; a minibatch is a slice of it."""

    obs: jax.Array  # (B, 3)
    actions: jax.Array  # (B, 1)
    logp: jax.Array  # (B,) log π_old(a|s)
    adv: jax.Array  # (B,) Ψ: GAE(λ), G_t or G_t − V(s_t)
    returns: jax.Array  # (B,) the critic's targets


def rollout_batch(graphdef, config: Args, state, rollout: Rollout):
    """The rollout as a Batch, with the rung's Ψ and the critic's targets from the critic before the update; also
    V(s_t) and the targets, (T, N) each, for explained_var."""
    if not config.bootstrap_truncated:  # --no-bootstrap-truncated, a common bug: a time limit read as a termination
        rollout = rollout._replace(
            terminated=jnp.maximum(rollout.terminated, rollout.truncated), truncated=jnp.zeros_like(rollout.truncated)
        )
    critic = nnx.merge(graphdef, state).critic
    values = critic(rollout.obs)  # (T, N)
    psi, targets = signal_and_targets(
        ladder(config), rollout, values, critic(rollout.next_obs), config.gamma, config.gae_lambda
    )
    n = rollout.rewards.size  # B = T·N transitions: every (T, N, …) field becomes (B, …)
    flat = jax.tree.map(
        lambda x: x.reshape(n, *x.shape[2:]), Batch(rollout.obs, rollout.actions, rollout.logp, psi, targets)
    )
    return flat, values, targets


def shuffled_minibatches(flat: Batch, key, config: Args) -> Batch:
    """One epoch's minibatches: the B transitions in a random order, cut into (num_minibatches, minibatch_size, …)
    (a remainder smaller than a minibatch is dropped)."""
    perm = jax.random.permutation(key, flat.obs.shape[0])[: config.num_minibatches * config.minibatch_size]
    shape = (config.num_minibatches, config.minibatch_size)
    return jax.tree.map(lambda x: x[perm].reshape(*shape, *x.shape[1:]), flat)


def actor_step(agent: Agent, mb: Batch, config: Args, norm_adv: bool = True) -> dict:
    """One Adam step of agent.actor on mb: the clipped surrogate (the PPO rung) or −mean(log π · Ψ), Ψ normalised
    to mean 0, std 1 within mb if norm_adv. Returns the loss and actor_loss_fn's diagnostics."""
    adv = (mb.adv - mb.adv.mean()) / (mb.adv.std() + 1e-8) if norm_adv else mb.adv
    (pg_loss, aux), grads = nnx.value_and_grad(actor_loss_fn, has_aux=True)(
        agent.actor, mb.obs, mb.actions, mb.logp, adv, config.clip_eps, config.ent_coef, ladder(config).clip
    )
    agent.actor_opt.update(agent.actor, grads)
    return dict(pg_loss=pg_loss, **aux)


def ppo_update(graphdef, config: Args, state, rollout: Rollout, key):
    """One PPO iteration in one XLA call: V → GAE(λ) advantages and targets → update_epochs epochs, each a fresh
    shuffle of the rollout into num_minibatches minibatches; every minibatch steps the actor on the clipped surrogate,
    then the critic. A lax.scan over epochs around a lax.scan over minibatches, as PureJaxRL's _update_epoch and
    _update_minbatch.

    Every rung of the ladder runs it, in three phases of which PPO's is the second; rung = ladder(config) sets their
    lengths: rung.batch_steps actor steps on the whole rollout (REINFORCE: Ψ as it is, since normalising would
    subtract the batch mean, itself a baseline); rung.actor_epochs epochs of minibatches that step the actor (unclipped
    below PPO) and the critic (A2C: one, PPO: all); critic-only epochs up to rung.critic_epochs. Epoch e shuffles with
    split(key, update_epochs)[e] on every rung. Without a critic (REINFORCE), v_loss and explained_var are NaN.

    state: nnx.state of an Agent; rollout: (T, N, …), next_obs the true s_{t+1}. Returns the new state and the
    statistics, each the mean over the steps of the phase that made it."""
    rung = ladder(config)
    flat, values, targets = rollout_batch(graphdef, config, state, rollout)

    def _actor_on_rollout(state, _):
        agent = nnx.merge(graphdef, state)
        stats = actor_step(agent, flat, config, norm_adv=False)
        return nnx.state(agent), stats

    def _update_epoch(train_actor: bool):
        def _update_minibatch(state, mb: Batch):
            agent = nnx.merge(graphdef, state)
            stats = actor_step(agent, mb, config) if train_actor else {}
            # the critic: one Adam step on the squared error to mb's targets
            v_loss, grads = nnx.value_and_grad(value_loss_fn)(agent.critic, mb.obs, mb.returns)
            agent.critic_opt.update(agent.critic, grads)
            return nnx.state(agent), dict(stats, v_loss=v_loss)

        return lambda state, k: jax.lax.scan(_update_minibatch, state, shuffled_minibatches(flat, k, config))

    keys = jax.random.split(key, config.update_epochs)
    state, batch_stats = jax.lax.scan(_actor_on_rollout, state, length=rung.batch_steps)
    state, both = jax.lax.scan(_update_epoch(True), state, keys[: rung.actor_epochs])  # (epochs, minibatches)
    state, critic_only = jax.lax.scan(_update_epoch(False), state, keys[rung.actor_epochs : rung.critic_epochs])
    actor_stats = batch_stats if rung.batch_steps else both  # from the phase that stepped the actor
    stats = {name: jnp.mean(actor_stats[name]) for name in batch_stats}
    v_loss = jnp.mean(jnp.concatenate([both["v_loss"], critic_only["v_loss"]]))  # NaN: no critic step
    # explained_var = 1 − Var(R̂ − V) / Var(R̂) over the rollout: 1 when V(s_t) predicts its targets, 0 when only
    # their mean
    explained_var = 1.0 - jnp.var(targets - values) / (jnp.var(targets) + 1e-8)
    return state, dict(stats, v_loss=v_loss, explained_var=jnp.where(rung.critic_epochs > 0, explained_var, jnp.nan))


# ---------------------------------------------------------------------------------------------- --backend jax
# The same algorithm as one compiled program, shaped like PureJaxRL: a JAX port of gymnasium 1.4.0's
# Pendulum-v1, a rollout that is a lax.scan, and make_train(config) → train(key), pure, which train_jax (below the
# banner) vmaps over seeds and shards across devices.
GRAVITY, MASS, LENGTH, DT, MAX_SPEED = 10.0, 1.0, 1.0, 0.05, 8.0  # gymnasium's PendulumEnv constants


class EnvState(NamedTuple):
    """One pendulum (or, vmapped, a batch): angle θ (0 = upright, not wrapped), θ̇, steps taken so far."""

    th: jax.Array
    thdot: jax.Array
    t: jax.Array


def angle_normalize(x):
    """θ wrapped into [−π, π), as in gymnasium's cost."""
    return ((x + jnp.pi) % (2 * jnp.pi)) - jnp.pi


def pendulum_obs(s: EnvState) -> jax.Array:
    """(cos θ, sin θ, θ̇), shape (..., 3)."""
    return jnp.stack([jnp.cos(s.th), jnp.sin(s.th), s.thdot], axis=-1)


def pendulum_reset(key) -> EnvState:
    """θ ~ U[−π, π], θ̇ ~ U[−1, 1], like PendulumEnv.reset without options."""
    th, thdot = jax.random.uniform(key, (2,), minval=jnp.array([-jnp.pi, -1.0]), maxval=jnp.array([jnp.pi, 1.0]))
    return EnvState(th, thdot, jnp.zeros((), jnp.int32))


def pendulum_step(s: EnvState, u):
    """One step of Pendulum-v1 under the 200-step TimeLimit: (s', obs', reward, terminated, truncated).

    u is a scalar torque. cost = angle_normalize(θ)² + 0.1·θ̇² + 0.001·u² (of the OLD state);
    θ̇' = clip(θ̇ + (3g/(2l)·sin θ + 3/(m l²)·u)·dt, −8, 8); θ' = θ + θ̇'·dt. Never terminated."""
    u = jnp.clip(u, -MAX_TORQUE, MAX_TORQUE)
    cost = angle_normalize(s.th) ** 2 + 0.1 * s.thdot**2 + 0.001 * u**2
    thdot = s.thdot + (3 * GRAVITY / (2 * LENGTH) * jnp.sin(s.th) + 3.0 / (MASS * LENGTH**2) * u) * DT
    thdot = jnp.clip(thdot, -MAX_SPEED, MAX_SPEED)
    nxt = EnvState(s.th + thdot * DT, thdot, s.t + 1)
    return nxt, pendulum_obs(nxt), -cost, jnp.zeros((), bool), nxt.t >= EPISODE_STEPS


class Runner(NamedTuple):
    """Everything one seed's --backend jax run carries from iteration to iteration."""

    state: nnx.State  # nnx.state of the Agent: state["actor"], state["critic"], state["actor_opt"], …
    env: EnvState  # num_envs pendulums, (N,) arrays
    obs: jax.Array  # (N, 3) the observation each env continues from
    key: jax.Array  # the PRNG key
    ep_ret: jax.Array  # (N,) the running return of each env's current episode
    last_ret: jax.Array  # (N,) the return of each env's latest finished episode (NaN before the first)


def jax_rollout(actor_def, config: Args, actor_state, runner: Runner) -> tuple[Runner, Rollout]:
    """num_steps steps of num_envs JAX pendulums under the current policy, as one lax.scan.

    Auto-reset inside the scan, like gymnasium's SAME_STEP mode: when an episode ends, the env and the
    obs carried to the next step are a fresh reset, while the rollout stores the TRUE s_{t+1} as next_obs.
    Returns the new runner (env, obs, key, ep_ret, last_ret moved on) and the Rollout, every field (T, N, …)."""
    actor = nnx.merge(actor_def, actor_state)

    def step(carry, _):
        env, obs, key, ep_ret, last_ret = carry
        key, act_key, reset_key = jax.random.split(key, 3)
        dist = actor(obs)
        action = dist.sample(seed=act_key)  # (N, 1), unclipped
        logp = dist.log_prob(action).sum(-1)  # (N,)
        env_next, next_obs, reward, term, trunc = jax.vmap(pendulum_step)(env, action[:, 0])  # the env clips u
        done = term | trunc
        fresh = jax.vmap(pendulum_reset)(jax.random.split(reset_key, config.num_envs))
        env = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, env_next)  # reset where done
        obs_carry = jnp.where(done[:, None], pendulum_obs(fresh), next_obs)
        ep_ret = ep_ret + reward
        last_ret = jnp.where(done, ep_ret, last_ret)
        ep_ret = jnp.where(done, 0.0, ep_ret)
        transition = Rollout(
            obs=obs,
            actions=action,
            logp=logp,
            rewards=reward * config.reward_scale,
            terminated=term.astype(jnp.float32),
            truncated=trunc.astype(jnp.float32),
            next_obs=next_obs,
        )
        return (env, obs_carry, key, ep_ret, last_ret), transition

    carry = (runner.env, runner.obs, runner.key, runner.ep_ret, runner.last_ret)
    (env, obs, key, ep_ret, last_ret), rollout = jax.lax.scan(step, carry, None, length=config.num_steps)
    return runner._replace(env=env, obs=obs, key=key, ep_ret=ep_ret, last_ret=last_ret), rollout


def graph_defs(config: Args) -> tuple:
    """The graph definitions of the Agent and of its actor alone, the same for every seed; nnx.eval_shape builds
    the modules with shapes, not arrays."""
    agent = nnx.eval_shape(lambda: new_agent(config, jax.random.key(0), jax.random.key(0)))
    return nnx.graphdef(agent), nnx.graphdef(agent.actor)


@dataclass(frozen=True)
class Train:
    """train(key) = run(init(key)): one seed's whole training, a pure function of its key (PureJaxRL's train)."""

    init: Callable  # key → Runner: networks, optimizers and envs of one seed
    run: Callable  # Runner → (Runner, stats): the training iterations in one lax.scan, stats (num_updates,) each

    def __call__(self, key):
        return self.run(self.init(key))


def make_train(config: Args, num_updates: int | None = None) -> Train:
    """Fix everything static once and return train(key). It runs num_updates iterations (default: the whole
    budget, config.num_updates; the learning-rate schedules always span the whole budget) of rollout → update."""
    graphdef, actor_def = graph_defs(config)

    def init(key) -> Runner:  # as on the gymnasium path: key → (key, actor key, critic key)
        key, actor_key, critic_key = jax.random.split(key, 3)
        agent = new_agent(config, actor_key, critic_key)
        key, env_key = jax.random.split(key)
        env = jax.vmap(pendulum_reset)(jax.random.split(env_key, config.num_envs))
        ep_ret, last_ret = jnp.zeros(config.num_envs, jnp.float32), jnp.full(config.num_envs, jnp.nan, jnp.float32)
        return Runner(nnx.state(agent), env, pendulum_obs(env), key, ep_ret, last_ret)

    def update_step(runner: Runner, _):
        runner, rollout = jax_rollout(actor_def, config, runner.state["actor"], runner)
        key, update_key = jax.random.split(runner.key)
        state, stats = ppo_update(graphdef, config, runner.state, rollout, update_key)
        return runner._replace(state=state, key=key), dict(stats, ret=jnp.nanmean(runner.last_ret))

    def run(runner: Runner):
        length = config.num_updates if num_updates is None else num_updates
        return jax.lax.scan(update_step, runner, None, length=length)

    return Train(init, run)


# ---------------------------------------------------------------------------------------------- The rollout (gymnasium)
def collect_rollout(envs, act_fn: Callable, actor_state, obs, key, rms: RunningMeanStd | None, args: Args, steps):
    """args.num_steps steps of the vector env, one compiled policy call each. Returns the Rollout (T, N, …), the raw
    observations (T, N, 3) for --norm-obs, the obs to continue from, the next key, and (env step, return) of every
    episode that ended (RecordEpisodeStatistics' info["episode"]); `steps` = env steps before this rollout."""
    T, N = args.num_steps, args.num_envs
    rollout = Rollout(*(np.zeros((T, N, *shape), np.float32) for shape in ((3,), (1,), (), (), (), (), (3,))))
    raw_obs, episodes = np.zeros((T, N, 3)), []
    for t in range(T):
        x = normalize_obs(obs, rms)
        action, logp, key = act_fn(actor_state, x, key)
        next_obs, reward, term, trunc, info = envs.step(np.clip(np.asarray(action), -MAX_TORQUE, MAX_TORQUE))
        done = term | trunc
        raw_obs[t], rollout.obs[t], rollout.actions[t], rollout.logp[t] = obs, x, np.asarray(action), np.asarray(logp)
        rollout.rewards[t] = reward * args.reward_scale
        rollout.terminated[t], rollout.truncated[t] = term, trunc
        rollout.next_obs[t] = normalize_obs(true_next_obs(next_obs, done, info), rms)
        episodes += [(steps + (t + 1) * N, float(info["episode"]["r"][i])) for i in np.flatnonzero(done)]
        obs = next_obs
    return rollout, raw_obs, obs, key, episodes


# ---------------------------------------------------------------------------------------------- The training loop
class TrainLog(NamedTuple):
    """What a training loop hands back besides the parameters."""

    ep_steps: list  # env step at which each logged training episode ended
    ep_returns: list  # its return (the --backend jax logs one seed's mean of its envs' latest episodes)
    history: list  # one dict of update statistics per update (for --num-seeds > 1, the mean over seeds)
    train_seconds: float
    first_update_seconds: float  # gymnasium: the first update, compilation included; jax: the compilation


def first_line(args: Args, devices: int = 0) -> str:
    """What the run is about to do, printed before it starts."""
    rung, k = ladder(args), args.num_minibatches
    steps = f"{rung.batch_steps + rung.actor_epochs * k} actor / {rung.critic_epochs * k} critic Adam steps per update"
    chosen = args.algo.startswith("reinforce") and (args.num_envs, args.num_steps) == tuple(WHOLE_EPISODES.values())
    steps += f", whole episodes (the {args.algo} default: 10 envs × 200 steps)" if chosen else ""
    rollouts = f"{args.num_updates} updates × {args.batch_size} steps ({args.num_envs} envs × {args.num_steps})"
    if args.backend == "jax":
        how = (
            f" vmapped, split across {devices} device(s)" if args.num_seeds > devices else ", one per device (no vmap)"
        )
        return f"{args.algo} on a JAX port of {ENV_ID}: {args.num_seeds} seed(s){how}, {rollouts} per seed, {steps}"
    return (
        f"{'PPO' if args.algo == 'ppo' else args.algo} on {ENV_ID}: {rollouts}, {args.update_epochs} epochs × "
        f"{k} minibatches of {args.minibatch_size}, preset={args.preset}{'' if args.algo == 'ppo' else ', ' + steps}"
    )


def print_progress(update: int, num_updates: int, env_steps: int, ret: float, stats: dict, sps: float) -> None:
    """The one progress line per update, the same for both backends."""
    print(
        f"update={update}/{num_updates} step={env_steps} return={ret:.1f} "
        f"loss={stats['pg_loss']:.4f} v_loss={stats['v_loss']:.4f} kl={stats['approx_kl']:.4f} "
        f"clip_frac={stats['clip_frac']:.3f} outside_frac={stats['outside_frac']:.3f} entropy={stats['entropy']:.3f} "
        f"explained_var={stats['explained_var']:.3f} sps={sps:.0f}",
        flush=True,
    )


def train_gymnasium(args: Args) -> tuple[Agent, RunningMeanStd | None, TrainLog]:
    """NumPy envs stepped from a Python loop (collect_rollout), then one compiled update per rollout. Returns
    the trained Agent, the observation statistics (--norm-obs) and the log."""
    key, actor_key, critic_key = jax.random.split(jax.random.key(args.seed), 3)
    agent = new_agent(args, actor_key, critic_key)
    graphdef, state = nnx.split(agent)  # state["actor"] is the actor's part of the agent's state
    act_fn = jax.jit(partial(act, nnx.graphdef(agent.actor)))
    update = jax.jit(partial(ppo_update, graphdef, args))  # args: fixed before anything is traced
    rms = RunningMeanStd(shape=(3,)) if args.norm_obs else None
    envs = RecordEpisodeStatistics(make_envs(args.num_envs))  # info["episode"]["r"]: the return of an ended episode
    obs, _ = envs.reset(seed=[int(s) for s in np.random.default_rng(args.seed).integers(0, 2**31 - 1, args.num_envs)])
    log, steps, t_train = TrainLog([], [], [], 0.0, 0.0), 0, time.perf_counter()
    for update_index in range(1, args.num_updates + 1):
        t0 = time.perf_counter()
        rollout, raw_obs, obs, key, episodes = collect_rollout(envs, act_fn, state["actor"], obs, key, rms, args, steps)
        log.ep_steps.extend(s for s, _ in episodes)
        log.ep_returns.extend(r for _, r in episodes)
        if rms is not None:  # the statistics are frozen within a rollout, so log π_old stays consistent
            rms.update(raw_obs.reshape(-1, 3))
        steps += args.batch_size
        key, k = jax.random.split(key)
        state, stats = update(state, rollout, k)
        stats = {name: float(value) for name, value in stats.items()}
        if update_index == 1:
            log = log._replace(first_update_seconds=round(time.perf_counter() - t0, 2))  # includes compilation
        ret = float(np.mean(log.ep_returns[-args.num_envs :])) if log.ep_returns else float("nan")
        log.history.append(dict(step=steps, **stats))
        sps = args.batch_size / (time.perf_counter() - t0)
        print_progress(update_index, args.num_updates, steps, ret, stats, sps)
    envs.close()
    nnx.update(agent, state)
    return agent, rms, log._replace(train_seconds=time.perf_counter() - t_train)


# ---------------------------------------------------------------------------------------------- Evaluation
def evaluate_seeds(actor_def, actor_states, rms: RunningMeanStd | None, episodes: int, seed0: int) -> np.ndarray:
    """Deterministic returns (S, episodes) on gymnasium's Pendulum-v1, for both backends: each of the S stacked
    policies plays its mean action, clipped, from reset seeds seed0 … seed0+episodes−1 (one vector env)."""
    mean_actions = jax.jit(jax.vmap(lambda state, obs: nnx.merge(actor_def, state)(obs).loc))
    n_seeds = jax.tree.leaves(actor_states)[0].shape[0]
    envs = make_envs(n_seeds * episodes)
    obs, _ = envs.reset(seed=[seed0 + i for _ in range(n_seeds) for i in range(episodes)])
    total, alive = np.zeros(n_seeds * episodes), np.ones(n_seeds * episodes, bool)
    while alive.any():
        x = normalize_obs(obs, rms).reshape(n_seeds, episodes, -1)  # policy s sees its own episodes
        a = np.asarray(mean_actions(actor_states, x)).reshape(n_seeds * episodes, -1)
        obs, r, term, trunc, _ = envs.step(np.clip(a, -MAX_TORQUE, MAX_TORQUE))
        total += r * alive
        alive &= ~(term | trunc)
    envs.close()
    return total.reshape(n_seeds, episodes)


# Plumbing ─ below: the run folder, command line and checks, train_jax (seeds over devices), checkpoints, plots, main


class RunError(Exception):
    """What ends a run early with one line on stderr and exit status 1: bad input, a full disk, a failed check."""


class Run:
    """This run's own folder, <--out>/<date>-<time>-seed<seed>. Each file is written under a temporary name, then moved
    into place; metrics.json comes last and marks a complete run, which <--out>/latest then points at."""

    def __init__(self, args):
        stamp, Run.active, self.saved, self.complete = time.strftime("%Y%m%d-%H%M%S"), self, [], False
        for n in range(1, 1000):  # a folder that exists is another run's: this one takes the next name
            self.folder = os.path.join(args.out, f"{stamp}-seed{args.seed}" + f"-{n}" * (n > 1))
            try:
                return os.makedirs(self.folder)
            except FileExistsError:
                continue
            except OSError as e:
                raise RunError(f"--out {args.out!r} is not a writable folder ({e.strerror})") from None

    def save(self, name: str, writer, *args) -> None:  # writer(path, *args) writes `name`: whole, or absent
        partial = os.path.join(self.folder, "partial-" + name)  # the same ending: savefig and PIL read it
        try:
            writer(partial, *args)
            os.replace(partial, os.path.join(self.folder, name))
        except OSError as e:
            raise RunError(f"{(e.strerror or type(e).__name__).lower()} while writing {name}") from None
        finally:  # what a full disk or a stop left half-written goes, and gives its space back
            shutil.rmtree(partial) if os.path.isdir(partial) else Path(partial).unlink(missing_ok=True)
        self.saved.append(name)

    def finish(self, metrics: dict) -> None:
        if Run.stops:  # a stop that a library callback swallowed: the run ends here, not complete
            raise KeyboardInterrupt
        self.save("metrics.json", lambda path: Path(path).write_text(json.dumps(metrics, indent=2)))
        self.complete, link = True, os.path.join(os.path.dirname(self.folder), f"partial-latest-{os.getpid()}")
        os.symlink(os.path.basename(self.folder), link)  # then moved into place: `latest` is never missing
        os.replace(link, os.path.join(os.path.dirname(self.folder), "latest"))

    def left(self) -> str:  # the end of the one line: what this run's folder holds now
        if self.complete:
            return f" once the run was complete; {self.folder} holds all of it"
        if not self.saved:
            return shutil.rmtree(self.folder, ignore_errors=True) or "; nothing written"
        return f"; kept in {self.folder}: {', '.join(self.saved)} (not complete: no metrics.json)"


def stop(signum, frame):  # SIGINT and SIGTERM end a run the same way: a KeyboardInterrupt, reported by one_line
    Run.stops.append(signum)
    raise KeyboardInterrupt


def one_line(main):
    """main(args), ended by one line on stderr unless it finishes: status 1 (RunError), 130 (Ctrl-C), 143 (SIGTERM)."""

    def run(args=None):
        cli, code, signals, hook = args is None, 0, {signal.SIGINT, signal.SIGTERM}, sys.unraisablehook
        handlers, Run.stops, Run.active = {s: signal.signal(s, stop) for s in signals}, [], None
        sys.unraisablehook = lambda u: u.exc_type is KeyboardInterrupt or hook(u)  # finish() sees a swallowed stop
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # one that came while the libraries loaded lands now
            metrics = main(args or parse_args())
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # done: a stop from here on waits for the exit
        except BaseException as e:  # after a stop, whatever a library made of its KeyboardInterrupt (JAX: ValueError)
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # stopping already: one line, then the exit
            if not (Run.stops or isinstance(e, (RunError, OSError))):
                raise  # a bug, or argparse's exit: as Python reports it
            rest = Run.active.left() if Run.active else "; nothing written"
            print(f"interrupted{rest}" if Run.stops else f"error: {e}{rest}", file=sys.stderr)
            code = 128 + Run.stops[0] if Run.stops else 1
        finally:
            if not cli:  # a test called main(args): its own handlers come back
                signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
                sys.unraisablehook, _ = hook, [signal.signal(s, h) for s, h in handlers.items()]
        if cli:  # exit at once: the files are complete, and Python's shutdown would outlive the handlers
            sys.stdout.flush(), sys.stderr.flush(), os._exit(code)
        return sys.exit(code) if code else metrics

    return run


def parse_args(argv=None) -> Args:  # one flag per field of Args; a malformed one is one line (main checks bounds)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message} (see --help)")  # one line, not the usage
    for f in fields(Args):
        kind = {"type": type(f.default), "choices": f.metadata["choices"]}
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(f.default, bool) else kind
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default, help=f.metadata["help"], **kind)
    first, _ = p.parse_known_args(argv)
    if first.preset == "untuned":  # a preset changes the defaults; explicit flags are parsed on top
        p.set_defaults(**UNTUNED_PRESET)
    if first.algo.startswith("reinforce"):  # G_t needs whole episodes: the reinforce rungs' own rollout size
        p.set_defaults(**WHOLE_EPISODES)
    return Args(**vars(p.parse_args(argv)))


def check_flags(args) -> None:  # RunError, one line, for the first flag outside its flag()'s bounds
    for f in fields(args):
        v, m, name = getattr(args, f.name), f.metadata, "--" + f.name.replace("_", "-")  # choices: argparse checks
        for bound, op, ok in ((m["gt"], ">", gt), (m["min"], ">=", ge), (m["max"], "<=", le)):
            if bound is not None and not ok(v, bound):
                raise RunError(f"{name} must be {op} {bound}, got {v}")


def validate(args: Args) -> None:
    """Raise RunError on a flag outside its bounds (check_flags), or on flags that do not fit together, each relation
    with its reason. load_params checks a --load checkpoint."""
    check_flags(args)
    if args.host_devices > 0 and (args.backend != "jax" or args.num_seeds % args.host_devices):  # even shards
        raise RunError(f"--host-devices {args.host_devices} needs --backend jax and a --num-seeds that it divides")
    if args.backend == "gymnasium" and args.num_seeds > 1:  # one Python loop steps one seed's envs
        raise RunError(f"--num-seeds {args.num_seeds} needs --backend jax (for a gymnasium sweep: tools/seeds.py)")
    if args.backend == "jax" and args.norm_obs:  # the running statistics live in NumPy, outside the compiled run
        raise RunError("--norm-obs is implemented for --backend gymnasium only")
    if args.load and args.num_seeds > 1:
        raise RunError("--load evaluates one saved policy; drop --num-seeds")
    if args.algo.startswith("reinforce") and args.num_steps % EPISODE_STEPS:  # G_t needs each episode's end
        raise RunError(f"--algo {args.algo}: --num-steps must be a multiple of {EPISODE_STEPS}, got {args.num_steps}")
    batch = f"--num-envs × --num-steps = {args.batch_size}"
    if args.minibatch_size > args.batch_size:  # a minibatch is a slice of one rollout
        raise RunError(f"--minibatch-size ({args.minibatch_size}) is larger than the rollout ({batch})")
    if not args.load and args.total_timesteps < args.batch_size:  # training is a whole number of rollouts, at least 1
        raise RunError(f"--total-timesteps ({args.total_timesteps}) is less than one rollout ({batch})")
    if args.preset == "untuned" and all(getattr(args, k) == getattr(Args(), k) for k in UNTUNED_PRESET):
        raise RunError("preset 'untuned' is applied by parse_args; in Python: Args(preset='untuned', **UNTUNED_PRESET)")


def seed_devices(args: Args) -> list:
    """The devices that the seed axis of a --backend jax run is split across (data parallelism over seeds).
    Must run before the first JAX operation.

    JAX sees a CPU as one device, and XLA runs one device's program mostly on one core. Asked before JAX
    starts its backend, jax_num_cpu_devices splits the CPU into several devices; sharding the stacked seeds
    along them gives every core its own seeds (the mesh of 5_Sharding_Mesh, with one axis). The count must
    divide --num-seeds: --host-devices -1 takes the largest such count up to the number of cores.
    """
    want = most_devices(args.num_seeds, os.cpu_count() or 1) if args.host_devices < 0 else args.host_devices
    if want > 0:
        with contextlib.suppress(RuntimeError):  # JAX had already started (a test, a notebook): it keeps its devices
            jax.config.update("jax_num_cpu_devices", want)
    devices = jax.devices()  # on a GPU or TPU host, the accelerators (the flag only shapes the CPU backend)
    return devices[: most_devices(args.num_seeds, min(len(devices), want) if want > 0 else len(devices))]


def most_devices(num_seeds: int, at_most: int) -> int:
    """The largest device count ≤ at_most that divides num_seeds, so that every device gets as many seeds."""
    return max(k for k in range(1, at_most + 1) if num_seeds % k == 0)


def over_seeds(fn: Callable, seeds_per_device: int) -> Callable:
    """fn of one seed, applied to one device's seeds, stacked on a leading axis: jax.vmap(fn), except for a single
    seed, which runs unbatched (the axis dropped, then put back). Even an axis of size 1 changes the program that
    XLA compiles: on CPU some weight gradients then come out transposed in memory, and Adam's elementwise update,
    which reads them against that order, runs slower."""
    if seeds_per_device > 1:
        return jax.vmap(fn)
    return lambda seeds: jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], seeds)))


def train_jax(args: Args, devices: list) -> tuple[Agent, nnx.State, TrainLog]:
    """--backend jax: make_train(args), its run vmapped over the seeds (over_seeds) and sharded across `devices`: one
    compiled call for the whole training. The progress lines are printed when it returns, from the statistics it
    stacked (sps there is the whole run's). Returns the first seed's trained Agent, every seed's actor state (leading
    axis S) and the log."""
    graphdef, _ = graph_defs(args)
    train = make_train(args)
    # Each seed's init is compiled and run on its own; the runners are stacked on a leading seed axis S, and
    # device i gets seeds i·S/D … (i+1)·S/D − 1. run, over each device's seeds, then trains them without communication.
    init = jax.jit(train.init)
    runners = jax.tree.map(
        lambda *x: jnp.stack(x), *[init(jax.random.key(s)) for s in range(args.seed, args.seed + args.num_seeds)]
    )
    mesh = jax.make_mesh((len(devices),), ("seed",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    by_seed = jax.sharding.PartitionSpec("seed")
    runners = jax.device_put(runners, jax.sharding.NamedSharding(mesh, by_seed))
    print(first_line(args, len(devices)), flush=True)
    t_train = time.perf_counter()
    seeds_of_a_device = over_seeds(train.run, args.num_seeds // len(devices))
    per_device = jax.shard_map(seeds_of_a_device, mesh=mesh, in_specs=by_seed, out_specs=by_seed)
    run = jax.jit(per_device).lower(runners).compile()
    compile_seconds = round(time.perf_counter() - t_train, 2)
    runners, stats = jax.block_until_ready(run(runners))  # dispatched: XLA runs every update in this one call
    stats = {name: np.asarray(value) for name, value in stats.items()}  # each (S, num_updates)
    train_seconds = time.perf_counter() - t_train
    log = TrainLog([], [], [], train_seconds, compile_seconds)
    sps = args.batch_size * args.num_seeds * args.num_updates / (train_seconds - compile_seconds)
    for u in range(args.num_updates):
        steps = (u + 1) * args.batch_size
        rets = stats["ret"][:, u]  # (S,) latest finished training episode, mean over each seed's envs
        finite = rets[np.isfinite(rets)]
        log.ep_steps.extend([steps] * len(finite))
        log.ep_returns.extend(float(r) for r in finite)
        row = {name: float(np.mean(np.ascontiguousarray(v[:, u]))) for name, v in stats.items() if name != "ret"}
        log.history.append(dict(step=steps, **row))
        ret = float(np.mean(finite)) if len(finite) else float("nan")
        print_progress(u + 1, args.num_updates, steps, ret, log.history[-1], sps)
    agent = nnx.merge(graphdef, jax.tree.map(lambda x: x[0], runners.state))
    return agent, runners.state["actor"], log


def params_tree(actor: Actor, critic: Critic, rms: RunningMeanStd | None) -> dict:
    """What a checkpoint holds: the networks' nnx.Param state, and with --norm-obs the observation statistics."""
    tree = {"actor": nnx.state(actor, nnx.Param), "critic": nnx.state(critic, nnx.Param)}
    return tree | ({"obs_norm": {"mean": rms.mean, "var": rms.var}} if rms is not None else {})


def save_params(path: str, tree: dict) -> None:
    """The checkpoint folder `path`, written by orbax (Flax's way to save NNX state); `with` waits for the write."""
    logging.getLogger("absl").disabled = True  # a failed write: orbax's log, and its other writes' tracebacks, go
    sys.unraisablehook = lambda u, hook=sys.unraisablehook: "Event loop is closed" in str(u.exc_value) or hook(u)
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(os.path.abspath(path), jax.device_get(tree))  # host arrays: restored on any device
    except ValueError as e:  # a failed write (a full disk): orbax names the OS error, "[os_error_code='28']"
        code = int(str(e).partition("os_error_code='")[2].partition("'")[0] or 5)  # 5: EIO, where it names none
        raise OSError(code, os.strerror(code)) from None
    finally:  # orbax writes into <path>.orbax-checkpoint-tmp, then renames it: what a failed write left goes
        shutil.rmtree(path + ".orbax-checkpoint-tmp", ignore_errors=True)


def arrays_in(tree) -> dict:
    """'actor/fc1/kernel' -> 'float32(3, 64)': the name, dtype and shape of every array of a checkpoint's tree."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    name = lambda path: jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")  # noqa: E731
    return {name(path): f"{np.dtype(x.dtype)}{tuple(x.shape)}" for path, x in leaves}


def load_params(args: Args) -> tuple[Actor, Critic, RunningMeanStd | None]:
    """--load: the actor, critic and observation statistics of a checkpoint folder. Its names, dtypes and shapes,
    read from its metadata, must be those of the networks these flags build before anything is restored; then a file
    that cannot be read (truncated, damaged) ends the run too. Each is a RunError of one line."""
    agent = nnx.eval_shape(lambda: new_agent(args, jax.random.key(0), jax.random.key(0)))
    rms = RunningMeanStd(shape=(3,)) if args.norm_obs else None
    abstract = params_tree(agent.actor, agent.critic, rms)  # shapes and dtypes: what to restore, and as what
    path, where = os.path.abspath(args.load), f"--load {args.load}"
    if not os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):
        raise RunError(f"{where}: no checkpoint there (a training run's params folder: runs/pendulum/latest/params)")
    logging.getLogger("absl").disabled = True  # orbax's warnings about a damaged file: the one line says it
    checkpointer = ocp.StandardCheckpointer()  # closed after a restore, not after a failed one (see below)
    saved = checkpointer.metadata(path).item_metadata
    want, found = arrays_in(abstract), arrays_in(saved.tree if saved is not None else {})
    for name in sorted(want.keys() | found.keys()) if saved is not None else ():
        if want.get(name) != found.get(name):
            raise RunError(
                f"{where}: {name} is {found.get(name, 'missing')}, these flags need {want.get(name, 'none')} (saved "
                f"by another script, or with another --hidden-size, --sigma or --norm-obs?)"
            )
    try:
        tree = checkpointer.restore(path, abstract)
    except Exception as e:  # a damaged or truncated file under it
        sys.unraisablehook = lambda unraisable: None  # its other reads, still in flight, fail once the run ends
        raise RunError(f"{where}: a damaged checkpoint, not readable ({type(e).__name__})") from None
    checkpointer.close()
    if rms is not None:
        rms.mean, rms.var = tree["obs_norm"]["mean"], tree["obs_norm"]["var"]
    actor, critic = (nnx.merge(nnx.graphdef(getattr(agent, k)), tree[k]) for k in ("actor", "critic"))
    return actor, critic, rms


def save_video(path: str, actor: Actor, rms: RunningMeanStd | None, args: Args, metrics: dict) -> None:
    """One deterministic episode as a GIF (every 2nd frame, 240×240): of the evaluation episodes, the one that starts
    closest to hanging down, a full swing-up. Its seed and return go into metrics."""
    from PIL import Image

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen: frames as arrays need no display
    env = gym.make(ENV_ID, render_mode="rgb_array")
    starts = [env.reset(seed=args.eval_seed + i)[0][0] for i in range(args.eval_episodes)]  # cos θ at t = 0
    metrics["video_seed"] = args.eval_seed + int(np.argmin(starts))  # the smallest cos θ
    graphdef, state = nnx.split(actor)
    mean_action = jax.jit(lambda state, obs: nnx.merge(graphdef, state)(obs).loc)
    obs, _ = env.reset(seed=metrics["video_seed"])
    frames, total, done, t = [], 0.0, False, 0
    while not done:
        if t % 2 == 0:
            frames.append(Image.fromarray(env.render()).resize((240, 240)).quantize(colors=32))
        a = np.clip(np.asarray(mean_action(state, normalize_obs(obs[None], rms)))[0], -MAX_TORQUE, MAX_TORQUE)
        obs, r, term, trunc, _ = env.step(a)
        total, done, t = total + float(r), term or trunc, t + 1
    env.close()
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=66, loop=0, optimize=True)
    metrics["video_return"] = total


def plot_curve(path: str, args: Args, log: TrainLog, eval_mean: float) -> None:
    """Each training episode's return (a dot), their running mean (solid) and the final deterministic score (dashed)."""
    who = f"seed {args.seed}" if args.num_seeds == 1 else f"seeds {args.seed}–{args.seed + args.num_seeds - 1}"
    title = f"{'PPO' if args.algo == 'ppo' else args.algo} on {ENV_ID} ({args.backend}), {who}, preset {args.preset}"
    jax_dots = "one seed: mean of its envs' latest training episodes"
    dots = jax_dots if args.backend == "jax" else "training episode (stochastic policy)"
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no figure left open

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.subplots()
    if log.ep_returns:
        x, y = np.asarray(log.ep_steps), np.asarray(log.ep_returns)
        ax.scatter(x, y, s=6, alpha=0.35, label=dots)
        k = 16
        if len(y) >= k:
            ax.plot(x[k - 1 :], np.convolve(y, np.ones(k) / k, mode="valid"), lw=2, label=f"mean of last {k}")
    ax.axhline(eval_mean, color="C2", ls="--", label=f"final deterministic eval {eval_mean:.0f}")
    ax.axhline(-200, color="gray", lw=0.8, ls=":", label="−200 (target)")
    ax.set(xlabel="environment steps", ylabel="episode return", title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def use_compile_cache(folder: str) -> None:
    """Keep every compiled XLA program on disk, so the next run with the same shapes skips compilation.
    Must run before the first compilation. The numbers do not change, only the start-up time."""
    if folder:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default: only programs > 1 s
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def finish(run: Run, args: Args, actor: Actor, rms, actor_states, t_start: float, log=None, devices=0) -> dict:
    """The end of a complete run, training (with its `log`) or --load alike: every seed's final policy (actor_states,
    leading axis S) scored on gymnasium's Pendulum-v1 whichever backend trained it, returns (S, episodes); the learning
    curve; the GIF (--video); metrics.json, which completes the run; the summary lines."""
    returns = evaluate_seeds(nnx.graphdef(actor), actor_states, rms, args.eval_episodes, args.eval_seed)
    per_seed = returns.mean(1)
    metrics = dict(
        eval_return_mean=float(returns.mean()),
        eval_return_std=float(returns.std()),
        eval_episodes=args.eval_episodes,
        eval_returns=[round(float(r), 2) for r in returns[0]],  # of the first seed, whose networks are saved
        eval_return_per_seed=[float(r) for r in per_seed],  # each seed's mean over its episodes, unrounded for tools
        seeds=list(range(args.seed, args.seed + args.num_seeds)),
        env_steps=len(log.history) * args.batch_size if log else 0,
        train_seconds=round(log.train_seconds, 2) if log else 0.0,
        history=log.history if log else [],  # one dict of statistics per update
    )
    if log:  # a training run
        run.save("learning_curve.png", plot_curve, args, log, metrics["eval_return_mean"])
        # last_update: the losses, KL and clip fractions of the final update
        metrics.update(first_update_seconds=log.first_update_seconds, devices=devices, last_update=log.history[-1])
    if args.video:
        run.save("episode.gif", save_video, actor, rms, args, metrics)
        print(f"video: {run.folder}/episode.gif (return {metrics['video_return']:.1f})", flush=True)
    metrics.update(total_seconds=round(time.perf_counter() - t_start, 2), args=asdict(args))
    run.finish(metrics)
    seeds = f"seed {args.seed}" + ("" if args.num_seeds == 1 else f"–{args.seed + args.num_seeds - 1}")
    print(
        f"\n== {'PPO' if args.load or args.algo == 'ppo' else args.algo} {ENV_ID}, {args.backend}, {seeds}, "
        f"preset {args.preset} ==\n"
        f"eval_return_mean={metrics['eval_return_mean']:.1f} eval_return_std={metrics['eval_return_std']:.1f} "
        f"over {args.eval_episodes} deterministic episodes\n"
        f"env_steps={metrics['env_steps']} train_seconds={metrics['train_seconds']:.1f} "
        f"total_seconds={metrics['total_seconds']:.1f}",
        flush=True,
    )
    if args.num_seeds > 1:  # their IQM with its interval: tools/pg_ladder.py (with tools/seeds.py's seed_summary)
        scores = zip(metrics["seeds"], metrics["eval_return_per_seed"])
        print(f"per seed: {' '.join(f'{seed}:{r:.1f}' for seed, r in scores)}", flush=True)
    print(f"outputs: {run.folder} ({', '.join(run.saved)})", flush=True)
    return metrics


@one_line
def main(args: Args) -> dict:
    validate(args)  # flag values, before any work
    use_compile_cache(args.compile_cache)
    t_start = time.perf_counter()
    if args.load:  # score a checkpoint; one that does not fit these flags is refused before any work
        actor, _, rms = load_params(args)
        run = Run(replace(args, out=os.path.join(args.out, "eval")))  # <out>/eval/<run>/: <out>/latest stays put
        print(f"loaded {args.load}", flush=True)
        one = jax.tree.map(lambda x: x[None], nnx.state(actor))  # a stack of one policy, as evaluate_seeds takes
        return finish(run, args, actor, rms, one, t_start)
    devices = seed_devices(args) if args.backend == "jax" else [jax.devices()[0]]  # before JAX starts
    run = Run(args)  # this run's own folder under --out
    if args.backend == "jax":  # every seed's actor (leading axis S); the first seed's networks are saved
        agent, actor_states, log = train_jax(args, devices)
        rms = None
    else:
        print(first_line(args), flush=True)  # what the run is about to do (train_jax prints its own)
        agent, rms, log = train_gymnasium(args)
        actor_states = jax.tree.map(lambda x: x[None], nnx.state(agent.actor))
    run.save("params", save_params, params_tree(agent.actor, agent.critic, rms))  # a stop from here on keeps them
    return finish(run, args, agent.actor, rms, actor_states, t_start, log, len(devices))


if __name__ == "__main__":
    main()
