"""Peer: rejax's DQN with rejax's own CartPole-v1 hyperparameters, N seeds in one jax.jit(jax.vmap(train)) call.

Protocol (the same as 2_Cart_Pole_DQN/cart_pole_dqn.py): 50,000 environment steps (--total-timesteps), the
final parameters (no checkpoint picking), then for each seed the mean greedy return (argmax of its Q-values)
over 100 episodes of gymnasium's CartPole-v1 whose initial states come from gymnasium's vectorised reset with
seed 10000. Training runs in gymnax's JAX CartPole, evaluation in gymnasium's: both give the observation as
(cart position, cart velocity, pole angle, pole angular velocity) and push the cart left for action 0 and right
for action 1 (force −10 / +10 N), so the trained network is applied to gymnasium's observations unchanged.
check_same_cartpole() confirms it at every run: from a gymnasium start it steps both environments with the
same actions and exits if their observations or terminations differ. It needs its own venv (run from the
repository root):

    python3 -m venv .venv-rejax && .venv-rejax/bin/pip install -r benchmarks/peers/requirements_rejax.txt
    .venv-rejax/bin/python benchmarks/peers/rejax_dqn_cartpole.py --seeds 200 --num-seeds 16
    .venv-rejax/bin/python benchmarks/peers/rejax_dqn_cartpole.py --seeds 200 --num-seeds 16 --total-timesteps 100000

Seed s trains from jax.random.PRNGKey(s); the keys of seeds s … s+N−1 are stacked and the N runs go through one
compiled call, jax.jit(jax.vmap(algo.train)), as rejax's README shows. metrics.json gets each seed's return
(`eval_return_per_seed`, and `eval_return_mean`, their mean, so that tools/seeds.py can sweep --num-seeds 1),
the seeds at or above 475, the seconds of the compiled call (the first call compiles and runs; --repeat-call
times a second, already compiled, call with the same keys) and of the whole process, and the versions.

Hyperparameters: rejax, configs/gymnax/cartpole.yaml, "dqn" (commit d751095), only total_timesteps changed.
Its eval_freq (2,500) is kept: it is where rejax's train() runs its own evaluation (128 gymnax episodes with
ε = 0.005, from the run's key but without changing the training state), so it costs time and changes no
learning; its last value per seed is kept as `rejax_own_final_eval_return`. With that config, ε decays
linearly from 1 to 0.05 over the first half of total_timesteps, so the schedule scales with the budget.
"""

import time

PROCESS_START = time.perf_counter()  # before the JAX imports below: whole_process_seconds counts them

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from importlib.metadata import version  # noqa: E402

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from gymnax.environments.classic_control.cartpole import EnvState  # noqa: E402
from rejax import DQN  # noqa: E402

# gymnax's Discrete space has dtype jnp.int_ (int64); with x64 off JAX warns at each cast and keeps int32
warnings.filterwarnings("ignore", message="Explicitly requested dtype int64")

# configs/gymnax/cartpole.yaml, "dqn", with total_timesteps set from the command line
REJAX_CARTPOLE_DQN = dict(
    env="CartPole-v1",
    agent="DuelingQNetwork",
    agent_kwargs=dict(activation="swish"),
    num_envs=10,
    buffer_size=50_000,
    fill_buffer=5_000,
    batch_size=100,
    max_grad_norm=10,
    learning_rate=0.001,
    num_epochs=5,
    eval_freq=2_500,
    polyak=0.98,
    eps_start=1,
    eps_end=0.05,
    exploration_fraction=0.5,
    gamma=0.99,
    ddqn=True,
    normalize_observations=False,
)
SOLVED = 475.0


def check_same_cartpole(env, env_params) -> None:
    """Step gymnax's CartPole (rejax's) and gymnasium's from the same start with the same actions; exit if the
    observations (same order) or the terminations differ. Actions 1,1,0,1,0,0,0,1,… until the pole falls."""
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=3)
    state = EnvState(
        time=0, **{k: jnp.float32(v) for k, v in zip(("x", "x_dot", "theta", "theta_dot"), reference.state)}
    )
    for t, action in enumerate([1, 1, 0, 1, 0, 0, 0, 1] * 20):
        obs, state, _, done, _ = env.step_env(jax.random.PRNGKey(0), state, action, env_params)
        want, _, terminated, _, _ = reference.step(action)
        if not np.allclose(np.asarray(obs), want, atol=1e-5) or bool(done) != terminated:
            sys.exit(f"gymnax's CartPole differs from gymnasium's at step {t}: {np.asarray(obs)} vs {want}")
        if terminated:
            return
    sys.exit("check_same_cartpole: the pole never fell, the check compared no termination")


def greedy_returns(algo, params, episodes: int, seed: int) -> np.ndarray:
    """The course's test: `episodes` greedy episodes of gymnasium's CartPole-v1, initial states from its
    vectorised reset with `seed`; each episode's return counts until it terminates or is truncated (500)."""
    act = jax.jit(lambda obs: jnp.argmax(algo.agent.apply(params, obs), axis=-1))
    envs = gym.make_vec("CartPole-v1", num_envs=episodes, vectorization_mode="vector_entry_point")
    obs, _ = envs.reset(seed=seed)
    returns, alive = np.zeros(episodes), np.ones(episodes, bool)
    while alive.any():
        obs, reward, terminated, truncated, _ = envs.step(np.asarray(act(obs)))
        returns += reward * alive
        alive &= ~(terminated | truncated)
    envs.close()
    return returns


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", "--seed", dest="seed", type=int, default=0, help="first seed (also --seed)")
    p.add_argument("--num-seeds", type=int, default=16, help="seeds --seeds … --seeds+N−1, vmapped in one call")
    p.add_argument("--total-timesteps", type=int, default=50_000, help="env steps per seed (rejax's config: 100000)")
    p.add_argument("--eval-episodes", type=int, default=100)
    p.add_argument("--eval-seed", type=int, default=10_000)
    p.add_argument("--repeat-call", action="store_true", help="time a second call of the compiled function")
    p.add_argument("--out", default="runs/peers/rejax_dqn_cartpole")
    args = p.parse_args()
    step = REJAX_CARTPOLE_DQN["eval_freq"]  # train() runs whole chunks of eval_freq steps
    if args.num_seeds < 1 or args.eval_episodes < 1 or args.seed < 0:
        sys.exit("--num-seeds and --eval-episodes must be at least 1, --seeds at least 0")
    if args.total_timesteps < step or args.total_timesteps % step:
        sys.exit(
            f"--total-timesteps must be a positive multiple of rejax's eval_freq ({step}), not {args.total_timesteps}"
        )
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        sys.exit(f"cannot create --out {args.out}: {e.strerror}")

    config = dict(REJAX_CARTPOLE_DQN, total_timesteps=args.total_timesteps)
    algo = DQN.create(**config)
    check_same_cartpole(algo.env, algo.env_params)
    seeds = list(range(args.seed, args.seed + args.num_seeds))
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seeds])
    train = jax.jit(jax.vmap(algo.train))
    print(
        f"rejax DQN on gymnax CartPole-v1: {len(seeds)} seed(s) × {args.total_timesteps} env steps, one call",
        flush=True,
    )

    t0 = time.perf_counter()
    train_state, evaluation = jax.block_until_ready(train(keys))
    first_call_seconds = time.perf_counter() - t0
    second_call_seconds = None
    if args.repeat_call:
        t0 = time.perf_counter()
        again, _ = jax.block_until_ready(train(keys))
        second_call_seconds = time.perf_counter() - t0
        same = jax.tree.all(jax.tree.map(np.array_equal, train_state.q_ts.params, again.q_ts.params))
        print(f"second call: {second_call_seconds:.1f} s, same parameters as the first: {same}", flush=True)
    env_steps = int(train_state.global_step[0])  # every seed runs the same number of steps
    own_final = np.asarray(evaluation[1][:, -1].mean(axis=-1))  # rejax's last evaluation, (seeds,)

    params = jax.device_get(train_state.q_ts.params)
    per_seed = []
    for i, seed in enumerate(seeds):
        returns = greedy_returns(algo, jax.tree.map(lambda x, i=i: x[i], params), args.eval_episodes, args.eval_seed)
        per_seed.append(
            dict(
                seed=seed,
                eval_return_mean=float(returns.mean()),
                eval_return_std=float(returns.std()),
                eval_return_min=float(returns.min()),
                rejax_own_final_eval_return=float(own_final[i]),
            )
        )
        print(f"seed={seed} eval_return_mean={returns.mean():.1f} rejax_own_final_eval={own_final[i]:.1f}", flush=True)

    scores = np.array([row["eval_return_mean"] for row in per_seed])
    k = len(scores) // 4  # the interquartile mean drops the lowest and the highest quarter
    metrics = dict(
        library="rejax",
        seeds=seeds,
        total_timesteps=args.total_timesteps,
        env_steps_per_seed=env_steps,
        eval_return_mean=float(scores.mean()),
        eval_return_per_seed=[float(s) for s in scores],
        solved=int((scores >= SOLVED).sum()),
        solve_threshold=SOLVED,
        across_seeds=dict(
            n=len(scores),
            mean=float(scores.mean()),
            iqm=float(np.sort(scores)[k : len(scores) - k].mean()),
            min=float(scores.min()),
            max=float(scores.max()),
        ),
        per_seed=per_seed,
        first_call_seconds=round(first_call_seconds, 2),
        second_call_seconds=None if second_call_seconds is None else round(second_call_seconds, 2),
        whole_process_seconds=round(time.perf_counter() - PROCESS_START, 2),
        devices=[str(d) for d in jax.devices()],
        versions=dict(
            python=platform.python_version(),
            **{name: version(name) for name in ("jax", "jaxlib", "flax", "rejax", "gymnax", "gymnasium", "numpy")},
        ),
        hyperparameters={key: str(value) for key, value in config.items()},
    )
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    a = metrics["across_seeds"]
    print(
        f"across {a['n']} seeds: mean={a['mean']:.1f} IQM={a['iqm']:.1f} min={a['min']:.1f} max={a['max']:.1f} "
        f"solved(>={SOLVED:g})={metrics['solved']}/{a['n']} first_call_seconds={first_call_seconds:.1f} "
        f"whole_process_seconds={metrics['whole_process_seconds']:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
