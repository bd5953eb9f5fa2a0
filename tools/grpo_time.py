"""Where the time of a 4_GRPO_MNIST/grpo_mnist.py run goes, and how close its training is to its floor.

1. Counted: the floating-point operations of one RL iteration, one SFT step and one validation score, from the
   script's Args, and of the whole run. A Linear layer of `in` inputs and `out` outputs costs 2·in·out per row
   forward (a multiply and an add per weight). The policy's layers (`Policy`): the encoder on every image slot
   (784 → H), the prompt's share of the decoder's first layer once per prompt (N·H → D, `Policy.encode`), and per
   answer position the tokens' share of that layer (a lookup of N rows of D, summed under the causal mask: 2·N·D)
   and the head (D → VOCAB). Sampling computes one position per step; a log-prob pass every position of every
   answer. Backward: the weights' gradient of every layer (as much as its forward) and the inputs' gradient where
   an input depends on the weights (the prompt's features, the head's input, the looked-up rows); the images need
   none. ReLUs, the softmax, the losses and Adam's own arithmetic (a few operations per number) are left out.

       RL iteration = sampling (encode B prompts, N steps of S = B·G rows) + π_old log-probs (S·N rows)
                      + π_ref log-probs (β > 0: encode B, S·N rows) + μ × (forward + backward of encode B, S·N rows)
       SFT step     = one sampled answer per prompt (for the `reward` it logs) + forward and backward on B targets
       a score      = encode P prompts, greedy (N rows of P), n samples each (N rows of P·n),
                      the exact KL: the policy and π_ref on every position (2 × P·n·N rows, π_ref's encode)

2. Measured in one process, with a compilation cache of its own (empty at the start):
   a. the run: the script's own `train()` (as `main` calls it, on its mesh), once to compile (cold), then again
      from the cache it filled (warm), as a learner's second run. In the warm call every call of a compiled
      program (`jax.jit` of `train_block` or `evaluate`) is timed to its last output: the SFT and RL blocks, the
      validation scores, each program's first call beyond the median of its others (tracing, lowering and loading
      it from the cache), and the rest (Python between blocks, the keys, the progress lines);
   b. the floor: the same work stripped to its essentials, at the same shapes: a plain-JAX copy of the policy (a
      dict of its arrays; checked against `Policy` on the same weights) runs each phase's blocks as one
      `lax.scan`: RL = sampling N steps, the π_old and π_ref log-probs, μ × (forward, backward, Adam) on a simple
      surrogate; SFT = forward, backward and Adam on cross-entropy. No verifier, advantages, clip, KL estimator,
      masks, aggregation, metrics, prompt draws or NNX. Fixed random images. training / floor is the ratio the
      script is judged by;
   c. the run's RL split into the script's own pieces: `rollout_groups` alone (sampling, verifying, advantages,
      π_old and π_ref) and the μ updates alone (`grpo_update`'s steps on fixed rollouts), each as one block.
3. Measured as a learner runs it, whole process (`python 4_GRPO_MNIST/grpo_mnist.py …`, from start to exit): the
   default run, `--task digit` at its settings, and Python's start with the script's libraries alone. Each in a
   HOME of its own (tools/time_tests.py's `timed`): once with the compilation cache empty (cold), then --rounds
   more times from that cache (warm), the rounds alternating between the commands; the warm run of median length
   is split by its metrics.json (train_seconds: SFT, RL and validation) and the rest (start, imports, data, the
   test score, the figure and the files).

Timings need a quiet machine: the load average is printed at the start and at the end. Part 3 runs first, before
this process starts JAX, and --rounds 0 leaves it out.

    python tools/grpo_time.py                       # the default --task number run
    python tools/grpo_time.py --rounds 0 -- --task digit --beta 0.1 --kl exact
    python tools/capture.py grpo_time -- python tools/grpo_time.py

Flags after -- go to the script for parts 1 and 2 (part 3 always times the two commands above).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script  # noqa: E402
from time_tests import whole_processes  # noqa: E402

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
DIGIT = ["--task", "digit", "--beta", "0.1", "--kl", "exact"]
# 3: the libraries the script imports at its top, and pyplot, which its figure imports
IMPORTS = (
    "import jax, jax.numpy, numpy, optax, flax.nnx, matplotlib.pyplot; import tensorflow_probability.substrates.jax"
)


# ---------------------------------------------------------------------------------------------------- 1. counted
class Counts:
    """FLOPs of the policy's passes, from the script's Args and N (the answer's positions)."""

    def __init__(self, args, n_slots: int, vocab: int):
        self.N, self.H, self.D, self.V = n_slots, args.hidden_size, args.decoder_size, vocab

    def encode(self, prompts: int) -> int:
        """Forward: the encoder on every slot, then the prompt's share of the decoder's first layer."""
        return 2 * prompts * self.N * 784 * self.H + 2 * prompts * self.N * self.H * self.D

    def rows(self, rows: int) -> int:
        """Forward of `rows` answer positions: the tokens' share (the masked sum of N looked-up rows), the head."""
        return 2 * rows * self.N * self.D + 2 * rows * self.D * self.V

    def encode_backward(self, prompts: int) -> int:
        """The encoder's weight gradient (no image gradient); the share's weight and feature gradients."""
        return 2 * prompts * self.N * 784 * self.H + 2 * 2 * prompts * self.N * self.H * self.D

    def rows_backward(self, rows: int) -> int:
        """The looked-up rows' gradient through the masked sum; the head's weight and input gradients."""
        return 2 * rows * self.N * self.D + 2 * 2 * rows * self.D * self.V


def iteration_flops(args, c: Counts) -> dict:
    """One RL iteration, by part."""
    B, S, N, mu = args.batch_size, args.batch_size * args.group_size, c.N, args.inner_steps
    return {
        "sampling": c.encode(B) + N * c.rows(S),
        "π_old log-probs": c.rows(S * N),
        "π_ref log-probs": c.encode(B) + c.rows(S * N) if args.beta > 0 else 0,
        "μ forward": mu * (c.encode(B) + c.rows(S * N)),
        "μ backward": mu * (c.encode_backward(B) + c.rows_backward(B * args.group_size * N)),
    }


def sft_flops(args, c: Counts) -> dict:
    """One SFT step, by part: the one answer sampled per prompt for the `reward` it logs, then the update."""
    B, N = args.batch_size, c.N
    return {
        "sampling (logged reward)": c.encode(B) + N * c.rows(B),
        "forward": c.encode(B) + c.rows(B * N),
        "backward": c.encode_backward(B) + c.rows_backward(B * N),
    }


def score_flops(prompts: int, n: int, c: Counts) -> int:
    """One validation or test score of `prompts` prompts, n samples each."""
    N = c.N
    return (
        c.encode(prompts)
        + N * c.rows(prompts)
        + N * c.rows(prompts * n)
        + 2 * c.rows(prompts * n * N)
        + c.encode(prompts)
    )


# ---------------------------------------------------------------------------------------------------- 2b. the floor
def floor_programs(g, args, n_slots: int):
    """The essentials of each phase at the script's shapes, as plain JAX on a dict of the policy's arrays.
    Returns (to_params, logits, tx, rl_block, sft_block)."""
    import jax
    import jax.numpy as jnp
    import optax

    G, N, V = args.group_size, n_slots, g.VOCAB
    F, mu, beta = n_slots * args.hidden_size, args.inner_steps, args.beta
    tx = optax.adam(args.learning_rate)

    def to_params(policy) -> dict:
        return {
            "We": policy.encoder.kernel[...],
            "be": policy.encoder.bias[...],
            "Wd": policy.decoder.kernel[...],
            "bd": policy.decoder.bias[...],
            "Wh": policy.head.kernel[...],
            "bh": policy.head.bias[...],
        }

    def encode(p, images, slots):
        h = jax.nn.relu(images @ p["We"] + p["be"]) * slots[..., None]
        return h.reshape(len(images), -1) @ p["Wd"][:F]

    def logits(p, share, tokens, at):
        rows = p["Wd"][F : F + N * V].reshape(N, V, -1)[jnp.arange(N), tokens]  # (S, N, D)
        before = jnp.tril(jnp.ones((N, N)), k=-1)[at]
        h = share[:, None] + jnp.einsum("rs,bsd->brd", before, rows) + p["Wd"][F + N * V :][at] + p["bd"]
        return jax.nn.relu(h) @ p["Wh"] + p["bh"]

    def log_probs(p, share, tokens):
        all_positions = jax.nn.log_softmax(logits(p, share, tokens, jnp.arange(N)))
        return jnp.take_along_axis(all_positions, tokens[..., None], axis=-1)[..., 0]

    def sample(p, share, key):
        def step(tokens, inputs):
            t, k = inputs
            row = logits(p, share, tokens, t[None])[:, 0]
            return tokens.at[:, t].set(jax.random.categorical(k, row)), None

        start = jnp.full((len(share), N), g.EOS)
        return jax.lax.scan(step, start, (jnp.arange(N), jax.random.split(key, N)))[0]

    def rl_block(p, opt, ref, images, slots, adv, keys):
        def iteration(carry, key):
            p, opt = carry
            share = jnp.repeat(encode(p, images, slots), G, axis=0)
            tokens = sample(p, share, key)
            old = log_probs(p, share, tokens)
            ref_lp = log_probs(ref, jnp.repeat(encode(ref, images, slots), G, axis=0), tokens) if beta > 0 else 0.0

            def loss(p):
                lp = log_probs(p, jnp.repeat(encode(p, images, slots), G, axis=0), tokens)
                return -jnp.mean(jnp.exp(lp - old) * adv) + beta * jnp.mean(lp - ref_lp)

            for _ in range(mu):
                updates, opt = tx.update(jax.grad(loss)(p), opt, p)
                p = optax.apply_updates(p, updates)
            return (p, opt), None

        return jax.lax.scan(iteration, (p, opt), keys)[0]

    def sft_block(p, opt, images, slots, targets, keys):
        def step(carry, _):
            p, opt = carry
            loss = lambda p: -jnp.mean(log_probs(p, encode(p, images, slots), targets))  # noqa: E731
            updates, opt = tx.update(jax.grad(loss)(p), opt, p)
            return (optax.apply_updates(p, updates), opt), None

        return jax.lax.scan(step, (p, opt), keys)[0]

    return to_params, logits, tx, rl_block, sft_block


# ---------------------------------------------------------------------------------------------------- helpers
def seconds_of(fn, *inputs, repeats: int = 3):
    """Compile fn (jax.jit) for inputs, run it once untimed, then `repeats` times: (compile seconds, the median
    run's seconds)."""
    import jax

    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*inputs).compile()
    compile_s = time.perf_counter() - t
    jax.block_until_ready(compiled(*inputs))
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        runs.append(time.perf_counter() - t)
    return compile_s, statistics.median(runs)


def parse(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="Flags after -- go to the script.")
    p.add_argument(
        "--rounds", type=int, default=3, help="warm whole-process runs of each command (the median); 0: none"
    )
    a = p.parse_args(ours)
    if a.rounds < 0:
        p.exit(1, "error: --rounds must be >= 0\n")
    for f in ("--out", "--load", "--host-devices", "--compile-cache", "--objective"):
        if any(x == f or x.startswith(f + "=") for x in flags):
            p.exit(1, f"error: {f} after --: this tool times the one-device GRPO run that it sets up itself\n")
    g = load_script(SCRIPT)
    try:
        args = g.parse_args(flags)
    except SystemExit as e:  # the script's own one-line error for a bad flag
        p.exit(1, f"{e.code}\n")
    return args, flags, a.rounds


def main(argv=None) -> None:
    args, flags, rounds = parse(argv)
    os.chdir(REPO)
    load_at_start = os.getloadavg()[0]
    whole = (
        whole_processes(whole_process_commands(), rounds, SCRIPT) if rounds else {}
    )  # 3 first: no JAX in this process yet

    g = load_script(SCRIPT)
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    cache = tempfile.TemporaryDirectory(prefix="grpo_time_cache_")
    g.use_compile_cache(cache.name)  # empty: the first train() compiles, the second reads what it wrote
    with tempfile.TemporaryDirectory(prefix="grpo_time_out_") as out:
        args = replace(args, out=out, compile_cache=cache.name)
        try:
            g.validate(args)
        except g.RunError as e:  # the script's own one-line error for a flag out of bounds
            sys.exit(f"error: {e}")
    mesh = g.make_mesh(args, g.start_devices(args))
    data = g.load_data(args)
    n_slots, n = g.slots_for(args), args.eval_samples
    sft_steps = g.sft_steps_for(args)
    blocks = math.ceil(sft_steps / args.eval_every) + math.ceil(args.iterations / args.eval_every)
    n_scores = 1 + blocks

    # 1. counted
    c = Counts(args, n_slots, g.VOCAB)
    rl, sft = iteration_flops(args, c), sft_flops(args, c)
    val = score_flops(len(data.y_val), n, c)
    test = score_flops(len(data.y_test), n, c)
    run_flops = {
        f"SFT: {sft_steps} steps": sft_steps * sum(sft.values()),
        f"RL: {args.iterations} iterations": args.iterations * sum(rl.values()),
        f"validation: {n_scores} scores of {len(data.y_val)} prompts × {n}": n_scores * val,
        f"test: one score of {len(data.y_test)} prompts × {n}": test,
    }
    print(f"run: {g.run_label(args)}, batch {args.batch_size}, H {args.hidden_size}, D {args.decoder_size}")
    print(
        "one RL iteration: "
        + " + ".join(f"{name} {v / 1e6:,.1f}" for name, v in rl.items() if v)
        + f" = {sum(rl.values()) / 1e6:,.1f} MFLOP"
    )
    print(
        "one SFT step: "
        + " + ".join(f"{name} {v / 1e6:,.1f}" for name, v in sft.items())
        + f" = {sum(sft.values()) / 1e6:,.1f} MFLOP"
    )
    print(f"one validation score: {val / 1e9:,.2f} GFLOP")
    print(
        "the whole run: "
        + " + ".join(f"{name} {v / 1e9:,.1f}" for name, v in run_flops.items())
        + f" = {sum(run_flops.values()) / 1e9:,.1f} GFLOP"
    )

    # 2a. the run: train() twice, cold then warm
    calls: dict[str, list[float]] = {}  # the warm train()'s compiled calls, each waited for: name -> seconds

    def timing_jit(fn, **options):
        """jax.jit that records how long each call of the compiled function takes, to its last output."""
        compiled, name = jit(fn, **options), getattr(fn, "func", fn).__name__  # partial(train_block, …), evaluate

        def call(*inputs):
            t = time.perf_counter()
            out = jax.block_until_ready(compiled(*inputs))
            calls.setdefault(name, []).append(time.perf_counter() - t)
            return out

        return call

    def run_train(timed: bool):
        jax.jit = timing_jit if timed else jit
        t = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), jax.set_mesh(mesh):
                history = g.train(args, data)[2]
        finally:
            jax.jit = jit
        return time.perf_counter() - t, history

    jit = jax.jit
    cold_s, _ = run_train(timed=False)
    warm_s, history = run_train(timed=True)

    def steady(seconds: list[float]) -> tuple[float, float]:
        """(the calls' seconds with the first counted as the median of the others, the first's excess): the
        first call of a program also traces, lowers and loads it from the cache."""
        if len(seconds) < 2:
            return sum(seconds), 0.0
        excess = seconds[0] - statistics.median(seconds[1:])
        return sum(seconds) - excess, excess

    phases = {}  # the blocks' seconds by phase, in order
    for row in history[1:]:
        phases.setdefault(row["phase"], []).append(calls["train_block"].pop(0))
    assert len(calls["evaluate"]) == n_scores and not calls["train_block"], "train() called other programs"
    (sft_blocks, sft_extra), (rl_blocks, rl_extra) = steady(phases.get("sft", [])), steady(phases.get("rl", []))
    validation_s, validation_extra = steady(calls["evaluate"])
    tracing_s = sft_extra + rl_extra + validation_extra
    rest_s = warm_s - sft_blocks - rl_blocks - validation_s - tracing_s

    # 2b. the floor, on the run's initial weights
    to_params, logits, tx, rl_block, sft_block = floor_programs(g, args, n_slots)
    initial = g.Policy(n_slots, args.hidden_size, args.decoder_size, rngs=nnx.Rngs(g.run_keys(args.seed).init))
    params = to_params(initial)
    rng = np.random.default_rng(0)
    images = jnp.asarray(rng.random((args.batch_size, n_slots, 784), np.float32))
    slots = jnp.asarray((np.arange(n_slots) < rng.integers(1, n_slots + 1, (args.batch_size, 1))).astype(np.float32))
    images = images * slots[..., None]
    tokens = jnp.asarray(rng.integers(0, g.VOCAB, (args.batch_size, n_slots)))
    share = initial.encode(images, slots)
    same = np.abs(np.asarray(initial(share, tokens)) - np.asarray(logits(params, share, tokens, jnp.arange(n_slots))))
    assert same.max() < 1e-4, f"the floor's policy differs from the script's: {same.max()}"
    adv = jnp.asarray(rng.normal(size=(args.batch_size * args.group_size, 1)), jnp.float32)
    opt = tx.init(params)
    floor = {}
    for phase, count in (("sft", sft_steps), ("rl", args.iterations)):
        sizes = [min(args.eval_every, count - i) for i in range(0, count, args.eval_every)]
        for size in sorted(set(sizes)):
            keys = jax.random.split(jax.random.key(1), size)
            if phase == "rl":
                _, s = seconds_of(rl_block, params, opt, params, images, slots, adv, keys)
            else:
                _, s = seconds_of(sft_block, params, opt, images, slots, tokens, keys)
            floor[phase] = floor.get(phase, 0.0) + s * sizes.count(size)

    # 2c. the script's RL pieces, one block of eval_every iterations each
    optimizer = nnx.Optimizer(initial, optax.adam(args.learning_rate), wrt=nnx.Param)
    (graphdef, train_state), policy_def = nnx.split(g.TrainState(initial, optimizer)), nnx.graphdef(initial)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    block = min(args.eval_every, args.iterations)
    keys = jax.random.split(jax.random.key(3), block)

    def rollouts_alone(state, ref_state, keys):
        def one(_, key):
            strips = g.make_strips(x, y, *g.draw_prompts(key, len(y), args.batch_size, n_slots))
            policy, reference = nnx.merge(policy_def, state), nnx.merge(policy_def, ref_state)
            rollout, metrics = g.rollout_groups(policy, reference, strips, key, args)
            return None, (rollout, strips)

        return jax.lax.scan(one, None, keys)[1]

    with jax.set_mesh(mesh):
        _, rollouts_s = seconds_of(rollouts_alone, train_state["policy"], train_state["policy"], keys)
        rollouts, batches = jax.jit(rollouts_alone)(train_state["policy"], train_state["policy"], keys)

        def updates_alone(state, rollouts, batches):
            def one(state, inputs):
                rollout, strips = inputs
                policy, optimizer = nnx.merge(graphdef, state)
                grad_fn = nnx.value_and_grad(g.grpo_loss, has_aux=True)
                for _ in range(args.inner_steps):
                    (_, aux), grads = grad_fn(policy, strips, rollout, args)
                    optimizer.update(policy, grads)
                return nnx.state(g.TrainState(policy, optimizer)), aux["loss"]

            return jax.lax.scan(one, state, (rollouts, batches))

        _, updates_s = seconds_of(updates_alone, train_state, rollouts, batches)

    # the table
    training_s = rl_blocks + sft_blocks
    floor_training = floor.get("rl", 0.0) + floor.get("sft", 0.0)
    rl_flop, sft_flop = args.iterations * sum(rl.values()), sft_steps * sum(sft.values())

    def row(part, seconds, flop=None, share=True):
        rate = f"{flop / seconds / 1e9:.1f}" if flop else "—"
        return f"| {part} | {seconds:.2f} | {f'{100 * seconds / warm_s:.0f} %' if share else '—'} | {rate} |"

    n_rl, n_sft = len(phases.get("rl", [])), len(phases.get("sft", []))
    lines = [
        "",
        f"one process, {len(jax.devices())} {jax.devices()[0].platform} device(s); train() as main calls it, "
        "with a compilation cache of its own: cold (it compiles), then warm (it reads that cache)",
        "",
        "| part | seconds | share of the warm train() | GFLOP/s |",
        "| --- | --- | --- | --- |",
        row("train(), cold: compiling every program, then the same work", cold_s, share=False),
        row("train(), warm: SFT, RL and validation (its train_seconds)", warm_s),
        row(f"  SFT: {n_sft} block(s), {sft_steps} steps", sft_blocks, sft_flop),
        row(f"  RL: {n_rl} block(s), {args.iterations} iterations", rl_blocks, rl_flop),
        row(f"  validation: {n_scores} scores", validation_s, n_scores * val),
        row("  tracing, lowering, loading: each program's first call beyond its others", tracing_s),
        row("  the rest: Python between blocks, keys, progress lines", rest_s),
        row(
            f"floor: SFT, {sft_steps} steps (forward, backward, Adam)",
            floor.get("sft", 0.0),
            sft_steps * (sum(sft.values()) - sft["sampling (logged reward)"]),
        ),
        row(f"floor: RL, {args.iterations} iterations", floor.get("rl", 0.0), rl_flop),
        row(
            f"the script's RL pieces, one block of {block}: rollout_groups alone",
            rollouts_s,
            block * (rl["sampling"] + rl["π_old log-probs"] + rl["π_ref log-probs"]),
            share=False,
        ),
        row(
            f"the script's RL pieces, one block of {block}: the μ updates alone",
            updates_s,
            block * (rl["μ forward"] + rl["μ backward"]),
            share=False,
        ),
        "",
        f"training (SFT + RL blocks) / floor = {training_s:.2f} / {floor_training:.2f} = "
        f"{training_s / floor_training:.2f} (RL alone {rl_blocks / floor['rl']:.2f}); with the first blocks' "
        f"tracing and loading: {(training_s + sft_extra + rl_extra) / floor_training:.2f}",
        f"compiling: cold − warm train() = {cold_s - warm_s:.1f} s",
        f"load average (1 min): {load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
        f"({os.cpu_count()} cores)",
    ]
    print("\n".join(lines), flush=True)
    cache.cleanup()

    if whole:
        print(
            f"\nwhole process, start to exit, of {SCRIPT}: cold = its first run, from an empty compilation cache; "
            f"warm = the median of {rounds} runs from that cache (the rounds alternate between the commands), the "
            "one of median length split by its metrics.json",
            "",
            "| command | cold | warm | warm runs | train_seconds | the rest |",
            "| --- | --- | --- | --- | --- | --- |",
            sep="\n",
        )
        for name, (cold, warm) in whole.items():
            seconds, m = sorted(warm, key=lambda r: r[0])[(len(warm) - 1) // 2]
            parts = "— | —" if m is None else f"{m['train_seconds']:.1f} | {seconds - m['train_seconds']:.1f}"
            runs = " ".join(f"{w:.1f}" for w, _ in warm)
            print(f"| {name} | {cold[0][0]:.1f} | {seconds:.1f} | {runs} | {parts} |", flush=True)


def whole_process_commands() -> dict:
    """name -> the arguments after `python`."""
    return {
        "the default (--task number)": [SCRIPT],
        "--task digit at its settings": [SCRIPT, *DIGIT],
        "its libraries alone: python -c 'import …'": ["-c", IMPORTS],
    }


if __name__ == "__main__":
    main()
