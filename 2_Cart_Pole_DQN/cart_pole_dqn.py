"""Deep Q-Network (DQN) on CartPole-v1 in JAX + Flax NNX: a replay buffer, a target network and ε-greedy.

A small MLP replaces the Q-table. It acts in 16 CartPole copies at once, learns from minibatches sampled
out of a NumPy ring buffer, and regresses onto TD targets computed by a slowly moving copy of itself (the
target network).

The file reads in the order the algorithm runs: Args and the sizes derived from them; the environments,
the replay buffer, the ε schedule and when the periodic jobs are due; the Q-network and its optimizer; the TD
target and the loss; the compiled update (a block of gradient steps in one lax.scan) and the target-network
sync; the training loop; the greedy evaluation. Then the same DQN compiled end to end (--backend jax):
CartPole as pure JAX functions, the replay buffer as arrays of a fixed size, and make_train(args), whose
train(key) runs the whole loop as one lax.scan. Below the `# Plumbing` line: the run folder and the command
line, input checks, the seeds of --backend jax (vmap, devices), checkpoints, the GIF, the plot, metrics.json, main.

The JAX and Flax NNX this file uses (jax.jit and tracing, lax.scan and its carry, lax.cond, vmap, PRNG keys,
pytrees, nnx.split / nnx.merge / nnx.state) are taught in the course's README.md, section "JAX and Flax NNX"
(README.md#jax-and-flax-nnx); the comments here say only what DQN does with them.

    python 2_Cart_Pole_DQN/cart_pole_dqn.py                      # train 50k steps, evaluate 100 episodes
    python 2_Cart_Pole_DQN/cart_pole_dqn.py --backend jax --num-seeds 16   # 16 seeds in one compiled call
    python 2_Cart_Pole_DQN/cart_pole_dqn.py --load runs/cart_pole_dqn/latest/q_network --video   # -> <out>/eval/
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
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


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag, with the bounds check_flags tests."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: jax.random.key, nnx.Rngs, env resets, NumPy's Generator", min=0)
    backend: str = flag(
        "gymnasium",
        "gymnasium's CartPole in a Python loop, or 'jax': CartPole in JAX and the whole run one compiled make_train",
        choices=("gymnasium", "jax"),
    )
    num_seeds: int = flag(1, "with --backend jax, train seeds --seed … --seed+N−1 together through jax.vmap", min=1)
    host_devices: int = flag(-1, "jax: shard the seeds over N CPU devices (-1 one per core, 0 as is)", min=-1)
    total_timesteps: int = flag(50_000, "environment steps to train for, summed over the parallel envs", gt=0)
    num_envs: int = flag(16, "CartPole-v1 copies stepped side by side; a loop step stores up to num_envs", gt=0)
    learning_rate: float = flag(2.3e-3, "Adam learning rate", gt=0)
    anneal_lr: bool = flag(True, "decay the learning rate linearly to 0 over the run's gradient steps")
    max_grad_norm: float = flag(10.0, "clip the global gradient norm to this value (0 turns clipping off)", min=0)
    hidden_size: int = flag(128, "width of each of the two hidden layers of the Q-network", gt=0)
    buffer_size: int = flag(100_000, "replay buffer capacity (transitions)", gt=0)
    batch_size: int = flag(64, "transitions per gradient step", gt=0)
    gamma: float = flag(0.999, "discount γ; 0.999 looks ~1,000 steps ahead, past the 500-step episode", min=0, max=1)
    learning_starts: int = flag(1_000, "env steps of pure exploration (ε = 1) before the first gradient step", min=0)
    train_frequency: int = flag(256, "env steps between two training calls", gt=0)
    gradient_steps: int = flag(128, "gradient steps per training call (one jitted lax.scan)", gt=0)
    target_network_frequency: int = flag(256, "env steps between two target-network updates", gt=0)
    tau: float = flag(1.0, "θ⁻ ← τ·θ + (1−τ)·θ⁻ at each target update; 1.0 is a hard copy", gt=0, max=1)
    eps_start: float = flag(1.0, "ε of the schedule's line at step 0 (followed from learning_starts on)", min=0, max=1)
    eps_end: float = flag(0.04, "ε at the end of the schedule's line, and from then on", min=0, max=1)
    exploration_fraction: float = flag(
        0.16,
        "the ε line reaches eps_end at exploration_fraction × total_timesteps; it starts at step 0, not at "
        "learning_starts, so after the ε = 1 phase ε resumes part-way down (0.88 at step 1,000 by default)",
        gt=0,
        max=1,
    )
    loss: str = flag("mse", "TD-error loss", choices=("huber", "mse"))
    double_dqn: bool = flag(True, "Double DQN: the online net picks argmax a', the target net scores it")
    bootstrap_truncated: bool = flag(
        True,
        "bootstrap from s' when the time limit cuts an episode "
        "(--no-bootstrap-truncated treats the cut as a termination, a common bug)",
    )
    eval_frequency: int = flag(2_500, "env steps between two periodic greedy evaluations (learning curve)", gt=0)
    periodic_eval_episodes: int = flag(100, "greedy episodes per periodic evaluation (the validation episodes)", gt=0)
    eval_episodes: int = flag(100, "greedy episodes of the final evaluation (the test episodes)", gt=0)
    eval_seed: int = flag(10_000, "seed of the final evaluation's episodes; periodic ones use eval_seed + 1", min=0)
    final_agent: str = flag(
        "best",
        "parameters saved and finally evaluated: the 'best' periodic evaluation's (ties: the later), or the 'last'",
        choices=("best", "last"),
    )
    solve_threshold: float = flag(
        475.0, "a mean return at or above this counts as solved (a periodic evaluation; --backend jax: a seed's test)"
    )
    out: str = flag("runs/cart_pole_dqn", "each run writes a folder of its own in here; <out>/latest: the newest")
    load: str = flag("", "evaluate a saved q_network checkpoint without training (--video: watch it), in <out>/eval/")
    video: bool = flag(False, "also write one greedy episode of the final agent to episode.gif in the run's folder")
    compile_cache: str = flag(
        "~/.cache/jax-rl-course", "JAX's persistent compilation cache: later runs skip compiling ('' turns it off)"
    )

    # Sizes that follow from the flags: computed from them, never set (not flags)
    @property
    def exploration_steps(self) -> int:  # the env step at which ε reaches eps_end
        return max(1, int(self.exploration_fraction * self.total_timesteps))

    @property
    def n_train_calls(self) -> int:
        """Training calls in the whole run: one at every step s with learning_starts < s <= total_timesteps and
        s % train_frequency == 0, so ⌊total/f⌋ − ⌊learning_starts/f⌋ of them (192 for 50,000, 1,000, 256)."""
        return max(0, self.total_timesteps // self.train_frequency - self.learning_starts // self.train_frequency)

    @property
    def total_gradient_steps(self) -> int:  # Adam steps in the whole run: the annealed learning rate is 0 after it
        return self.n_train_calls * self.gradient_steps


# ----------------------------------------------------------------------------- environment, replay buffer, ε

ENV_ID = "CartPole-v1"  # 4 observations (x, ẋ, θ, θ̇), 2 actions, reward +1 per step, truncated at 500
OBS_DIM, N_ACTIONS = 4, 2  # (x, ẋ, θ, θ̇) and {push left, push right}


def make_envs(n: int) -> gym.vector.VectorEnv:
    """n CartPole-v1 copies in gymnasium's own vectorised CartPole: the same physics, stepped in NumPy for all
    n at once. Its autoreset is NEXT_STEP: the step that ends an episode returns the true final observation,
    and the *next* step() call of that env only resets it (its action is ignored, nothing is learned from it)."""
    return gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="vector_entry_point")


class Batch(NamedTuple):
    """Transitions (s, a, r, s', terminated, truncated); each field has the same leading axes."""

    obs: np.ndarray  # s, (..., obs_dim) float32
    actions: np.ndarray  # a, (...,) int32
    rewards: np.ndarray  # r, (...,) float32
    next_obs: np.ndarray  # s', (..., obs_dim) float32
    terminated: np.ndarray  # 1.0 where s' ended the episode in a failure, (...,) float32
    truncated: np.ndarray  # 1.0 where s' hit the time limit, (...,) float32


class ReplayBuffer:
    """A preallocated ring buffer of transitions (s, a, r, s', terminated, truncated) in NumPy arrays.

    `add` writes rows at index `pos` and advances `pos` modulo the capacity, so once full the oldest
    transitions are overwritten. `sample` draws uniformly from the filled rows, one gather per field.
    """

    def __init__(self, capacity: int, obs_dim: int):
        self.capacity, self.pos, self.size = capacity, 0, 0
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros(capacity, np.int32)
        self.rewards = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, np.float32)
        self.truncated = np.zeros(capacity, np.float32)

    def add(self, obs, actions, rewards, next_obs, terminated, truncated) -> None:
        """Write n transitions (one per env; arrays with a leading axis n) at rows pos … pos + n − 1 (mod capacity)."""
        i = (self.pos + np.arange(len(actions))) % self.capacity
        self.obs[i], self.actions[i], self.rewards[i] = obs, actions, rewards
        self.next_obs[i], self.terminated[i], self.truncated[i] = next_obs, terminated, truncated
        self.pos = (self.pos + len(actions)) % self.capacity
        self.size = min(self.size + len(actions), self.capacity)

    def sample(self, rng: np.random.Generator, batch_size: int, n_batches: int) -> Batch:
        """`n_batches` minibatches at once, each field shaped (n_batches, batch_size, ...)."""
        idx = rng.integers(0, self.size, size=(n_batches, batch_size))
        columns = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated, self.truncated)
        return Batch(*(column[idx] for column in columns))


def epsilon_schedule(step: int, eps_start: float, eps_end: float, learning_starts: int, decay_steps: int) -> float:
    """ε_t, the probability of a uniform random action at env step t, in two phases:

    1. t < learning_starts: ε = 1, pure exploration while the buffer fills (no gradient step yet).
    2. t >= learning_starts: the straight line from eps_start at t = 0 to eps_end at t = decay_steps, then eps_end.
       The line is counted from step 0, so phase 2 starts part-way down it: with the defaults (1.0 → 0.04
       over 8,000 steps) ε drops from 1 to 0.88 at step 1,000.
    """
    if step < learning_starts:
        return 1.0
    return max(eps_end, eps_start + (eps_end - eps_start) * step / decay_steps)


class Due(NamedTuple):
    """The periodic jobs of one loop step."""

    train: bool  # a training call: gradient_steps Adam steps on minibatches from the buffer
    sync: bool  # a target-network update
    evaluate: bool  # a periodic greedy evaluation on the validation episodes


def due(args: Args, before: int, after: int) -> Due:
    """The jobs of a loop step that took env_steps from `before` to `after`. A job runs each time env_steps passes
    a multiple of its frequency: training and target updates only after learning_starts, evaluations from the
    start and once more at the last step. A loop step adds at most num_envs <= every frequency transitions, so
    it passes at most one multiple of each."""

    def crossed(every: int, start: int = 0) -> bool:  # did env_steps pass a multiple of `every`, after `start`?
        return after > start and after // every > max(before, start) // every

    return Due(
        train=crossed(args.train_frequency, args.learning_starts),
        sync=crossed(args.target_network_frequency, args.learning_starts),
        evaluate=crossed(args.eval_frequency) or after == args.total_timesteps,
    )


# ----------------------------------------------------------------------------- Q-network and optimizer


class QNetwork(nnx.Module):
    """Q_θ(s, ·): an MLP from the 4 state numbers to one Q-value per action."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_size: int, *, rngs):
        self.hidden1 = nnx.Linear(obs_dim, hidden_size, rngs=rngs)
        self.hidden2 = nnx.Linear(hidden_size, hidden_size, rngs=rngs)
        self.head = nnx.Linear(hidden_size, n_actions, rngs=rngs)

    def __call__(self, obs: jax.Array) -> jax.Array:  # (..., obs_dim) -> (..., n_actions)
        x = nnx.relu(self.hidden1(obs))
        x = nnx.relu(self.hidden2(x))
        return self.head(x)


def make_tx(args: Args) -> optax.GradientTransformation:
    """The optax transformation: Adam, optionally behind global-norm clipping and with a linearly annealed
    learning rate. It only computes the update; build_agent wraps it with the parameters in an nnx.Optimizer."""
    lr = args.learning_rate
    if args.anneal_lr:
        lr = optax.linear_schedule(args.learning_rate, 0.0, max(1, args.total_gradient_steps))
    adam = optax.adam(lr)
    return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam) if args.max_grad_norm > 0 else adam


class Agent(NamedTuple):
    """The Q-network and its optimizer. nnx.state(agent) names its parts the same: state["q_network"] holds θ,
    state["optimizer"] Adam's moments and step count."""

    q_network: QNetwork
    optimizer: nnx.Optimizer  # Adam (make_tx) over q_network's nnx.Param; step: optimizer.update(q_network, grads)


def build_agent(args: Args, rngs: nnx.Rngs) -> Agent:
    """The Q-network, initialised from `rngs`, and its optimizer: the one place they are wired together."""
    q_network = QNetwork(OBS_DIM, N_ACTIONS, args.hidden_size, rngs=rngs)
    return Agent(q_network, nnx.Optimizer(q_network, make_tx(args), wrt=nnx.Param))


# ----------------------------------------------------------------------------- TD target and loss


def td_target(rewards, next_q_target, next_q_online, terminated, truncated, args: Args) -> jax.Array:
    """y = r + γ·(1 − done)·Q⁻(s', a*), with a* = argmax_a' Q⁻(s', a') or, for Double DQN, argmax_a' Q(s', a').

    `done` is `terminated` alone: a time-limit truncation still has a future, so it bootstraps.
    With bootstrap_truncated=False, done = terminated OR truncated: one merged flag, a common bug.
    Shapes: rewards/terminated/truncated (batch,), next_q_* (batch, n_actions).
    """
    done = terminated if args.bootstrap_truncated else jnp.maximum(terminated, truncated)
    if args.double_dqn:
        a_star = jnp.argmax(next_q_online, axis=-1)  # (batch,)
        next_v = jnp.take_along_axis(next_q_target, a_star[:, None], axis=-1)[:, 0]  # Q⁻(s', argmax Q(s', ·))
    else:
        next_v = jnp.max(next_q_target, axis=-1)  # max_a' Q⁻(s', a')
    return rewards + args.gamma * (1.0 - done) * next_v


def loss_fn(q_network: QNetwork, batch: Batch, y: jax.Array, loss: str = "mse") -> jax.Array:
    """L(θ) = mean_i ℓ(y_i − Q_θ(s_i, a_i)), ℓ = ½·squared error (mse) or Huber (δ=1). y, the TD targets
    (batch,), come in as a constant: the gradient flows only through Q_θ(s, a)."""
    q = q_network(batch.obs)  # (batch, n_actions)
    q_taken = jnp.take_along_axis(q, batch.actions[:, None], axis=-1)[:, 0]  # Q_θ(s, a), (batch,)
    if loss == "huber":
        return optax.huber_loss(q_taken, y, delta=1.0).mean()
    return optax.l2_loss(q_taken, y).mean()  # ½(y − Q)²


# ----------------------------------------------------------------------------- the compiled update
# nnx.split(agent) gives a static graphdef and one pytree of arrays, `state`, whose parts carry the Agent's names:
# state["q_network"] is the Q-network's part (its parameters θ), state["optimizer"] Adam's. The functions below
# take that state and nnx.merge inside the trace; make_step_fns binds the graphdefs and the Args with
# functools.partial and compiles each with plain jax.jit, once, so a call only passes arrays.


def greedy_actions(q_graphdef: nnx.GraphDef, params: nnx.State, obs: jax.Array) -> jax.Array:
    """a = argmax_a Q_θ(s, a) for a batch of observations (n, obs_dim) -> (n,)."""
    return jnp.argmax(nnx.merge(q_graphdef, params)(obs), axis=-1)


def train_block(graphdef, q_graphdef, args: Args, state: nnx.State, target_params: nnx.State, batches: Batch):
    """One Adam step per minibatch of `batches` (leading axis K) in one lax.scan; θ⁻ is fixed throughout.

    state: nnx.state of an Agent. Returns the new state and the mean loss over the K steps.
    """
    target_network = nnx.merge(q_graphdef, target_params)  # Q⁻, the same θ⁻ for the whole block

    def gradient_step(state, batch):
        agent = nnx.merge(graphdef, state)
        q_network = agent.q_network
        next_q_target = target_network(batch.next_obs)  # Q⁻(s', ·), (batch, n_actions)
        next_q_online = q_network(batch.next_obs) if args.double_dqn else next_q_target  # picks a* (Double DQN)
        y = td_target(batch.rewards, next_q_target, next_q_online, batch.terminated, batch.truncated, args)
        loss, grads = nnx.value_and_grad(loss_fn)(q_network, batch, y, args.loss)  # ∇θ L, y held constant
        agent.optimizer.update(q_network, grads)  # θ ← Adam(θ, ∇θ L), in place on the merged modules
        return nnx.state(agent), loss

    state, losses = jax.lax.scan(gradient_step, state, batches)
    return state, losses.mean()


@jax.jit
def soft_update(params: nnx.State, target_params: nnx.State, tau: float) -> nnx.State:
    """θ⁻ ← τ·θ + (1 − τ)·θ⁻ (Polyak averaging)."""
    return optax.incremental_update(params, target_params, tau)


def sync_target(params: nnx.State, target_params: nnx.State, tau: float) -> nnx.State:
    """Hard copy θ⁻ ← θ when τ = 1, else Polyak. The copy has arrays of its own, sharing no memory with θ.

    On modules, the hard copy would read nnx.update(target_network, nnx.state(q_network)).
    """
    return jax.tree.map(jnp.copy, params) if tau == 1.0 else soft_update(params, target_params, tau)


def make_step_fns(args: Args, graphdef: nnx.GraphDef, q_graphdef: nnx.GraphDef):
    """The two hot functions, compiled once: act(params, obs) -> greedy actions (n,) and
    update(state, target_params, batches) -> (state, mean loss), one training call.
    graphdef is that of the Agent, q_graphdef that of its q_network alone."""
    act = jax.jit(partial(greedy_actions, q_graphdef))
    update = jax.jit(partial(train_block, graphdef, q_graphdef, args))  # the flags: constants of the trace
    return act, update


# ----------------------------------------------------------------------------- the training loop


def train(args: Args, act, update, state: nnx.State) -> tuple[nnx.State, dict]:
    """Collect with ε-greedy in num_envs envs, learn from replay: the DQN loop.

    state: nnx.state of an Agent. Returns the Q-network's last parameters and a log.
    env_steps counts the real transitions (s, a, r, s') stored so far. Each time it passes a multiple of
    train_frequency after learning_starts, one compiled call runs gradient_steps Adam steps on fresh
    minibatches; each time it passes a multiple of target_network_frequency, the target network is synced.
    """
    rng = np.random.default_rng(args.seed)
    envs = make_envs(args.num_envs)
    n, n_actions = args.num_envs, int(envs.single_action_space.n)
    buffer = ReplayBuffer(args.buffer_size, envs.single_observation_space.shape[0])
    decay_steps = args.exploration_steps
    target_params = jax.tree.map(jnp.copy, state["q_network"])  # θ⁻ starts as a copy of θ (arrays of its own)
    obs, _ = envs.reset(seed=args.seed)
    resetting = np.zeros(n, bool)  # envs whose episode ended last step: this step only resets them
    episode_returns, train_returns, losses, curve = np.zeros(n), [], [], []
    best = dict(params=jax.tree.map(jnp.copy, state["q_network"]), eval_return=-np.inf, step=0)  # θ_best, a copy
    solved_step = solved_seconds = None
    env_steps, t_train = 0, time.perf_counter()
    while env_steps < args.total_timesteps:
        # ε-greedy in every env: a uniform random action with probability ε_t, else a = argmax_a Q_θ(s, a)
        epsilon = epsilon_schedule(env_steps, args.eps_start, args.eps_end, args.learning_starts, decay_steps)
        explore = rng.random(n) < epsilon
        actions = np.where(explore, rng.integers(n_actions, size=n), np.asarray(act(state["q_network"], obs)))
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        # Keep the real transitions (s, a, r, s'): not the reset steps, and no more than total_timesteps in all.
        keep = ~resetting & (np.cumsum(~resetting) <= args.total_timesteps - env_steps)
        buffer.add(obs[keep], actions[keep], rewards[keep], next_obs[keep], terminated[keep], truncated[keep])
        before, env_steps = env_steps, env_steps + int(keep.sum())
        resetting = terminated | truncated
        episode_returns += rewards * keep
        train_returns += episode_returns[resetting & keep].tolist()
        episode_returns[resetting] = 0.0
        obs = next_obs

        jobs = due(args, before, env_steps)
        if jobs.train:
            batches = buffer.sample(rng, args.batch_size, args.gradient_steps)
            state, loss = update(state, target_params, batches)
            losses.append(loss)
        if jobs.sync:
            target_params = sync_target(state["q_network"], target_params, args.tau)
        if jobs.evaluate:
            periodic = evaluate(act, state["q_network"], args.periodic_eval_episodes, args.eval_seed + 1)
            eval_return = float(periodic.returns.mean())
            elapsed = time.perf_counter() - t_train
            train_return = float(np.mean(train_returns[-10:])) if train_returns else 0.0
            mean_loss = float(np.mean(losses[-10:])) if losses else float("nan")
            row = dict(step=env_steps, eval_return=eval_return, train_return=train_return, loss=mean_loss)
            curve.append(dict(row, seconds=round(elapsed, 2)))
            if eval_return >= best["eval_return"]:  # ties go to the later, longer-trained parameters
                best = dict(params=jax.tree.map(jnp.copy, state["q_network"]), eval_return=eval_return, step=env_steps)
            if solved_step is None and eval_return >= args.solve_threshold:
                solved_step, solved_seconds = env_steps, round(elapsed, 2)
            print(progress_line(row, epsilon, env_steps / elapsed), flush=True)
    envs.close()
    log = dict(curve=curve, best=best, solved_step=solved_step, solved_seconds=solved_seconds)
    log.update(env_steps=env_steps, train_seconds=time.perf_counter() - t_train, train_episodes=len(train_returns))
    return state["q_network"], dict(log, gradient_steps_total=len(losses) * args.gradient_steps)


def progress_line(row: dict, epsilon: float, sps: float) -> str:
    """The line printed at a periodic evaluation: a row of the learning curve, ε, and env steps per second."""
    return (
        f"step={row['step']} return={row['train_return']:.1f} eval_return={row['eval_return']:.1f} "
        f"loss={row['loss']:.4f} eps={epsilon:.3f} sps={sps:.0f}"
    )


# ----------------------------------------------------------------------------- evaluation


class Evaluation(NamedTuple):
    returns: np.ndarray  # (n_episodes,) greedy returns
    ends: dict  # how the episodes ended: {"time_limit": n, "cart_left_track": n, "pole_fell": n}


X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # CartPole-v1 terminates when |x| > 2.4 or |θ| > 12°


def evaluate(act, params: nnx.State, n_episodes: int, seed: int) -> Evaluation:
    """Greedy returns of `n_episodes` episodes, all run side by side in the vectorised CartPole: one batched
    Q call per time step. `seed` fixes the episodes' initial states, so every evaluation with the same seed is
    the same test. The last observation of each episode tells how it ended: time limit, cart off the track, or
    pole down."""
    envs = make_envs(n_episodes)
    obs, _ = envs.reset(seed=seed)
    returns, last_obs = np.zeros(n_episodes), np.zeros_like(obs)
    alive = np.ones(n_episodes, bool)  # an episode that ended is auto-reset by the vector env: mask it out
    while alive.any():
        obs, reward, terminated, truncated, _ = envs.step(np.asarray(act(params, obs)))
        returns += reward * alive
        ended = alive & (terminated | truncated)
        last_obs[ended] = obs[ended]  # NEXT_STEP autoreset: the step that ends an episode returns its final obs
        alive &= ~ended
    envs.close()
    cart_out = np.abs(last_obs[:, 0]) > X_LIMIT
    pole_down = ~cart_out & (np.abs(last_obs[:, 2]) > THETA_LIMIT)
    ends = dict(time_limit=~cart_out & ~pole_down, cart_left_track=cart_out, pole_fell=pole_down)
    return Evaluation(returns, {how: int(episodes.sum()) for how, episodes in ends.items()})


def evaluation_metrics(args: Args, act, params: nnx.State) -> dict:
    """The final greedy evaluation of `params`: --eval-episodes test episodes, their initial states from --eval-seed."""
    returns, ends = evaluate(act, params, args.eval_episodes, args.eval_seed)
    return dict(
        eval_return_mean=float(returns.mean()),
        eval_return_std=float(returns.std()),
        eval_return_min=float(returns.min()),
        eval_episodes=len(returns),
        eval_ends=ends,
    )


# ----------------------------------------------------------------------------- the same DQN, compiled (--backend jax)
# train() above, as one XLA program. CartPole becomes two pure JAX functions, the replay buffer a few arrays of a
# fixed size, and the loop one lax.scan over env steps, whose carry (a Runner) holds everything the loop changes.
# make_train(args) returns train(key), a pure function of a key (PureJaxRL's shape), which main vmaps over seeds.
# The Agent (build_agent), act and update (make_step_fns), sync_target, epsilon_schedule and due are the ones
# train() uses.

GRAVITY, MASS_CART, MASS_POLE, HALF_POLE, FORCE, DT = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02  # CartPole-v1's constants
TIME_LIMIT = 500  # CartPole-v1 truncates an episode at its 500th step


class CartPoleState(NamedTuple):
    """One CartPole (or, vmapped, a batch): (x, ẋ, θ, θ̇), which is also its observation, and its steps so far."""

    physics: jax.Array  # (..., 4) float32
    t: jax.Array  # (...,) int32, steps since the reset


def cartpole_reset(key: jax.Array) -> CartPoleState:
    """x, ẋ, θ, θ̇ each uniform on [−0.05, 0.05], t = 0, as CartPole-v1 resets."""
    return CartPoleState(jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05), jnp.zeros((), jnp.int32))


def cartpole_step(state: CartPoleState, action: jax.Array):
    """One step of CartPole-v1 under its time limit: (state', obs', reward, terminated, truncated).

    A force of ±10 N pushes the cart (action 1: to the right). The cart-pole equations give the accelerations θ̈
    and ẍ; one explicit Euler step of dt = 0.02 s then moves x and θ with the old velocities, and the velocities
    with the accelerations. terminated: |x| > 2.4 or |θ| > 12° after the step; truncated: the 500th step. The
    reward is +1 for every step, the last one included."""
    x, x_dot, theta, theta_dot = state.physics
    force = jnp.where(action == 1, FORCE, -FORCE)
    cos, sin = jnp.cos(theta), jnp.sin(theta)
    total_mass, polemass_length = MASS_CART + MASS_POLE, MASS_POLE * HALF_POLE
    temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
    theta_acc = (GRAVITY * sin - cos * temp) / (HALF_POLE * (4.0 / 3.0 - MASS_POLE * cos**2 / total_mass))
    x_acc = temp - polemass_length * theta_acc * cos / total_mass
    physics = jnp.stack([x + DT * x_dot, x_dot + DT * x_acc, theta + DT * theta_dot, theta_dot + DT * theta_acc])
    terminated = (jnp.abs(physics[0]) > X_LIMIT) | (jnp.abs(physics[2]) > THETA_LIMIT)
    t = state.t + 1
    return CartPoleState(physics, t), physics, jnp.ones((), jnp.float32), terminated, t >= TIME_LIMIT


class Buffer(NamedTuple):
    """ReplayBuffer as arrays: jit compiles for fixed shapes, so every field has all `capacity` rows from the start,
    and `pos` and `size` say which are in use."""

    data: Batch  # each field (capacity, ...)
    pos: jax.Array  # int32: the row the next transition goes to
    size: jax.Array  # int32: rows filled so far, at most capacity


def buffer_init(capacity: int, obs_dim: int) -> Buffer:
    """An empty buffer: zeros everywhere, pos = size = 0."""
    rows, vectors = jnp.zeros(capacity, jnp.float32), jnp.zeros((capacity, obs_dim), jnp.float32)
    data = Batch(vectors, jnp.zeros(capacity, jnp.int32), rows, vectors, rows, rows)
    return Buffer(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def buffer_add(buffer: Buffer, transitions: Batch) -> Buffer:
    """Write n transitions (fields with a leading axis n <= capacity) at rows pos … pos + n − 1 (mod capacity), as
    ReplayBuffer.add: once the buffer is full, the oldest rows are overwritten."""
    capacity, n = buffer.data.actions.shape[0], transitions.actions.shape[0]
    rows = (buffer.pos + jnp.arange(n)) % capacity
    data = jax.tree.map(lambda column, new: column.at[rows].set(new), buffer.data, transitions)
    return Buffer(data, (buffer.pos + n) % capacity, jnp.minimum(buffer.size + n, capacity))


def buffer_sample(buffer: Buffer, key: jax.Array, batch_size: int, n_batches: int) -> Batch:
    """`n_batches` minibatches drawn uniformly from the filled rows only, each field (n_batches, batch_size, ...)."""
    rows = jax.random.randint(key, (n_batches, batch_size), 0, buffer.size)
    return jax.tree.map(lambda column: column[rows], buffer.data)


class Schedule(NamedTuple):
    """What each step of the compiled loop does, one entry per step (the xs of the lax.scan)."""

    epsilon: np.ndarray  # float32: ε of the step's ε-greedy actions
    train: np.ndarray  # bool: a training call after the step
    sync: np.ndarray  # bool: a target-network update after it
    evaluate: np.ndarray  # bool: a periodic evaluation after it


def jax_schedule(args: Args) -> Schedule:
    """Every step of the compiled loop stores exactly num_envs transitions (an env whose episode ended is reset
    within the same step), so before step i env_steps is num_envs·i, known before the run. The functions that
    train() calls at every loop step, epsilon_schedule and due, compute the whole schedule here, in NumPy."""
    before = range(0, args.total_timesteps, args.num_envs)
    decay_steps = args.exploration_steps
    eps = [epsilon_schedule(s, args.eps_start, args.eps_end, args.learning_starts, decay_steps) for s in before]
    jobs = [due(args, s, s + args.num_envs) for s in before]
    return Schedule(np.array(eps, np.float32), *(np.array(job) for job in zip(*jobs)))


class Best(NamedTuple):
    """train()'s `best`: the parameters of the best periodic evaluation so far."""

    params: nnx.State  # θ_best
    eval_return: jax.Array  # its mean validation return (−inf before the first evaluation)
    step: jax.Array  # the env step it was taken at


class Runner(NamedTuple):
    """One seed's carry: everything the loop changes from one env step to the next."""

    state: nnx.State  # nnx.state of the Agent: θ = state["q_network"], Adam's moments and step count
    target_params: nnx.State  # θ⁻
    buffer: Buffer  # the replay buffer
    env: CartPoleState  # num_envs CartPoles, each field (N, ...)
    obs: jax.Array  # (N, obs_dim) the observation each env continues from
    episode_return: jax.Array  # (N,) the return so far of each env's current episode
    best: Best  # θ_best, its validation return and step
    env_steps: jax.Array  # int32: transitions stored so far
    key: jax.Array  # the PRNG key, split once per step


class StepLog(NamedTuple):
    """What one step of the loop reports; lax.scan stacks it along the steps. NaN where nothing happened."""

    episode_returns: jax.Array  # (N,) the return of each env's episode that ended at this step
    loss: jax.Array  # the training call's mean loss
    eval_return: jax.Array  # the periodic evaluation's mean return


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, as jax.jit hashes the function it compiles
class Train:
    """train(key) = run(init(key)): one seed's whole training, a pure function of its key (PureJaxRL's train)."""

    init: Callable  # key → Runner: a new agent, θ⁻ = θ, an empty buffer, num_envs fresh CartPoles
    step: Callable  # (Runner, one Schedule entry) → (Runner, StepLog): one step of the loop
    run: Callable  # Runner → (Runner, StepLog of every step): all steps of the schedule in one lax.scan
    validation_returns: Callable  # θ → the greedy returns of the validation episodes, (periodic_eval_episodes,)
    schedule: Schedule  # the xs that run scans over

    def __call__(self, key):
        return self.run(self.init(key))


def make_train(args: Args) -> Train:
    """Fix everything static once (the graphdefs, the compiled act and update, the schedule, the validation
    episodes) and return train(key)."""
    n = args.num_envs
    agent = nnx.eval_shape(lambda: build_agent(args, nnx.Rngs(0)))  # shapes only, no arrays
    act, update = make_step_fns(args, nnx.graphdef(agent), nnx.graphdef(agent.q_network))
    schedule = jax_schedule(args)
    # train()'s validation episodes: the starts that evaluate(..., eval_seed + 1) gets from gymnasium's reset
    envs = make_envs(args.periodic_eval_episodes)
    validation_starts = envs.reset(seed=args.eval_seed + 1)[0]  # (episodes, obs_dim)
    envs.close()

    def init(key) -> Runner:
        key, net_key, env_key = jax.random.split(key, 3)
        state = nnx.state(build_agent(args, nnx.Rngs(net_key)))
        env = jax.vmap(cartpole_reset)(jax.random.split(env_key, n))
        params = state["q_network"]  # θ, which θ⁻ and θ_best start as
        best = Best(params, jnp.array(-jnp.inf, jnp.float32), jnp.zeros((), jnp.int32))
        buffer = buffer_init(args.buffer_size, OBS_DIM)
        return Runner(state, params, buffer, env, env.physics, jnp.zeros(n), best, jnp.zeros((), jnp.int32), key)

    def validation_returns(params: nnx.State) -> jax.Array:
        """evaluate() on the validation episodes, with the JAX CartPole: every episode from its start until it
        ends, greedy; their returns. A lax.while_loop, as the number of steps is not known in advance."""

        def one_step(carry):
            env, returns, alive = carry
            env, _, rewards, terminated, truncated = jax.vmap(cartpole_step)(env, act(params, env.physics))
            return env, returns + rewards * alive, alive & ~(terminated | truncated)

        m = len(validation_starts)
        starts = CartPoleState(jnp.asarray(validation_starts), jnp.zeros(m, jnp.int32))
        _, returns, _ = jax.lax.while_loop(lambda c: c[2].any(), one_step, (starts, jnp.zeros(m), jnp.ones(m, bool)))
        return returns

    def step(runner: Runner, now: Schedule) -> tuple[Runner, StepLog]:
        key, explore_key, action_key, reset_key, sample_key = jax.random.split(runner.key, 5)
        # ε-greedy in every env: a uniform random action with probability ε, else a = argmax_a Q_θ(s, a)
        explore = jax.random.uniform(explore_key, (n,)) < now.epsilon
        random_actions = jax.random.randint(action_key, (n,), 0, N_ACTIONS)
        actions = jnp.where(explore, random_actions, act(runner.state["q_network"], runner.obs))
        env, next_obs, rewards, terminated, truncated = jax.vmap(cartpole_step)(runner.env, actions)
        done = terminated | truncated
        f32 = jnp.float32
        transitions = Batch(runner.obs, actions, rewards, next_obs, terminated.astype(f32), truncated.astype(f32))
        buffer = buffer_add(runner.buffer, transitions)  # s' is the true last observation, also at the time limit
        env_steps = runner.env_steps + n
        # an env whose episode ended continues from a fresh start, within this step
        fresh = jax.vmap(cartpole_reset)(jax.random.split(reset_key, n))
        env = CartPoleState(jnp.where(done[:, None], fresh.physics, env.physics), jnp.where(done, fresh.t, env.t))
        episode_return = runner.episode_return + rewards

        # The jobs of this step: lax.cond runs one of its two branches, picked by the schedule's boolean. That boolean
        # comes from the schedule, the scan's xs, which vmap does not batch, so each cond stays a branch.
        def train_call():
            batches = buffer_sample(buffer, sample_key, args.batch_size, args.gradient_steps)
            return update(runner.state, runner.target_params, batches)

        state, loss = jax.lax.cond(now.train, train_call, lambda: (runner.state, f32(jnp.nan)))
        params = state["q_network"]  # θ after this step's training call
        target_params = jax.lax.cond(
            now.sync, lambda: sync_target(params, runner.target_params, args.tau), lambda: runner.target_params
        )

        def evaluate_and_keep():
            eval_return = validation_returns(params).mean()
            better = eval_return >= runner.best.eval_return  # ties go to the later, longer-trained parameters
            candidate = Best(params, eval_return, env_steps)
            return eval_return, jax.tree.map(lambda new, old: jnp.where(better, new, old), candidate, runner.best)

        eval_return, best = jax.lax.cond(now.evaluate, evaluate_and_keep, lambda: (f32(jnp.nan), runner.best))
        log = StepLog(jnp.where(done, episode_return, jnp.nan), loss, eval_return)
        episode_return = jnp.where(done, 0.0, episode_return)
        return Runner(state, target_params, buffer, env, env.physics, episode_return, best, env_steps, key), log

    def run(runner: Runner) -> tuple[Runner, StepLog]:
        return jax.lax.scan(step, runner, schedule)

    return Train(init, step, run, validation_returns, schedule)


def over_seeds(fn: Callable, seeds_per_device: int) -> Callable:
    """fn of one seed, applied to one device's seeds, stacked on a leading axis: jax.vmap(fn), except for a single
    seed, which runs unbatched (the axis dropped, then put back). Even an axis of size 1 changes the program that
    XLA compiles: on CPU some weight gradients then come out transposed in memory, and Adam's elementwise update,
    which reads them against that order, runs slower."""
    if seeds_per_device > 1:
        return jax.vmap(fn)
    return lambda seeds: jax.tree.map(lambda x: x[None], fn(jax.tree.map(lambda x: x[0], seeds)))


# Plumbing: the run folder and the command line, input checks, --backend jax's seeds and devices, checkpoints, the
# GIF, the plot, metrics.json and main ----------------------------------------------------------------------------


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
    return Args(**vars(p.parse_args(argv)))


def check_flags(args) -> None:  # RunError, one line, for the first flag outside its flag()'s bounds
    for f in fields(args):
        v, m, name = getattr(args, f.name), f.metadata, "--" + f.name.replace("_", "-")  # choices: argparse checks
        for bound, op, ok in ((m["gt"], ">", gt), (m["min"], ">=", ge), (m["max"], "<=", le)):
            if bound is not None and not ok(v, bound):
                raise RunError(f"{name} must be {op} {bound}, got {v}")


def validate(args: Args) -> None:
    """Raise RunError (one line) before any work: a flag outside its bounds (check_flags), or two that do not fit."""
    check_flags(args)

    def need(name: str, op, other: str, when: bool = True) -> None:  # e.g. need("batch_size", le, "buffer_size")
        value, bound, dash = getattr(args, name), getattr(args, other), lambda n: "--" + n.replace("_", "-")
        if when and not op(value, bound):
            raise RunError(f"{dash(name)} ({value}) must be {'<=' if op is le else '>='} {dash(other)} ({bound})")

    need("batch_size", le, "buffer_size")  # a minibatch is drawn from the buffer, so it cannot be larger
    for name in ("train_frequency", "target_network_frequency", "eval_frequency"):
        need(name, ge, "num_envs")  # one loop step adds up to num_envs transitions, and runs at most one of each job
    need("eps_end", le, "eps_start")  # ε falls along the schedule's line; it never rises
    jax_training = args.backend == "jax" and not args.load
    need("buffer_size", ge, "num_envs", jax_training)  # one step of the compiled loop writes num_envs distinct rows
    if args.num_seeds > 1 and args.backend != "jax":  # only the compiled loop runs seeds side by side
        raise RunError(f"--num-seeds {args.num_seeds} needs --backend jax (for a gymnasium sweep use tools/seeds.py)")
    if args.num_seeds > 1 and args.load:  # a checkpoint holds one Q-network
        raise RunError("--load evaluates one saved Q-network; drop --num-seeds")
    if args.host_devices > 0 and (args.backend != "jax" or args.num_seeds % args.host_devices):  # as many per device
        raise RunError(f"--host-devices {args.host_devices} needs --backend jax and a --num-seeds that it divides")
    if jax_training and args.total_timesteps % args.num_envs:  # a step of the compiled loop steps every env
        raise RunError(f"--total-timesteps ({args.total_timesteps}) must be a multiple of --num-envs ({args.num_envs})")


def seed_devices(args: Args) -> list:
    """The devices that the seed axis of a --backend jax run is split across (data parallelism over seeds).
    Must run before the first JAX operation.

    JAX sees a CPU as one device, and XLA runs one device's program mostly on one core. Asked before JAX
    starts its backend, jax_num_cpu_devices splits the CPU into several devices; sharding the stacked seeds
    along them gives every core its own seeds (the mesh of 5_Sharding_Mesh, with one axis). The count must
    divide --num-seeds: --host-devices -1 takes the largest such count up to the number of cores.
    """

    def most_devices(at_most: int) -> int:  # the largest count ≤ at_most that divides --num-seeds: as many seeds each
        return max(k for k in range(1, at_most + 1) if args.num_seeds % k == 0)

    want = most_devices(os.cpu_count() or 1) if args.host_devices < 0 else args.host_devices
    if want > 0:
        with contextlib.suppress(RuntimeError):  # JAX had already started (a test, a notebook): it keeps its devices
            jax.config.update("jax_num_cpu_devices", want)
    devices = jax.devices()  # on a GPU or TPU host, the accelerators (the flag only shapes the CPU backend)
    return devices[: most_devices(min(len(devices), want) if want > 0 else len(devices))]


def train_seeds(args: Args, devices: list) -> list[tuple[nnx.State, dict]]:
    """--backend jax: make_train(args), its run over the seeds (over_seeds) and sharded across `devices`: one
    compiled call trains every seed. Its progress lines are printed when it returns (for several seeds, their means).
    Returns each seed's last parameters and log, as train() returns them."""
    train, n, d = make_train(args), args.num_seeds, len(devices)
    schedule, how = train.schedule, f" vmapped, split across {d} device(s)" if n > d else ", one per device (no vmap)"
    print(
        f"DQN on a JAX port of {ENV_ID}: {n} seed(s){how}; per seed {len(schedule.epsilon)} steps × {args.num_envs} "
        f"envs, {int(schedule.train.sum())} training calls × {args.gradient_steps} Adam steps, "
        f"{int(schedule.evaluate.sum())} periodic evaluations" + "; progress lines: the mean over the seeds" * (n > 1),
        flush=True,
    )
    # Each seed's init is compiled once and run on its own; the runners are stacked on a leading seed axis S, and
    # device i gets seeds i·S/D … (i+1)·S/D − 1. run, over each device's seeds, then trains them without communication.
    init = jax.jit(train.init)
    runners = jax.tree.map(lambda *x: jnp.stack(x), *[init(jax.random.key(args.seed + i)) for i in range(n)])
    mesh = jax.make_mesh((d,), ("seed",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
    by_seed = jax.sharding.PartitionSpec("seed")
    runners = jax.device_put(runners, jax.sharding.NamedSharding(mesh, by_seed))
    t_train = time.perf_counter()
    # check_vma=False: the seeds never communicate, so shard_map need not track which values differ across devices
    # (it would reject the constant NaN that a lax.cond branch returns where the other returns a per-seed value)
    seeds_of_a_device = over_seeds(train.run, n // d)
    per_device = jax.shard_map(seeds_of_a_device, mesh=mesh, in_specs=by_seed, out_specs=by_seed, check_vma=False)
    run = jax.jit(per_device).lower(runners).compile()
    compile_seconds = round(time.perf_counter() - t_train, 2)
    runners, steps = jax.block_until_ready(run(runners))  # XLA runs every step in this one call
    params, bests, steps = jax.device_get((runners.state["q_network"], runners.best, steps))  # not the buffers
    train_seconds = time.perf_counter() - t_train
    seed = lambda tree, i: jax.tree.map(lambda x: x[i], tree)  # noqa: E731  (seed i's part of the stacked results)
    logs = [jax_log(args, schedule, seed(steps, i), seed(bests, i), train_seconds) for i in range(n)]
    sps = n * args.total_timesteps / max(train_seconds - compile_seconds, 1e-9)
    for rows in zip(*[log["curve"] for log in logs]):  # one progress line per periodic evaluation, the seeds' mean
        mean = {key: float(np.mean([row[key] for row in rows])) for key in ("eval_return", "train_return", "loss")}
        step = rows[0]["step"]  # num_envs·(i + 1) after loop step i, whose ε the line shows
        print(progress_line(dict(mean, step=step), schedule.epsilon[step // args.num_envs - 1], sps))
    return [(seed(params, i), dict(log, compile_seconds=compile_seconds, devices=d)) for i, log in enumerate(logs)]


def jax_log(args: Args, schedule: Schedule, steps: StepLog, best: Best, train_seconds: float) -> dict:
    """One seed's StepLog (NumPy, one entry per step of the compiled loop) as train()'s log: a curve row at each
    periodic evaluation, with the mean of the last 10 training episodes and of the last 10 training losses."""
    ended = np.isfinite(steps.episode_returns)  # (steps, envs): the episodes that ended, step by step
    episodes, n_ended = steps.episode_returns[ended].astype(float), np.cumsum(ended.sum(1))
    losses, n_losses = steps.loss[schedule.train].astype(float), np.cumsum(schedule.train)
    curve = []
    for i in np.flatnonzero(schedule.evaluate):
        train_return = float(np.mean(episodes[: n_ended[i]][-10:])) if n_ended[i] else 0.0
        loss = float(np.mean(losses[: n_losses[i]][-10:])) if n_losses[i] else float("nan")
        step = args.num_envs * (int(i) + 1)  # env steps after loop step i
        eval_return = round(float(steps.eval_return[i]), 2)  # a mean of 100 integers: two decimals are exact
        curve.append(dict(step=step, eval_return=eval_return, train_return=train_return, loss=loss))
    solved = [row["step"] for row in curve if row["eval_return"] >= args.solve_threshold]
    best = dict(params=best.params, eval_return=round(float(best.eval_return), 2), step=int(best.step))
    log = dict(curve=curve, best=best, solved_step=(solved or [None])[0], solved_seconds=None)
    log.update(env_steps=args.total_timesteps, train_seconds=train_seconds, train_episodes=len(episodes))
    return dict(log, gradient_steps_total=int(schedule.train.sum()) * args.gradient_steps)


def save_checkpoint(path: str, params: nnx.State) -> None:
    """θ as an orbax checkpoint: a folder holding each array under its path in the Q-network (hidden1/kernel …)."""
    try:
        with ocp.StandardCheckpointer() as checkpointer:  # leaving the block waits until every file is written
            checkpointer.save(os.path.abspath(path), jax.tree.map(jnp.asarray, params))
    except ValueError as e:  # a failed write (a full disk, say): orbax names the OS error in a ValueError
        time.sleep(0.1)  # the writes still in flight end, and report, while main's filter is in place
        code = int(str(e).partition("os_error_code='")[2].partition("'")[0] or 5)  # 5: EIO, where it names none
        raise OSError(code, os.strerror(code)) from None
    finally:
        shutil.rmtree(path + ".orbax-checkpoint-tmp", ignore_errors=True)  # orbax writes there, then renames


def load_checkpoint(path: str, args: Args) -> nnx.State:
    """θ from a folder save_checkpoint wrote. Before anything is read, the name, shape and dtype of every array in
    the checkpoint's metadata must be those of this run's Q-network (nnx.eval_shape: shapes, no arrays); a folder
    without a checkpoint, any mismatch, or a file that cannot be read is a RunError of one line."""
    abstract = nnx.state(nnx.eval_shape(lambda: QNetwork(OBS_DIM, N_ACTIONS, args.hidden_size, rngs=nnx.Rngs(0))))
    if not os.path.isfile(os.path.join(path, "_METADATA")):
        raise RunError(f"--load {path}: no checkpoint there (a training run keeps it in its folder's q_network/)")
    arrays = lambda tree: {  # noqa: E731
        jax.tree_util.keystr(key, simple=True, separator="/"): f"{tuple(a.shape)} {np.dtype(a.dtype)}"
        for key, a in jax.tree_util.tree_leaves_with_path(tree)
    }
    wanted, found = arrays(abstract), None
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            found = arrays(checkpointer.metadata(os.path.abspath(path)).item_metadata.tree)  # None: unreadable
            if found == wanted:
                return checkpointer.restore(os.path.abspath(path), abstract)
    except Exception as e:  # a truncated or corrupt file
        time.sleep(0.1)  # the reads still in flight end, and report, while main's filter is in place
        raise RunError(f"--load {path}: a corrupt or truncated checkpoint ({type(e).__name__})") from None
    name = min(key for key in wanted.keys() | found.keys() if wanted.get(key) != found.get(key))
    raise RunError(
        f"--load {path}: {name} should be {wanted.get(name, 'absent')}, found {found.get(name, 'none')} "
        "(another module's checkpoint, or another --hidden-size?)"
    )


def save_video(path: str, act, params: nnx.State, seed: int, metrics: dict) -> None:
    """One greedy episode from reset(seed) as a GIF: every 2nd frame, at half size (300×200), in 32 colours. Its
    return goes into metrics."""
    from PIL import Image

    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen; no display needed
    env = gym.make(ENV_ID, render_mode="rgb_array")
    obs, _ = env.reset(seed=seed)
    frames, total, t, done = [], 0.0, 0, False
    while not done:
        if t % 2 == 0:
            frames.append(Image.fromarray(env.render()).resize((300, 200)).quantize(colors=32))
        obs, reward, terminated, truncated, _ = env.step(int(act(params, obs[None])[0]))
        total, t, done = total + reward, t + 1, terminated or truncated
    env.close()
    frames[0].save(path, format="GIF", save_all=True, append_images=frames[1:], duration=80, loop=0)
    metrics["video_return"] = total


def plot_curve(path: str, curve: list[dict], threshold: float, title: str, chosen_step: int) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    steps = [c["step"] for c in curve]
    ax.plot(steps, [c["eval_return"] for c in curve], marker="o", label="greedy evaluation (mean)")
    ax.plot(steps, [c["train_return"] for c in curve], alpha=0.6, label="training episodes (ε-greedy, mean)")
    ax.axhline(threshold, color="gray", ls="--", lw=1, label=f"solved ({threshold:g})")
    ax.axvline(chosen_step, color="green", ls=":", lw=1.5, label="saved parameters")
    ax.set(xlabel="environment steps", ylabel="episode return", title=title, ylim=(0, 520))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def training_metrics(args: Args, act, runs: list, t_start: float) -> dict:
    """metrics.json of a training run: the final evaluation of each seed's saved parameters (--final-agent) and how
    its training went; the first seed's at the top, and for --backend jax every seed's and, for several, a summary."""
    per_seed = [
        dict(
            seed=args.seed + i,
            **evaluation_metrics(args, act, log["best"]["params"] if args.final_agent == "best" else last),
            best_step=log["best"]["step"],
            best_periodic_return=log["best"]["eval_return"],
            solved_step=log["solved_step"],
            validation_returns=[row["eval_return"] for row in log["curve"]],
        )
        for i, (last, log) in enumerate(runs)
    ]
    (last, log), first = runs[0], per_seed[0]
    last = evaluation_metrics(args, act, last) if args.final_agent == "best" else first
    as_logged = ("env_steps", "gradient_steps_total", "solved_seconds", "train_episodes", "curve")
    metrics = dict(
        {key: value for key, value in first.items() if key not in ("seed", "validation_returns")},
        final_agent=args.final_agent,
        last_eval_return_mean=last["eval_return_mean"],
        train_seconds=round(log["train_seconds"], 2),
        **{key: log[key] for key in as_logged},
        total_seconds=round(time.perf_counter() - t_start, 2),
    )
    if args.backend == "jax":
        returns = [row["eval_return_mean"] for row in per_seed]
        metrics.update(backend="jax", seeds=[row["seed"] for row in per_seed], eval_return_per_seed=returns)
        metrics.update(devices=log["devices"], compile_seconds=log["compile_seconds"], per_seed=per_seed)
        metrics["solved"] = sum(r >= args.solve_threshold for r in returns)
    return metrics


def print_summary(args: Args, run: Run, metrics: dict) -> None:
    """The last lines: the final greedy evaluation (with --num-seeds, each seed's and how many solve), the files."""
    step = metrics.get("best_step") if args.final_agent == "best" else metrics["env_steps"]
    what = args.load or f"the {args.final_agent} parameters (step {step})"  # a loaded checkpoint, or this run's θ
    print(
        "\n" * (not args.load) + f"final greedy evaluation of {what} over "
        f"{metrics['eval_episodes']} test episodes (--eval-seed {args.eval_seed}): "
        f"eval_return_mean={metrics['eval_return_mean']:.1f} eval_return_std={metrics['eval_return_std']:.1f} "
        f"min={metrics['eval_return_min']:.0f}"
    )
    print("episodes ended: " + " ".join(f"{k}={v}" for k, v in metrics["eval_ends"].items()))
    if not args.load:  # --backend jax: compile_seconds, the part of train_seconds spent compiling the one call
        compiled = f" compile_seconds={metrics['compile_seconds']:.1f}" if args.backend == "jax" else ""
        print(
            f"env_steps={args.total_timesteps} train_seconds={metrics['train_seconds']:.1f}{compiled} "
            f"gradient_steps={metrics['gradient_steps_total']} solved_step={metrics['solved_step']} "
            f"total_seconds={metrics['total_seconds']}"
        )
    if args.num_seeds > 1:  # their IQM and its confidence interval: tools/seeds.py --runs
        scores = " ".join(f"{seed}:{r:.1f}" for seed, r in zip(metrics["seeds"], metrics["eval_return_per_seed"]))
        print(f"per seed: {scores}\nsolved(>={args.solve_threshold:g})={metrics['solved']}/{args.num_seeds}")
    if "video_return" in metrics:
        print(f"video: episode.gif, one greedy episode of return {metrics['video_return']:.0f}")
    print(f"outputs: {run.folder} ({', '.join(run.saved)})")


def use_compile_cache(folder: str) -> None:
    """Keep every compiled XLA program on disk, so the next run with the same shapes skips compilation.
    Must run before the first compilation. The numbers do not change, only the start-up time."""
    if folder:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default: only programs > 1 s
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def use_sequential_xla_scheduler() -> None:
    """Ask XLA's CPU runtime to run a program's operations one after another. By default it runs independent
    operations side by side on its thread pool; the operations of one gradient step here are tiny (64×128
    matrix products), so handing them between threads costs more than it saves. The numbers do not change.
    XLA reads XLA_FLAGS once, when JAX starts its backend, so the command line sets it before anything else."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:  # a user's own setting wins
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()


@one_line
def main(args: Args) -> dict:
    validate(args)  # flag values, before any work
    use_compile_cache(args.compile_cache)
    # orbax reports a failed read or write in log records, and its other reads and writes, still in flight, in
    # tracebacks from their threads into its closed event loop: the one line of the RunError or OSError says it
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    hook = sys.unraisablehook  # one_line puts back the hook of before the run when main returns
    sys.unraisablehook = lambda u: "Event loop is closed" in str(u.exc_value) or hook(u)
    devices = seed_devices(args) if args.backend == "jax" and not args.load else None  # before JAX starts
    t_start = time.perf_counter()
    loaded = load_checkpoint(args.load, args) if args.load else None  # a bad checkpoint: one line, before any work
    agent = nnx.jit(lambda: build_agent(args, nnx.Rngs(args.seed)))()  # built in one compiled call (one program)
    graphdef, state = nnx.split(agent)  # the hot loop calls compiled functions of `state`
    act, update = make_step_fns(args, graphdef, nnx.graphdef(agent.q_network))
    if args.load:  # evaluate (with --video, watch) the saved θ, in a run folder under <out>/eval/: latest stays
        run, params = Run(replace(args, out=os.path.join(args.out, "eval"))), loaded
        metrics = dict(**evaluation_metrics(args, act, params), env_steps=0, train_seconds=0.0, loaded_from=args.load)
    else:
        run = Run(args)  # this run's own folder under --out
        # one (last parameters, log) per seed; the first seed's parameters are saved and its curve is plotted
        runs = train_seeds(args, devices) if args.backend == "jax" else [train(args, act, update, state)]
        last_params, log = runs[0]
        best = args.final_agent == "best"
        params, saved_step = (log["best"]["params"], log["best"]["step"]) if best else (last_params, log["env_steps"])
        run.save("q_network", save_checkpoint, params)  # right after training: a stop from here on keeps it
        title = f"DQN on {ENV_ID}, seed {args.seed}" + (f" ({args.backend})" if args.backend == "jax" else "")
        run.save("learning_curve.png", plot_curve, log["curve"], args.solve_threshold, title, saved_step)
        # Final greedy evaluation with a fixed seed, other than the periodic evaluations' seed used to pick `best`.
        metrics = training_metrics(args, act, runs, t_start)
    if args.video:
        run.save("episode.gif", save_video, act, params, args.eval_seed, metrics)
    run.finish({**metrics, "args": asdict(args)})
    print_summary(args, run, metrics)
    return metrics


if __name__ == "__main__":
    use_sequential_xla_scheduler()  # before JAX starts its backend (a tool or test that loads the script calls it)
    main()
