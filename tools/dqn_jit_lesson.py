"""What the JAX pattern of 2_Cart_Pole_DQN/cart_pole_dqn.py saves, measured with the script's own functions.

Two comparisons, each between two ways of running the same computation (the tool checks that both give the
same numbers):

1. Picking 16 greedy actions, as the training loop does at every step: the script's `act`, a plain `jax.jit`
   over the split parameters (`nnx.split` once, `nnx.merge` inside the compiled function), against
   `nnx.jit` on the module (graph mode, Flax's default), which walks the module graph on every call.
2. 128 gradient steps, as one training call makes them: the script's `update`, one call that runs the 128
   steps in a `jax.lax.scan`, against 128 calls of the same compiled update on one minibatch each.

The two forms of each run interleaved, --rounds times; each number is the minimum over the rounds (the
least-disturbed run; the machine may be busy). The default agent (128 hidden units, batch 64).

    python tools/dqn_jit_lesson.py                       # -> 2_Cart_Pole_DQN/assets/jit_lesson.png
    python tools/dqn_jit_lesson.py --rounds 5 --figure runs/jit_lesson.png

The course script is imported by path; the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script  # noqa: E402


def best_of(rounds: int, forms: dict, repeat: dict) -> dict:
    """Minimum seconds per call of each form over `rounds` interleaved rounds of `repeat[name]` calls."""
    best = {name: float("inf") for name in forms}
    for _ in range(rounds):
        for name, fn in forms.items():
            t = time.perf_counter()
            for _ in range(repeat[name]):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t) / repeat[name])
    return best


def plot(path: Path, act_us: dict, steps_ms: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 2.6))
    for ax, values, unit, title in (
        (axes[0], act_us, "µs per call", "greedy actions for 16 envs"),
        (axes[1], steps_ms, "ms per 128 gradient steps", "a block of 128 gradient steps"),
    ):
        names = list(values)
        bars = ax.barh(names, [values[n] for n in names], color=["tab:blue", "tab:gray"])
        ax.bar_label(bars, fmt="%.0f" if unit.startswith("µs") else "%.1f", padding=3, fontsize=8)
        ax.set(xlabel=unit, title=title)
        ax.set_xlim(0, max(values.values()) * 1.25)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="interleaved rounds; each number is the minimum")
    p.add_argument("--figure", default="2_Cart_Pole_DQN/assets/jit_lesson.png", help="where the PNG goes")
    args = p.parse_args(argv)
    os.chdir(REPO)

    dqn = load_script("2_Cart_Pole_DQN/cart_pole_dqn.py")
    dqn.use_sequential_xla_scheduler()  # as the script's command line does, before JAX starts its backend
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    config = dqn.Args()  # the default agent
    agent = dqn.build_agent(config, nnx.Rngs(config.seed))
    q_network = agent.q_network
    graphdef, state = nnx.split(agent)
    q_graphdef, params = nnx.split(q_network)
    act, update = dqn.make_step_fns(config, graphdef, q_graphdef)

    rng, buffer = np.random.default_rng(0), dqn.ReplayBuffer(10_000, 4)
    buffer.add(
        rng.normal(size=(10_000, 4)).astype(np.float32),
        rng.integers(0, 2, 10_000),
        np.ones(10_000),
        rng.normal(size=(10_000, 4)).astype(np.float32),
        np.zeros(10_000),
        np.zeros(10_000),
    )
    obs = buffer.obs[:16]
    block = buffer.sample(rng, config.batch_size, config.gradient_steps)  # (128, 64, …)
    singles = [jax.tree.map(lambda x, i=i: x[i : i + 1], block) for i in range(config.gradient_steps)]

    # 1. act: the same argmax, compiled two ways
    act_on_module = nnx.jit(lambda model, obs: jnp.argmax(model(obs), axis=-1))
    assert (np.asarray(act(params, obs)) == np.asarray(act_on_module(q_network, obs))).all()

    # 2. 128 gradient steps: one scanned call, or 128 calls of one step each (the same compiled update)
    def scanned():
        new_state, loss = update(state, params, block)
        return jax.block_until_ready(new_state)

    def one_by_one():
        s = state
        for batch in singles:
            s, loss = update(s, params, batch)
        return jax.block_until_ready(s)

    a, b = scanned(), one_by_one()  # also compiles both shapes
    same = all(np.allclose(x, y, rtol=1e-4, atol=1e-5) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert same, "the scanned block and the 128 single steps disagree"

    act_forms = {
        "jax.jit over split state (the script)": lambda: np.asarray(act(params, obs)),
        "nnx.jit on the module": lambda: np.asarray(act_on_module(q_network, obs)),
    }
    step_forms = {"one call, lax.scan (the script)": scanned, "128 calls, one step each": one_by_one}
    act_s = best_of(args.rounds, act_forms, {name: 200 for name in act_forms})
    step_s = best_of(args.rounds, step_forms, {name: 3 for name in step_forms})
    act_us = {name: s * 1e6 for name, s in act_s.items()}
    steps_ms = {name: s * 1e3 for name, s in step_s.items()}

    print(f"minimum over {args.rounds} interleaved rounds; default agent (hidden 128, batch 64)")
    for name, us in act_us.items():
        print(f"act, 16 observations: {name:<40} {us:8.0f} µs per call")
    for name, ms in steps_ms.items():
        print(f"128 gradient steps:   {name:<40} {ms:8.1f} ms")
    (js, nj), (scan, loop) = act_us.values(), steps_ms.values()
    print(f"nnx.jit / jax.jit per act call: {nj / js:.1f}x; 128 single calls / one scanned call: {loop / scan:.1f}x")
    plot(Path(args.figure), act_us, steps_ms)
    print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
