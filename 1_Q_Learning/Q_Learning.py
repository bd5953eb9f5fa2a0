"""Tabular Q-learning on a 4x4 grid world or FrozenLake, checked against value iteration.

The agent fills a table Q[s, a] from its own experience with the TD update
    Q(s, a) <- Q(s, a) + alpha * (r + gamma * max_a' Q(s', a') * (1 - terminated) - Q(s, a)),
acting epsilon-greedily; epsilon and alpha decay linearly. The environment's model is known here, so the learned
greedy policy is scored exactly: is it optimal (value iteration), and how often does it reach the goal within the
step limit, next to the best a table indexed by state can do and the best a policy that also reads the clock can do.
NumPy only.

The file reads in the order a run goes: Args; the environments and their model as arrays; the Q-table update
(ε-greedy action, TD target, one episode); the training loop; then the exact reference and the evaluation that the
loop calls every few episodes and after the last (value iteration, policy evaluation, the success within the step
limit), and the final policy's rollouts. Below the `# Plumbing` banner: the command line, input checks, printing,
the learning curve, metrics.json (in the run's own folder) and main.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from operator import ge, gt, le
from pathlib import Path
from typing import NamedTuple

if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load waits for main(), which reports it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
import numpy as np

ENVS = ("grid", "frozenlake")
ARROWS = "←↓→↑"  # action 0 = left, 1 = down, 2 = right, 3 = up (FrozenLake's order)


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag, with the bounds check_flags tests."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: NumPy's Generator (exploration, tie-breaks) and the env resets", min=0)
    env: str = flag("grid", "'grid' (deterministic 4x4, -1 per step, +100 at the goal) or 'frozenlake'", choices=ENVS)
    slippery: bool = flag(
        False, "FrozenLake only: slippery ice (the intended move with probability 1/3, each side 1/3)"
    )
    episodes: int = flag(0, "training episodes; 0 = the environment's default (grid 100, FrozenLake 10,000)", min=0)
    max_steps: int = flag(100, "episode step limit; reaching it truncates the episode (not a terminal state)", min=1)
    alpha: float = flag(0.1, "learning rate α in (0, 1] at the first episode", gt=0.0, max=1.0)
    alpha_end: float = flag(0.0, "α at the last episode, linear from --alpha (= --alpha: constant)", min=0.0, max=1.0)
    gamma: float = flag(0.99, "discount factor γ in [0, 1]", min=0.0, max=1.0)
    eps_start: float = flag(1.0, "ε at the first episode", min=0.0, max=1.0)
    eps_end: float = flag(0.05, "ε after the decay", min=0.0, max=1.0)
    eps_decay: float = flag(0.5, "fraction of the episodes over which ε falls linearly to --eps-end", min=0.0, max=1.0)
    evals: int = flag(20, "exact greedy-policy evaluations (and progress lines) during training", min=1)
    eval_episodes: int = flag(10_000, "rollouts of the final greedy policy (the grid is deterministic: 1)", min=1)
    out: str = flag("runs/q_learning", "each run's own folder goes in here; latest -> the last complete one")


# ------------------------------------------------------------------------------------------------
# Environments. Both speak gymnasium's API (reset -> (s, info); step -> (s', r, terminated,
# truncated, info)) and expose their model as gymnasium's table P[s][a] = [(p, s', r, terminated)].


class GridWorld:
    """Deterministic 4x4 grid. Start 0 (top-left), goal 15 (bottom-right); a move into a wall stays put.

    Reward: +100 for the step that enters the goal (which ends the episode), -1 for every other
    step. The shortest path takes 6 steps, so the best return is 5 * (-1) + 100 = 95.
    """

    size, start, goal = 4, 0, 15
    step_reward, goal_reward = -1.0, 100.0
    desc = np.array(["SFFF", "FFFF", "FFFF", "FFFG"], dtype="c")  # the map, row by row, as FrozenLake's desc

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.P = {s: {a: [(1.0, *self._move(s, a))] for a in range(4)} for s in range(16)}
        self.unwrapped = self  # as on a gymnasium env, env.unwrapped holds the model P and the map desc

    def _move(self, s: int, a: int) -> tuple[int, float, bool]:
        row, col = divmod(s, self.size)
        dr, dc = ((0, -1), (1, 0), (0, 1), (-1, 0))[a]
        row, col = min(max(row + dr, 0), self.size - 1), min(max(col + dc, 0), self.size - 1)
        s2 = row * self.size + col
        return (s2, self.goal_reward, True) if s2 == self.goal else (s2, self.step_reward, False)

    def reset(self, seed: int | None = None):
        self.s, self.t = self.start, 0
        return self.s, {}

    def step(self, a: int):
        self.t += 1
        self.s, r, terminated = self._move(self.s, a)
        return self.s, r, terminated, self.t >= self.max_steps and not terminated, {}


def make_env(args: Args):
    """The training env: our GridWorld, or gymnasium's FrozenLake-v1 with a TimeLimit of --max-steps."""
    if args.env == "grid":
        return GridWorld(args.max_steps)
    import gymnasium as gym  # imported only here: the grid needs nothing but NumPy

    return gym.make("FrozenLake-v1", map_name="4x4", is_slippery=args.slippery, max_episode_steps=args.max_steps)


@dataclass
class Model:
    """The MDP as arrays, built from P. Terminal transitions do not bootstrap, so they are left out of p_cont."""

    p_cont: np.ndarray  # (S, A, S): P(s' | s, a) summed over non-terminal transitions
    reward: np.ndarray  # (S, A):    E[r | s, a]
    p_goal: np.ndarray  # (S, A):    P(the step ends the episode at the goal | s, a)
    start: int


def env_model(env) -> Model:
    P = env.unwrapped.P  # the known model, P[s][a] = [(p, s', r, terminated), ...]; the start is state 0
    goal = int(np.flatnonzero(env.unwrapped.desc.flatten() == b"G")[0])  # the 'G' of the map
    n_s, n_a = len(P), len(P[0])
    p_cont, reward, p_goal = np.zeros((n_s, n_a, n_s)), np.zeros((n_s, n_a)), np.zeros((n_s, n_a))
    for s in range(n_s):
        if s == goal:
            continue  # the episode is over: no reward, no successor
        for a in range(n_a):
            for p, s2, r, terminated in P[s][a]:
                reward[s, a] += p * r
                if terminated:
                    p_goal[s, a] += p * (s2 == goal)
                else:
                    p_cont[s, a, s2] += p
    return Model(p_cont, reward, p_goal, 0)


# ------------------------------------------------------------------------------------------------
# Q-learning: act ε-greedily, then move Q(s, a) towards the TD target


def n_episodes(args: Args) -> int:
    """The number of training episodes: --episodes, or the environment's default when it is 0."""
    return args.episodes or {"grid": 100, "frozenlake": 10_000}[args.env]


def epsilon_at(episode: int, args: Args) -> float:
    """Linear decay: ε goes from eps_start at episode 0 to eps_end at episode eps_decay·episodes, then stays."""
    decay_episodes = args.eps_decay * n_episodes(args)
    if decay_episodes <= 0:
        return args.eps_end
    frac = min(episode / decay_episodes, 1.0)
    return args.eps_start + frac * (args.eps_end - args.eps_start)


def alpha_at(episode: int, args: Args) -> float:
    """Linear decay over the whole run: α_e = α + (α_end − α) · e / episodes; late, noisy updates move Q less."""
    return args.alpha + (args.alpha_end - args.alpha) * episode / n_episodes(args)


def epsilon_greedy(q_row: np.ndarray, eps: float, rng: np.random.Generator) -> int:
    """With probability ε a uniform random action, otherwise an action of highest Q (ties broken at random)."""
    if rng.random() < eps:
        return int(rng.integers(len(q_row)))
    best = np.flatnonzero(q_row == q_row.max())
    return int(best[0] if len(best) == 1 else rng.choice(best))


def td_target(reward: float, next_q_row: np.ndarray, gamma: float, terminated: bool) -> float:
    """y = r + γ · max_a' Q(s', a') · (1 − terminated). A time-limit cut is not terminated: it still bootstraps."""
    return reward + gamma * float(next_q_row.max()) * (1.0 - float(terminated))


def q_update(
    q: np.ndarray, s: int, a: int, reward: float, s2: int, terminated: bool, alpha: float, gamma: float
) -> float:
    """One Q-learning step, in place: δ = y − Q(s, a);  Q(s, a) ← Q(s, a) + α·δ. Returns the TD error δ."""
    td_error = td_target(reward, q[s2], gamma, terminated) - q[s, a]
    q[s, a] += alpha * td_error
    return td_error


def run_episode(
    env, q: np.ndarray, eps: float, alpha: float, gamma: float, rng: np.random.Generator
) -> tuple[float, int]:
    """One training episode, updating q after every step; returns (undiscounted return, steps)."""
    s, _ = env.reset()
    ret, steps, done = 0.0, 0, False
    while not done:
        a = epsilon_greedy(q[s], eps, rng)
        s2, r, terminated, truncated, _ = env.step(a)
        q_update(q, s, a, r, s2, terminated, alpha, gamma)
        ret, steps = ret + r, steps + 1
        s, done = s2, terminated or truncated
    return ret, steps


# ------------------------------------------------------------------------------------------------
# The training loop


class TrainLog(NamedTuple):
    """What the training loop records."""

    returns: list[float]  # undiscounted return of every training episode (ε-greedy)
    evals: list[Evaluation]  # --evals exact evaluations of the greedy policy
    env_steps: int
    train_seconds: float  # the training episodes only, not the evaluations


def train(env, model: Model, reference: Reference, args: Args, rng: np.random.Generator) -> tuple[np.ndarray, TrainLog]:
    """Q-learning from a zero table for n_episodes(args) episodes. Every episodes/--evals episodes the greedy
    policy is evaluated exactly (evaluate_greedy, below) and one progress line is printed.
    Returns the Q-table (S, A) and the log."""
    q = np.zeros((model.reward.shape[0], 4))
    episodes = n_episodes(args)
    eval_every = max(1, episodes // args.evals)
    returns, evals = [], []
    train_seconds, env_steps = 0.0, 0
    for episode in range(episodes):
        t0 = time.perf_counter()
        eps, alpha = epsilon_at(episode, args), alpha_at(episode, args)
        ret, steps = run_episode(env, q, eps, alpha, args.gamma, rng)
        train_seconds += time.perf_counter() - t0
        returns.append(ret)
        env_steps += steps
        if (episode + 1) % eval_every == 0 or episode + 1 == episodes:
            evals.append(evaluate_greedy(model, q, reference, episode + 1, args))
            recent = float(np.mean(returns[-eval_every:]))
            sps = env_steps / max(train_seconds, 1e-9)
            print(
                f"episode={episode + 1} return={recent:.2f} eps={eps:.3f} alpha={alpha:.4f} "
                f"greedy_success={evals[-1].success:.4f} optimal={evals[-1].optimal} steps={env_steps} "
                f"sps={sps:.0f}",
                flush=True,
            )
    return q, TrainLog(returns, evals, env_steps, train_seconds)


# ------------------------------------------------------------------------------------------------
# The exact reference (value iteration and policy evaluation on the known model) and the evaluation


def value_iteration(model: Model, gamma: float, tol: float = 1e-10, max_iters: int = 100_000):
    """Q*(s, a) = E[r | s, a] + γ · Σ_s' p_cont(s' | s, a) · max_a' Q*(s', a'). Returns (V*, Q*)."""
    v = np.zeros(model.reward.shape[0])
    for _ in range(max_iters):
        q = model.reward + gamma * model.p_cont @ v  # (S, A)
        v_new = q.max(axis=1)
        if np.abs(v_new - v).max() < tol:
            return v_new, q
        v = v_new
    return v, q


def policy_value(model: Model, policy: np.ndarray, gamma: float, tol: float = 1e-10, max_iters: int = 100_000):
    """V^π(s) = E[r | s, π(s)] + γ · Σ_s' p_cont(s' | s, π(s)) · V^π(s'): discounted value of a fixed policy."""
    idx = np.arange(len(policy))
    r_pi, p_pi = model.reward[idx, policy], model.p_cont[idx, policy]  # (S,), (S, S)
    if gamma < 1:
        return np.linalg.solve(np.eye(len(policy)) - gamma * p_pi, r_pi)
    v = np.zeros(len(policy))  # γ = 1: iterate; a policy that loops forever drifts away from V* and is caught
    for _ in range(max_iters):
        v_new = r_pi + p_pi @ v
        if np.abs(v_new - v).max() < tol:
            break
        v = v_new
    return v_new


def horizon_values(model: Model, horizon: int, policy: np.ndarray | None = None):
    """Undiscounted expected return and success probability within `horizon` steps, by backward induction.

    With policy=None the best achievable by a policy that may change its action with the steps left:
        V_k(s) = max_a [E[r | s, a] + Σ_s' p_cont(s' | s, a) · V_{k−1}(s')],  V_0 = 0.
    Success uses the same recursion with r replaced by p_goal. Returns (return V_H, success G_H), each (S,).
    """
    n_s = model.reward.shape[0]
    idx = np.arange(n_s)
    v, g = np.zeros(n_s), np.zeros(n_s)
    for _ in range(horizon):
        qv = model.reward + model.p_cont @ v  # (S, A)
        qg = model.p_goal + model.p_cont @ g
        if policy is None:
            v, g = qv.max(axis=1), qg.max(axis=1)
        else:
            v, g = qv[idx, policy], qg[idx, policy]
    return v, g


def greedy_policy(q: np.ndarray) -> np.ndarray:
    """π(s) = argmax_a Q(s, a) (the first of tied actions, so the policy is deterministic)."""
    return q.argmax(axis=1)


def best_stationary_policy(model: Model, horizon: int) -> np.ndarray:
    """The policy a Q-table should reach: the best policy of the form π(s), blind to the clock, for success within
    `horizon` steps, by local search. Start from value iteration's policies at γ = 1 (the most likely to reach the
    goal at all) and at γ = 0.99 (which breaks γ = 1's ties, such as bumping into a wall, towards arriving sooner);
    switch one state's action at a time while that raises the success from the start; keep the better result.
    A local search can stop short of the best, so its success is a lower bound; tools/q_stationary_optimum.py scores
    every policy of this form on the slippery map and finds none better at 100 steps (or 30)."""
    found = []
    for gamma in (1.0, 0.99):
        policy = greedy_policy(value_iteration(model, gamma)[1])
        success = horizon_values(model, horizon, policy)[1][model.start]
        improved = True
        while improved:
            improved = False
            for s, a in np.ndindex(model.reward.shape):
                trial = policy.copy()
                trial[s] = a
                trial_success = horizon_values(model, horizon, trial)[1][model.start]
                if trial_success > success + 1e-12:
                    policy, success, improved = trial, trial_success, True
        found.append((success, policy))
    return max(found, key=lambda pair: pair[0])[1]


class Reference(NamedTuple):
    """The exact answers for one MDP, computed once from its model."""

    v_star: np.ndarray  # (S,):   V*(s) under the discount γ the agent learns with
    q_star: np.ndarray  # (S, A): Q*(s, a), same γ
    optimal_policy: np.ndarray  # (S,): best_stationary_policy, the one a greedy Q-table policy can reach
    optimal_return: float  # its undiscounted return within --max-steps steps, from the start
    optimal_success: float  # its P(reach the goal within --max-steps steps), from the start
    time_dependent_success: float  # the best P(…) of any policy, even one that reads the steps left


def solve_reference(model: Model, args: Args) -> Reference:
    """Value iteration under --gamma; the best stationary policy's exact return and success within --max-steps;
    and the best success within --max-steps of a policy that may also read the clock (backward induction)."""
    v_star, q_star = value_iteration(model, args.gamma)
    policy = best_stationary_policy(model, args.max_steps)
    optimal_return, optimal_success = (x[model.start] for x in horizon_values(model, args.max_steps, policy))
    time_dependent = horizon_values(model, args.max_steps)[1][model.start]
    return Reference(v_star, q_star, policy, float(optimal_return), float(optimal_success), float(time_dependent))


def is_optimal(model: Model, policy: np.ndarray, v_star: np.ndarray, gamma: float) -> tuple[bool, float]:
    """Is V^π(start) = V*(start) under the discount the agent learns with? Returns (optimal, V* − V^π at start)."""
    gap = float(v_star[model.start] - policy_value(model, policy, gamma)[model.start])
    gap = max(gap, 0.0)  # V^π ≤ V*; a tiny negative gap is value iteration's stopping tolerance
    return gap <= 1e-6 * (1.0 + abs(float(v_star[model.start]))), gap


class Evaluation(NamedTuple):
    """The greedy policy of the Q-table, scored exactly from the model (so free of sampling noise)."""

    episode: int  # training episodes done
    policy: np.ndarray  # (S,): argmax_a Q(s, a)
    exact_return: float  # undiscounted return within --max-steps steps, from the start
    success: float  # P(reach the goal within --max-steps steps) from the start
    optimal: bool  # V^π(start) = V*(start), see is_optimal
    value_gap: float  # V*(start) − V^π(start) ≥ 0


def evaluate_greedy(model: Model, q: np.ndarray, reference: Reference, episode: int, args: Args) -> Evaluation:
    """Score the greedy policy of q exactly from the model. train calls it every few episodes and after the last one,
    so the last evaluation scores the final table."""
    policy = greedy_policy(q)
    exact_return, success = (float(x[model.start]) for x in horizon_values(model, args.max_steps, policy))
    return Evaluation(episode, policy, exact_return, success, *is_optimal(model, policy, reference.v_star, args.gamma))


def evaluate_final(env, policy: np.ndarray, args: Args) -> tuple[float, float, int]:
    """The final greedy policy in the real env, next to its exact numbers: --eval-episodes episodes, or one on the grid
    (a deterministic env and policy: one is exact). Returns (mean return, success rate, episodes)."""
    episodes = 1 if args.env == "grid" else args.eval_episodes
    total, wins = 0.0, 0
    for _ in range(episodes):
        s, _ = env.reset()
        done = False
        while not done:
            s, r, terminated, truncated, _ = env.step(int(policy[s]))
            total += r
            done = terminated or truncated
        wins += bool(terminated and r > 0)
    return total / episodes, wins / episodes, episodes


# Plumbing: the command line, input checks, printing, the learning curve, metrics.json and main ------------------------


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
    """Raise RunError on a flag outside its bounds, or one that does not fit the others."""
    check_flags(args)
    if args.slippery and args.env != "frozenlake":  # the grid is deterministic: there is no ice to slip on
        raise RunError("--slippery applies only to --env frozenlake")


def env_name(args: Args) -> str:
    """The run's environment as metrics.json and the summary name it: 'grid', 'frozenlake' or 'frozenlake-slippery'."""
    return args.env + ("-slippery" if args.slippery else "")


def grid_text(env, q: np.ndarray, title: str) -> str:
    """The 4x4 board of a Q-table: the greedy arrow in each state and max_a Q(s, a) under it; H = hole, G = goal."""
    tiles = env.unwrapped.desc.astype(str).flatten()  # 'S' start, 'F' free, 'H' hole, 'G' goal
    cells = [f"{t if t in 'HG' else ARROWS[a]} {v:7.2f}" for t, a, v in zip(tiles, greedy_policy(q), q.max(axis=1))]
    return "\n".join([title] + ["  ".join(cells[row : row + 4]) for row in range(0, 16, 4)])


def plot_curve(path: str, log: TrainLog, reference: Reference, args: Args) -> None:
    """Two panels: the return of every training episode (with a running mean) and the greedy success rate, next to
    the best stationary policy's and, where it is higher, the best of a policy that reads the clock."""
    from matplotlib.figure import Figure  # drawn straight into a file: no window, no pyplot

    fig = Figure(figsize=(11, 4), layout="tight")
    ax1, ax2 = fig.subplots(1, 2)
    x, w = np.arange(1, len(log.returns) + 1), max(1, len(log.returns) // 20)
    if len(x) <= 2000:  # beyond that the raw returns are a solid band; the running mean says it all
        ax1.plot(x, log.returns, lw=0.6, alpha=0.4, label="episode return")
    mean = np.convolve(log.returns, np.ones(w) / w, "valid")
    ax1.plot(x[w - 1 :], mean, lw=1.8, label=f"mean of the last {w} episodes")
    stationary, clock = {"color": "k", "ls": "--", "lw": 1}, {"color": "tab:red", "ls": ":", "lw": 1}
    ax1.axhline(reference.optimal_return, **stationary, label=f"best stationary policy {reference.optimal_return:.4g}")
    ax1.set(xlabel="episode", ylabel="return (ε-greedy, while training)", title="Return per episode")
    ax1.legend(loc="best")

    episodes, success = [e.episode for e in log.evals], [e.success for e in log.evals]
    low, high = reference.optimal_success, reference.time_dependent_success
    ax2.plot(episodes, success, marker="o", ms=3, label="greedy policy (exact)")
    ax2.axhline(low, **stationary, label=f"best stationary policy {low:.4f}")
    if high > low + 5e-5:  # a policy gains by reading the clock; at this scale the gap is thinner than the lines
        ax2.axhline(high, **clock, label=f"best if the policy reads the clock {high:.4f}")
    ax2.set(xlabel="episode", ylabel="P(reach goal within step limit)", ylim=(-0.03, 1.03))
    ax2.set_title("Greedy success rate during training")
    ax2.legend(loc="best")
    fig.suptitle(f"Q-learning on {env_name(args)}, seed {args.seed}")
    fig.savefig(path, dpi=110)


def collect_metrics(args: Args, reference: Reference, log: TrainLog, rollouts: tuple[float, float, int]) -> dict:
    """The numbers metrics.json records and the summary prints (main adds the run's flags under 'args'). The last of
    log.evals scored the final table exactly; `rollouts` is evaluate_final's sample of it in the real env."""
    final = log.evals[-1]
    stayed = [e.episode for k, e in enumerate(log.evals) if all(later.optimal for later in log.evals[k:])]
    return {
        "env": env_name(args),
        "episodes": len(log.returns),
        "env_steps": log.env_steps,
        "train_seconds": log.train_seconds,
        "optimal_return": reference.optimal_return,
        "optimal_success_rate": reference.optimal_success,
        "time_dependent_success_rate": reference.time_dependent_success,
        "greedy_return": rollouts[0],
        "greedy_success_rate": rollouts[1],
        "eval_episodes": rollouts[2],
        "greedy_return_exact": final.exact_return,
        "greedy_success_rate_exact": final.success,
        "success_gap": reference.optimal_success - final.success,
        "policy_is_optimal": final.optimal,
        "value_gap": final.value_gap,
        "episodes_to_optimal": stayed[0] if stayed else None,  # the first evaluation after which it stayed optimal
    }


@one_line
def main(args: Args) -> dict:
    validate(args)  # flag values, before any work
    run = Run(args)  # this run's own folder under --out
    rng = np.random.default_rng(args.seed)
    env = make_env(args)
    env.reset(seed=args.seed)  # seeds FrozenLake's slipping; later resets continue that stream
    model = env_model(env)
    reference = solve_reference(model, args)  # the exact answers, computed once from the model
    print(
        f"q-learning env={env_name(args)} episodes={n_episodes(args)} alpha={args.alpha}->{args.alpha_end} "
        f"gamma={args.gamma} optimal_return={reference.optimal_return:.4f} "
        f"optimal_success={reference.optimal_success:.4f} time_dependent_success={reference.time_dependent_success:.4f}"
    )

    q, log = train(env, model, reference, args, rng)
    run.save("learning_curve.png", plot_curve, log, reference, args)

    rollouts = evaluate_final(env, log.evals[-1].policy, args)
    m = collect_metrics(args, reference, log, rollouts)
    run.finish({**m, "args": asdict(args)})
    print(grid_text(env, q, "\nlearned greedy policy and max_a Q(s, a):"))
    print(grid_text(env, reference.q_star, f"\nvalue iteration (γ={args.gamma}): π* and V*(s):"))  # V* = max_a Q*
    n = m["eval_episodes"]
    print(
        f"\nsummary: env={m['env']} greedy_return={m['greedy_return']:.4f} optimal_return={m['optimal_return']:.4f} "
        f"greedy_success_rate={m['greedy_success_rate']:.4f} "
        f"(over {n} episode{'s' * (n > 1)}; exact {m['greedy_success_rate_exact']:.4f}) "
        f"optimal_success_rate={m['optimal_success_rate']:.4f} success_gap={m['success_gap']:.4f}"
    )
    print(
        f"summary: policy_is_optimal={m['policy_is_optimal']} value_gap={m['value_gap']:.3g} "
        f"episodes_to_optimal={m['episodes_to_optimal']} train_seconds={m['train_seconds']:.3f} "
        f"env_steps={m['env_steps']}"
    )
    print(f"outputs: {run.folder} (metrics.json, learning_curve.png)", flush=True)
    return m


if __name__ == "__main__":
    main()
