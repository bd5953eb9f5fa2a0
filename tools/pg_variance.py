"""How noisy is the policy gradient? REINFORCE's G_t, a learned baseline G_t − V(s_t), and GAE(λ), measured.

At a fixed set of parameters θ (the actor and critic of a PPO run of 3_Pendulum/pendulum.py, --backend jax,
stopped after each of --checkpoints environment steps; one run per seed in --seeds), draw --batches independent
batches of whole episodes (--num-envs pendulums × 200 steps, fresh resets, independent keys) with the stochastic
policy, and compute one policy-gradient estimate per batch,

    ĝ = ∇_θ −mean_t(log π_θ(a_t|s_t) · Ψ_t),   Ψ_t ∈ { G_t,  G_t − V(s_t),  Â_t^GAE(λ) },

with the script's own `signal_and_targets` (Ψ as its `ladder`'s rungs reinforce, reinforce-baseline and ppo compute
it) and `reinforce_loss` (no advantage normalisation, rewards × --reward-scale as in training). Over the K estimates
of each Ψ it reports

    total variance  tr Σ = Σ_i Var_k(ĝ_i)            (the trace of the K×K-sample covariance, ddof = 1)
    signal-to-noise ‖E ĝ‖² / tr Σ                   (how much of one batch's gradient is signal; ‖E ĝ‖² is
                                                     estimated without bias as ‖mean_k ĝ‖² − tr Σ / K)
    cos(mean ĝ, mean ĝ_G)                           (a baseline leaves the expectation alone; GAE does not)
    E Ψ, E Ψ²                                       (over every step of the K batches, in rewards × --reward-scale:
                                                     a Ψ far from 0 on average scales up the noise of ∇ log π)

with 95 % percentile-bootstrap intervals (200 resamples of the K batches) for tr Σ and the SNR, per seed. θ depends
on the seed, so the table and the figure give each statistic's mean over the seeds and its [min, max] across them.

    python tools/pg_variance.py                                  # seeds 0-2; checkpoints 0, 20k, 60k; 1,024 batches
    python tools/pg_variance.py --seeds 0 --checkpoints 20000 --batches 64 --out runs/pg_variance_small

Writes <out>/pg_variance.json (every seed's statistics), <out>/pg_variance.md (the table across seeds, with this
command) and <out>/pg_variance.png (bars: the mean over seeds; whiskers: the seeds' min and max).
The course script is imported by path (like tests/conftest.py); the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script, unwritable  # noqa: E402

ESTIMATORS = ("G_t (REINFORCE)", "G_t − V(s_t) (learned baseline)", "GAE(λ) (A2C / PPO)")
ALGOS = ("reinforce", "reinforce-baseline", "ppo")  # the rung of pendulum.py's ladder whose Ψ each estimator is


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--checkpoints",
        default="0,20000,60000",
        help="PPO training steps (per seed, comma-separated) at which θ is frozen and measured",
    )
    p.add_argument("--batches", type=int, default=1024, help="K: independent batches (gradient estimates) per θ")
    p.add_argument("--num-envs", type=int, default=10, help="pendulums per batch; a batch is num_envs × 200 steps")
    p.add_argument("--seeds", default="0,1,2", help="seeds (comma-separated) of the PPO runs and of their batches")
    p.add_argument("--out", default="runs/pg_variance", help="folder for the json, the table and the PNG")
    a = p.parse_args(argv)
    try:
        a.checkpoint_steps = sorted({int(x) for x in a.checkpoints.split(",")})
        a.seed_list = sorted({int(x) for x in a.seeds.split(",")})
    except ValueError:
        p.exit(1, f"error: --checkpoints and --seeds take integers like 0,1,2, got {a.checkpoints!r}, {a.seeds!r}\n")
    if a.batches < 2 or a.num_envs < 1 or min(a.checkpoint_steps) < 0 or min(a.seed_list) < 0:
        p.exit(1, "error: --batches must be >= 2, --num-envs >= 1, every checkpoint and every seed >= 0\n")
    if why := unwritable(a.out):
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({why})\n")
    return a


def gradient_estimator(pen, args, graphdef, actor_def, batches):
    """A function (state, key) → K = `batches` policy-gradient estimates per Ψ at the parameters in `state`: dict
    name → (K, P) array. Compiled once, for every seed and checkpoint."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    rungs = [pen.ladder(dataclasses.replace(args, algo=algo)) for algo in ALGOS]

    def one_batch(k, state):
        k_env, k_roll = jax.random.split(k)
        env = jax.vmap(pen.pendulum_reset)(jax.random.split(k_env, args.num_envs))
        runner = pen.Runner(
            state=state,
            env=env,
            obs=pen.pendulum_obs(env),
            key=k_roll,
            ep_ret=jnp.zeros(args.num_envs),
            last_ret=jnp.zeros(args.num_envs),
        )
        _, rollout = pen.jax_rollout(actor_def, args, state["actor"], runner)  # (200, N): whole episodes
        agent = nnx.merge(graphdef, state)
        values, next_values = agent.critic(rollout.obs), agent.critic(rollout.next_obs)
        obs, act = rollout.obs.reshape(-1, 3), rollout.actions.reshape(-1, 1)
        out, moments = [], []
        for rung in rungs:
            psi, _ = pen.signal_and_targets(rung, rollout, values, next_values, args.gamma, args.gae_lambda)
            grads = nnx.grad(lambda a, psi=psi: pen.reinforce_loss(a(obs).log_prob(act).sum(-1), psi.reshape(-1)))(
                agent.actor
            )
            out.append(jnp.concatenate([x.ravel() for x in jax.tree.leaves(nnx.state(grads, nnx.Param))]))
            moments.append(jnp.stack([psi.mean(), jnp.mean(psi**2)]))  # E Ψ and E Ψ² over the batch's steps
        return out, moments

    chunk = 64 if batches % 64 == 0 else batches  # vmap 64 batches at a time (a scan over chunks) to bound memory

    def over_chunks(st, ks):  # the state rides along as the scan's carry, so nnx sees it at the scan's trace level
        return jax.lax.scan(lambda c, k: (c, jax.vmap(one_batch, in_axes=(0, None))(k, c)), st, ks)[1]

    compiled = jax.jit(over_chunks)

    def estimates(state, key):
        """({Ψ: (K, P) gradient estimates}, {Ψ: (E Ψ, E Ψ²) over all K batches' steps})."""
        keys = jax.random.split(key, batches).reshape(batches // chunk, chunk)
        grads, moments = compiled(state, keys)
        res = [r.reshape(batches, -1) for r in grads]
        mom = [np.asarray(m, np.float64).reshape(batches, 2).mean(0) for m in moments]
        return (
            {name: np.asarray(r, np.float64) for name, r in zip(ESTIMATORS, res)},
            {name: (float(m[0]), float(m[1])) for name, m in zip(ESTIMATORS, mom)},
        )

    return estimates


def snr_stats(g: np.ndarray) -> tuple[float, float, float]:
    """(tr Σ, unbiased ‖E ĝ‖², SNR) from K estimates g (K, P)."""
    mean = g.mean(0)
    var = float(g.var(0, ddof=1).sum())  # trace of the sample covariance
    signal = float(mean @ mean) - var / len(g)  # unbiased ‖E ĝ‖²: ‖mean‖² alone is inflated by tr Σ / K
    return var, signal, signal / var if var > 0 else float("nan")  # a resample of one repeated batch has tr Σ = 0


def summarise(est: dict, resamples: int = 200) -> dict:
    """Per Ψ: the statistics, and a 95 % percentile-bootstrap interval of each (resampling the K batches)."""
    ref = est[ESTIMATORS[0]].mean(0)
    k = len(est[ESTIMATORS[0]])
    rng = np.random.default_rng(0)
    idx = [rng.integers(0, k, k) for _ in range(resamples)]
    rows = {}
    for name, g in est.items():
        var, signal, snr = snr_stats(g)
        boot = np.array([snr_stats(g[i]) for i in idx])  # (resamples, 3)
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
        mean = g.mean(0)
        rows[name] = dict(
            total_variance=var,
            mean_sq_norm=signal,
            snr=snr,
            total_variance_ci=[float(lo[0]), float(hi[0])],
            snr_ci=[float(lo[2]), float(hi[2])],
            cos_to_reinforce_mean=float(mean @ ref / (np.linalg.norm(mean) * np.linalg.norm(ref))),
        )
    return rows


def across_seeds(per_seed: list[dict]) -> dict:
    """Per Ψ: each statistic's mean over the seeds, and under `<statistic>_range` its [min, max] across them."""
    rows = {}
    for name in ESTIMATORS:
        rows[name] = {}
        for stat in ("total_variance", "mean_sq_norm", "snr", "cos_to_reinforce_mean", "psi_mean", "psi_sq_mean"):
            v = np.array([seed["rows"][name][stat] for seed in per_seed])
            rows[name][stat] = float(v.mean())
            rows[name][stat + "_range"] = [float(v.min()), float(v.max())]
    return rows


def plot(path, results):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["train_steps"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
    width = 0.8 / len(ESTIMATORS)
    for i, name in enumerate(ESTIMATORS):
        x = np.arange(len(steps)) + (i - 1) * width
        for ax, stat in zip(axes, ("total_variance", "snr")):
            mean = np.array([r["rows"][name][stat] for r in results])
            low, high = np.array([r["rows"][name][stat + "_range"] for r in results]).T
            ax.bar(x, mean, width, yerr=[mean - low, high - mean], capsize=3, label=name)
    for ax, title in zip(axes, ("total variance tr Σ of one batch's gradient (log)", "SNR ‖E ĝ‖² / tr Σ (log)")):
        ax.set_xticks(np.arange(len(steps)), [f"θ after {s // 1000}k PPO steps" for s in steps], fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
    axes[1].legend(fontsize=8)
    seeds = len(results[0]["seeds"])
    fig.suptitle(
        f"Policy-gradient estimates on Pendulum-v1, {results[0]['batches']} batches of "
        f"{results[0]['batch_steps']} steps per θ; bars: mean over {seeds} PPO seed{'s' * (seeds > 1)}, "
        "whiskers: min to max",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    a = parse(argv)
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp

    pen = load_script("3_Pendulum/pendulum.py")
    # The PPO run that provides θ: the ladder's batch shape (num_envs × 200 steps), default hyperparameters.
    args = pen.Args(
        backend="jax",
        num_envs=a.num_envs,
        num_steps=200,
        minibatch_size=250,
        total_timesteps=max(max(a.checkpoint_steps), a.num_envs * 200),
    )
    graphdef, actor_def = pen.graph_defs(args)
    estimates = gradient_estimator(pen, args, graphdef, actor_def, a.batches)
    results = []
    keys = {seed: jax.random.key(10_000 + seed) for seed in a.seed_list}  # each seed's batches: one key stream
    for target in a.checkpoint_steps:
        # θ after the first whole rollout at or past `target`, from runs whose schedules span the last checkpoint
        updates = -(-target // args.batch_size)
        train = pen.make_train(args, num_updates=updates)
        init, run = jax.jit(train.init), jax.jit(train.run)
        done_steps = updates * args.batch_size
        per_seed = []
        for seed in a.seed_list:
            runner, _ = run(init(jax.random.key(seed)))
            keys[seed], k = jax.random.split(keys[seed])
            ret = float(np.asarray(jnp.nanmean(runner.last_ret)))
            grads, moments = estimates(runner.state, k)
            rows = summarise(grads)
            for name, (psi_mean, psi_sq_mean) in moments.items():
                rows[name].update(psi_mean=psi_mean, psi_sq_mean=psi_sq_mean)
            per_seed.append(dict(seed=seed, train_return=None if not np.isfinite(ret) else ret, rows=rows))
            print(f"θ after {done_steps} steps, seed {seed} (latest training return {ret:.0f}):", flush=True)
            for name, r in rows.items():
                print(
                    f"  {name:34s} tr Σ={r['total_variance']:.4g}  ‖E ĝ‖²={r['mean_sq_norm']:.4g}  "
                    f"SNR={r['snr']:.4g}  cos(mean, mean_G)={r['cos_to_reinforce_mean']:.3f}  "
                    f"E Ψ={r['psi_mean']:.3g}  E Ψ²={r['psi_sq_mean']:.3g}",
                    flush=True,
                )
        results.append(
            dict(
                train_steps=done_steps,
                batches=a.batches,
                batch_steps=a.num_envs * 200,
                seeds=per_seed,
                rows=across_seeds(per_seed),
            )
        )

    argv = argv if argv is not None else sys.argv[1:]
    cmd = "python tools/pg_variance.py " + " ".join(shlex.quote(x) for x in argv)
    seeds = ", ".join(str(s) for s in a.seed_list)
    lines = [
        f"`{cmd.strip()}`",
        "",
        f"| θ (PPO steps) | Ψ | total variance tr Σ, mean [min, max] over seeds {seeds} | ‖E ĝ‖² (mean) "
        "| SNR ‖E ĝ‖²/tr Σ, mean [min, max] | cos(mean, mean of G_t) (mean) | E Ψ, E Ψ² (mean) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        for name, row in r["rows"].items():
            v, snr = row["total_variance_range"], row["snr_range"]
            lines.append(
                f"| {r['train_steps']:,} | {name} | {row['total_variance']:.3g} [{v[0]:.3g}, {v[1]:.3g}] | "
                f"{row['mean_sq_norm']:.3g} | {row['snr']:.3g} [{snr[0]:.3g}, {snr[1]:.3g}] | "
                f"{row['cos_to_reinforce_mean']:.2f} | {row['psi_mean']:.3g}, {row['psi_sq_mean']:.3g} |"
            )
    Path(a.out, "pg_variance.md").write_text("\n".join(lines) + "\n")
    Path(a.out, "pg_variance.json").write_text(json.dumps(dict(command=cmd.strip(), results=results), indent=1))
    plot(os.path.join(a.out, "pg_variance.png"), results)
    print(
        "\n".join(lines) + f"\n\nwrote {a.out}/pg_variance.{{json,md,png}} in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
