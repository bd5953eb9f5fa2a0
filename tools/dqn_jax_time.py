"""Where the time of a --backend jax run of 2_Cart_Pole_DQN/cart_pole_dqn.py goes, and how close it is to its floor.

1. Counted: the floating-point operations of one Adam step, from the script's Args. A Linear layer of `in` inputs
   and `out` outputs costs 2·in·out per sample forward (a multiply and an add per weight); the backward pass about
   twice the forward (the gradients of the inputs and of the weights); a step also runs the target network forward
   on s', and for Double DQN the online network on s' as well:

       per step = batch · 2·Σ in·out · (1 forward + 2 backward + 1 target + 1 online on s')

   (10.98 MFLOP for the default 4-128-128-2 network and batch 64), times the Adam steps of a seed
   (args.total_gradient_steps), times the seeds. Bias adds, ReLUs, the loss and Adam's own arithmetic (a
   few operations per parameter) are left out: a few per cent more.
2. Measured, in one process, each program compiled without the persistent cache (unless --compile-cache names
   one), on the devices that the script's train_seeds uses (--host-devices, as the script takes it):
   a. the run: the script's own train_seeds, its compile seconds and run seconds, as the script prints them;
   b. its updates alone: the script's own compiled update (make_step_fns, the one the run calls), over the seeds
      as the run does it (over_seeds: vmapped, or unbatched for one seed per device) and split across the same
      devices, the same number of training calls of gradient_steps Adam steps
      each on fixed random minibatches, θ⁻ ← θ after each call (the default run syncs once per training call).
      Nothing else runs, so this is the floor of the run on this machine;
   c. the rest, run − updates: the environments, the replay buffer, ε-greedy and the validation episodes; and,
      measured directly, the run with every training call of its Schedule turned off (its θ stays the untrained
      one, whose validation episodes end early: a lower bound of the rest), and the validation alone, estimated
      as the run's number of evaluations times one at the run's last θ (earlier, less trained θ end sooner);
   d. for reference, one seed's training call alone on one device, as the gymnasium backend calls it: its GFLOP/s,
      and the time all the Adam steps of the run would take at that rate on every device;
   e. with one seed per device, also the same run vmapped over a seed axis of size 1, which over_seeds avoids:
      XLA compiles another program for it, in which some weight gradients come out transposed in memory and
      Adam's elementwise update reads them against that order.
3. Measured as a learner runs it, whole process (`python 2_Cart_Pole_DQN/cart_pole_dqn.py …`, from start to exit):
   the same --backend jax run; for reference, the default gymnasium backend (one seed); and Python's start, the
   script's libraries and the exit alone (`python -c 'import …'`). Each runs in a HOME of its own, as
   tools/time_tests.py runs them: once with the compilation cache empty (cold), then --rounds more times from that
   cache (warm); the rounds alternate between the commands. The warm run of median length is split by its
   metrics.json: compiling, the run (train_seconds − compiling), and the rest: Python's start, the imports,
   building the agent, the final test episodes, the summaries, the files and the exit.

Timings need a quiet machine: another process on the same cores slows every row (the load average is printed at
the start and at the end). The whole processes of 3 run first, before this process starts JAX; then each program
of 2 runs once, after its compilation: a cold start, as a user's first run.

    python tools/dqn_jax_time.py                                 # 16 seeds × 50,000 env steps, a few minutes
    python tools/dqn_jax_time.py --num-seeds 1                   # one seed, as the script runs by default
    python tools/dqn_jax_time.py --num-seeds 2 --total-timesteps 2000 --rounds 1

The course script is imported by path; the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script  # noqa: E402
from time_tests import whole_processes  # noqa: E402

SCRIPT = "2_Cart_Pole_DQN/cart_pole_dqn.py"
REFERENCE_CALLS = 8  # d: training calls of one seed, timed after one that compiles
# 3: the libraries the script imports at its top, and pyplot, which its plot imports
IMPORTS = "import gymnasium, jax, jax.numpy, numpy, optax, flax.nnx, matplotlib.pyplot"


def update_flops(args, obs_dim: int, n_actions: int) -> dict:
    """Floating-point operations of one Adam step of the script's agent (args: its Args), by pass:
    forward, backward, target (Q⁻ on s'), online_next (Q on s', Double DQN only) and their total."""
    h = args.hidden_size
    layers = [(obs_dim, h), (h, h), (h, n_actions)]  # (in, out) of each Linear
    forward = args.batch_size * sum(2 * n_in * n_out for n_in, n_out in layers)
    parts = dict(forward=forward, backward=2 * forward, target=forward, online_next=forward if args.double_dqn else 0)
    return dict(parts, total=sum(parts.values()))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-seeds", type=int, default=16, help="seeds trained together, as the script's --num-seeds")
    p.add_argument("--total-timesteps", type=int, default=50_000, help="environment steps per seed")
    p.add_argument(
        "--host-devices", type=int, default=-1, help="CPU devices the seeds are split across, as the script's flag"
    )
    p.add_argument("--compile-cache", default="", help="JAX's persistent compilation cache ('' none: a cold start)")
    p.add_argument("--rounds", type=int, default=3, help="warm whole-process runs of each command (the median)")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.exit(1, "error: --rounds must be >= 1\n")
    dqn = load_script(SCRIPT)
    args = dqn.Args(
        backend="jax",
        num_seeds=a.num_seeds,
        total_timesteps=a.total_timesteps,
        host_devices=a.host_devices,
        compile_cache=a.compile_cache,
    )
    try:
        dqn.check_flags(args)
    except dqn.RunError as e:
        p.exit(1, f"error: {e}\n")
    if args.total_timesteps % args.num_envs:
        p.exit(1, f"error: --total-timesteps ({args.total_timesteps}) must be a multiple of {args.num_envs} (envs)\n")
    if args.host_devices > 0 and args.num_seeds % args.host_devices:
        p.exit(1, f"error: --host-devices ({args.host_devices}) must divide --num-seeds ({args.num_seeds})\n")
    if args.n_train_calls < 1:
        first = (args.learning_starts // args.train_frequency + 1) * args.train_frequency
        p.exit(1, f"error: --total-timesteps {args.total_timesteps} makes no training call; the first is at {first}\n")
    return p, args, a.rounds


def main(argv=None) -> None:
    p, args, rounds = parse(argv)
    os.chdir(REPO)
    dqn = load_script(SCRIPT)
    load_at_start = os.getloadavg()[0]
    # 3 first, while this process has not started JAX: its whole-process runs have the machine to themselves
    whole = whole_processes(whole_process_commands(args), rounds, SCRIPT)
    dqn.use_sequential_xla_scheduler()  # as the script's command line does, before JAX starts its backend
    import jax
    import jax.numpy as jnp
    from flax import nnx

    if args.compile_cache:
        dqn.use_compile_cache(args.compile_cache)
    else:
        jax.config.update("jax_enable_compilation_cache", False)  # cold, whatever the environment says
    try:
        devices = dqn.seed_devices(args)  # before the first JAX operation
    except dqn.RunError as e:
        p.exit(1, f"error: {e}\n")

    # 1. counted
    flops = update_flops(args, dqn.OBS_DIM, dqn.N_ACTIONS)
    steps = args.total_gradient_steps  # Adam steps of one seed
    total = flops["total"] * steps * args.num_seeds
    h, s = args.hidden_size, args.num_seeds
    print(
        f"one Adam step (batch {args.batch_size}, {dqn.OBS_DIM}-{h}-{h}-{dqn.N_ACTIONS}"
        + f", double DQN {'on' if args.double_dqn else 'off'}): "
        + " + ".join(f"{name} {v / 1e6:.2f}" for name, v in flops.items() if name != "total" and v)
        + f" = {flops['total'] / 1e6:.2f} MFLOP"
    )
    per_step = flops["total"]
    print(
        f"one seed: {steps:,} Adam steps × {per_step / 1e6:.2f} MFLOP = {per_step * steps / 1e9:.1f} GFLOP; "
        f"{s} seed(s): {total / 1e9:,.1f} GFLOP"
    )

    # 2a. the run, as the script makes it (its progress lines are not shown)
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        runs = dqn.train_seeds(args, devices)
    train_seeds_s = time.perf_counter() - t  # also make_train, each seed's init and copying the results back
    log = runs[0][1]
    compile_s, run_s = log["compile_seconds"], log["train_seconds"] - log["compile_seconds"]

    # the same devices and seed axis for the measurements below: fn(one seed's inputs), over the seeds as the run
    mesh = jax.sharding.Mesh(np.array(devices), ("seed",), axis_types=(jax.sharding.AxisType.Auto,))
    by_seed = jax.sharding.PartitionSpec("seed")

    def per_seed(fn, inputs, vmapped=False):
        """Compile jit(shard_map(over_seeds(fn))) for `inputs` (stacked on a leading seed axis), run it once: (out,
        compile seconds, run seconds). vmapped: jax.vmap(fn) even for one seed per device."""
        inputs = jax.device_put(inputs, jax.sharding.NamedSharding(mesh, by_seed))
        seeds_of_a_device = jax.vmap(fn) if vmapped else dqn.over_seeds(fn, args.num_seeds // len(devices))
        sharded = jax.shard_map(seeds_of_a_device, mesh=mesh, in_specs=by_seed, out_specs=by_seed, check_vma=False)
        t = time.perf_counter()
        compiled = jax.jit(sharded).lower(inputs).compile()
        t_compile = time.perf_counter() - t
        t = time.perf_counter()
        out = jax.block_until_ready(compiled(inputs))
        return out, t_compile, time.perf_counter() - t

    def stacked(trees):
        return jax.tree.map(lambda *x: jnp.stack(x), *trees)

    train = dqn.make_train(args)
    init = jax.jit(train.init)
    runners = stacked([init(jax.random.key(seed)) for seed in range(args.seed, args.seed + s)])

    # 2b. the updates alone: the run's update, its training calls, fixed minibatches, a sync after each call
    agent = nnx.eval_shape(lambda: dqn.build_agent(args, nnx.Rngs(0)))
    graphdef, q_graphdef = nnx.graphdef(agent), nnx.graphdef(agent.q_network)
    _, update = dqn.make_step_fns(args, graphdef, q_graphdef)
    n_calls = args.n_train_calls
    assert n_calls == int(train.schedule.train.sum()), "the run's Schedule and args.n_train_calls disagree"
    rng = np.random.default_rng(0)
    shape = (s, args.gradient_steps, args.batch_size)
    batches = dqn.Batch(
        obs=rng.normal(size=(*shape, dqn.OBS_DIM)).astype(np.float32),
        actions=rng.integers(0, dqn.N_ACTIONS, shape).astype(np.int32),
        rewards=np.ones(shape, np.float32),
        next_obs=rng.normal(size=(*shape, dqn.OBS_DIM)).astype(np.float32),
        terminated=(rng.random(shape) < 0.05).astype(np.float32),
        truncated=np.zeros(shape, np.float32),
    )

    def updates_only(inputs):
        def call(carry, _):
            state, target_params = carry
            state, loss = update(state, target_params, inputs["batches"])
            return (state, dqn.sync_target(state["q_network"], target_params, args.tau)), loss

        (state, _), losses = jax.lax.scan(call, (inputs["state"], inputs["target"]), None, length=n_calls)
        return state["q_network"], losses

    inputs = dict(state=runners.state, target=runners.target_params, batches=batches)
    _, updates_compile_s, updates_s = per_seed(updates_only, inputs)

    # 2c. the run with its training calls off; then the validation episodes alone, at the run's last θ
    off = train.schedule._replace(train=np.zeros_like(train.schedule.train))
    _, off_compile_s, off_s = per_seed(lambda runner: jax.lax.scan(train.step, runner, off), runners)
    n_evals = int(train.schedule.evaluate.sum())
    last_params = stacked([params for params, _ in runs])
    returns, _, one_eval_s = per_seed(train.validation_returns, last_params)
    validation_s = n_evals * one_eval_s

    # 2d. one seed's training call on one device, as the gymnasium backend calls it
    state, target = jax.tree.map(lambda x: x[0], (runners.state, runners.target_params))
    one_seed_batches = jax.tree.map(lambda x: x[0], batches)
    state, _ = jax.block_until_ready(update(state, target, one_seed_batches))  # compiles
    t = time.perf_counter()
    for _ in range(REFERENCE_CALLS):
        state, _ = update(state, target, one_seed_batches)
    jax.block_until_ready(state)
    reference_s = time.perf_counter() - t
    reference_flop = REFERENCE_CALLS * args.gradient_steps * flops["total"]
    reference_rate = reference_flop / reference_s

    # 2e. one seed per device: the same run vmapped over a seed axis of size 1, which over_seeds avoids
    one_per_device = s == len(devices)
    if one_per_device:
        _, _, vmapped_s = per_seed(train.run, runners, vmapped=True)

    def row(part, seconds, share=True, flop=None):
        share_text = f"{100 * seconds / run_s:.0f} %" if share else "—"
        rate = f"{flop / seconds / 1e9:.1f}" if flop else "—"
        return f"| {part} | {seconds:.2f} | {share_text} | {rate} |"

    d = len(devices)
    how = "vmapped" if s > d else "one per device"
    rest_s = run_s - updates_s
    lines = [
        f"{s} seed(s) × {args.total_timesteps:,} env steps on {d} device(s); each program compiled "
        + ("from --compile-cache" if args.compile_cache else "without a persistent cache")
        + " and run once",
        "",
        "| part | seconds | share of the run | GFLOP/s (Adam steps) |",
        "| --- | --- | --- | --- |",
        row("compiling the run (train_seeds)", compile_s, share=False),
        row(f"the run: {s} seed(s) {how}, {n_calls} training calls each", run_s, flop=total),
        row(f"its updates alone: {s} × {steps:,} Adam steps (the floor)", updates_s, flop=total),
        row("the rest: run − updates", rest_s),
        row("the run with its training calls off (untrained θ)", off_s),
        row(f"its validation alone: {n_evals} × one at the last θ", validation_s),
        row(f"one seed's training call, 1 device ({REFERENCE_CALLS} calls)", reference_s, False, reference_flop),
        *([row("the run vmapped over a seed axis of size 1", vmapped_s, flop=total)] if one_per_device else []),
        "",
        f"run / floor = {run_s / updates_s:.2f}; compile + run = {compile_s + run_s:.1f} s "
        f"(compiling is {100 * compile_s / (compile_s + run_s):.0f} % of it); train_seeds from call to return "
        f"{train_seeds_s:.1f} s (with make_train, each seed's init, the copy back)",
        f"at one seed's rate on every device: {total / 1e9:,.1f} GFLOP / ({reference_rate / 1e9:.1f} GFLOP/s × {d}) "
        f"= {total / reference_rate / d:.1f} s; run / that = {run_s / (total / reference_rate / d):.2f}",
        f"compiling the measurements: updates {updates_compile_s:.1f} s, training calls off {off_compile_s:.1f} s; "
        f"longest validation episode at the last θ: {int(np.max(returns))} steps",
        f"load average (1 min): {load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
        f"({os.cpu_count()} cores)",
    ]
    print("\n".join(lines), flush=True)

    # 3. whole processes, measured first
    print(
        f"\nwhole process, start to exit, of {SCRIPT} with the flags below: cold = its first run, from an empty "
        f"compilation cache; warm = the median of {rounds} runs from that cache (the rounds alternate between the "
        "commands), the one of median length split by its metrics.json",
        "",
        "| command | cold | warm | warm runs | compiling | the run | the rest |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        sep="\n",
    )
    for name, (cold, warm) in whole.items():
        seconds, m = sorted(warm, key=lambda run: run[0])[(len(warm) - 1) // 2]  # the median run (the lower of two)
        if m is None:  # no training: the whole process is start, imports and exit
            parts = f"— | — | {seconds:.1f}"
        else:
            compile_s = m.get("compile_seconds", 0.0)  # the gymnasium backend compiles inside its loop: in the run
            parts = f"{compile_s:.1f} | {m['train_seconds'] - compile_s:.1f} | {seconds - m['train_seconds']:.1f}"
        print(
            f"| {name} | {cold[0][0]:.1f} | {seconds:.1f} | {' '.join(f'{w:.1f}' for w, _ in warm)} | {parts} |",
            flush=True,
        )


def whole_process_commands(args) -> dict:
    """name -> the arguments after `python`: the --backend jax run, the gymnasium backend, the imports alone."""
    jax_flags = ["--backend", "jax", "--num-seeds", str(args.num_seeds), "--host-devices", str(args.host_devices)]
    return {
        f"--backend jax --num-seeds {args.num_seeds}": [
            SCRIPT,
            *jax_flags,
            "--total-timesteps",
            str(args.total_timesteps),
        ],
        "gymnasium (the default, one seed)": [SCRIPT, "--total-timesteps", str(args.total_timesteps)],
        "its libraries alone: python -c 'import …'": ["-c", IMPORTS],
    }


if __name__ == "__main__":
    main()
