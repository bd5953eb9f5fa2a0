"""What `--adv-norm none` (Dr. GRPO's advantage, A = r − mean without the std) changes in GRPO's gradient.

Two runs of 4_GRPO_MNIST/grpo_mnist.py, `--task number`, seed 0, the script's defaults except `--adv-norm`: std
(the default) and none; both with a KL term, `--beta 0.01 --kl k3` (this tool's --beta, --kl), since the default
has none (β = 0). Then, on each run's final policy and its π_ref, and on the same fixed rollouts (--batches batches
of the default B prompts × G answers from the training images, sampled from that policy), the gradient at
θ = θ_old (the first inner step: every ratio is 1) of the two parts of grpo_loss, computed under both advantages:

    surrogate   −aggregate(min(ρA, clip(ρ)A))   (grpo_loss with β = 0)
    KL term     β·aggregate(KL)                 (grpo_loss minus its β = 0 part; the same under both advantages)

and the ratio ‖∇ KL term‖ / ‖∇ surrogate‖ (global L2 norms over every weight). Adam divides each weight's step by
the root of its own running mean square gradient, so rescaling the whole loss leaves the step as it was; what
moves the step is the share of each part. The groups: how many of each count of right answers k (1 … G−1; the
all-equal ones have A = 0 under both), each one's std √(k/G·(1 − k/G)), and the share of Σ|A| that the lopsided
groups (k = 1 or G − 1) carry under each advantage.

    python tools/grpo_adv_norm.py                      # both runs at the defaults (minutes)
    python tools/grpo_adv_norm.py --iterations 300     # shorter runs

No test digit is read. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script  # noqa: E402

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
NORMS = ("std", "none")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=0, help="RL iterations of both runs (0: the script's default)")
    p.add_argument("--batches", type=int, default=8, help="rollouts (B prompts × G answers each) to measure on")
    p.add_argument("--seed", type=int, default=0, help="the runs' --seed")
    p.add_argument("--beta", type=float, default=0.01, help="the runs' --beta: a KL term to compare (> 0)")
    p.add_argument("--kl", choices=("exact", "k1", "k3"), default="k3", help="the runs' --kl")
    a = p.parse_args(argv)
    if a.iterations < 0 or a.batches < 1 or a.beta <= 0:
        p.exit(1, "error: --iterations must be >= 0, --batches >= 1 and --beta > 0\n")
    return a


def global_norm(tree) -> float:
    import jax
    import jax.numpy as jnp

    return float(jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in jax.tree.leaves(tree))))


def loss_parts_gradients(g, policy, strips, rollout, config):
    """∇ of the surrogate part (β = 0) and of the β·KL part of grpo_loss, as flat vectors, at the policy given."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    def flat_grad(cfg):
        grads = nnx.grad(lambda p: g.grpo_loss(p, strips, rollout, cfg)[0])(policy)
        return jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree.leaves(grads)])

    surrogate = flat_grad(replace(config, beta=0.0))
    return surrogate, flat_grad(config) - surrogate


def measure(g, args, policy, reference, data, batches: int, seed: int) -> dict:
    """Gradient norms and group statistics on `batches` fixed rollouts sampled from `policy`."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    n_slots = g.slots_for(args)
    rollout_fn = nnx.jit(g.rollout_groups, static_argnums=4)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    norms = {norm: {"surrogate": [], "kl": []} for norm in NORMS}
    counts, abs_adv = np.zeros(args.group_size + 1, int), {norm: [0.0, 0.0] for norm in NORMS}  # [lopsided, all]
    for b in range(batches):
        draw_key, sample_key = jax.random.split(jax.random.fold_in(jax.random.key(seed), 1000 + b))
        strips = g.make_strips(x, y, *g.draw_prompts(draw_key, len(y), args.batch_size, n_slots))
        for norm in NORMS:
            config = replace(args, adv_norm=norm)
            rollout, _ = rollout_fn(policy, reference, strips, sample_key, config)  # same key: the same answers
            surrogate, kl = loss_parts_gradients(g, policy, strips, rollout, config)
            norms[norm]["surrogate"].append(float(jnp.linalg.norm(surrogate)))
            norms[norm]["kl"].append(float(jnp.linalg.norm(kl)))
            adv = np.asarray(rollout.adv).reshape(-1, args.group_size)
            right = np.asarray(g.verify(rollout.tokens, jnp.repeat(strips.target, args.group_size, axis=0)))
            k = right.reshape(-1, args.group_size).sum(axis=1).astype(int)
            lopsided = (k == 1) | (k == args.group_size - 1)
            abs_adv[norm][0] += float(np.abs(adv[lopsided]).sum())
            abs_adv[norm][1] += float(np.abs(adv).sum())
            if norm == NORMS[0]:
                np.add.at(counts, k, 1)
    return {"norms": norms, "counts": counts, "abs_adv": abs_adv}


def report(label: str, run: dict, m: dict, group_size: int) -> dict:
    """Print one run's measurements; return the row of the summary table."""
    import numpy as np

    last = [h for h in run["history"] if h["phase"] == "rl"][-1]
    print(
        f"\nrun {label}: end of RL, validation pass@1 {last['val_pass1']:.4f}, kl_ref {last['val_kl_ref']:.3f}; "
        f"last block: clip_frac {last['clip_frac']:.4f}, outside_frac {last['outside_frac']:.4f}, "
        f"zero_signal {last['zero_signal']:.4f}"
    )
    print("  gradients at θ_old on the fixed rollouts of this policy (mean over the batches):")
    print("  advantage            ‖∇ surrogate‖   ‖∇ β·KL‖   ‖∇ β·KL‖ / ‖∇ surrogate‖")
    ratios = {}
    for norm in NORMS:
        s, kl = np.mean(m["norms"][norm]["surrogate"]), np.mean(m["norms"][norm]["kl"])
        ratios[norm] = np.mean(np.asarray(m["norms"][norm]["kl"]) / np.asarray(m["norms"][norm]["surrogate"]))
        name = "std (GRPO)" if norm == "std" else "none (Dr. GRPO)"
        print(f"  {name:<20} {s:13.5f} {kl:10.5f} {ratios[norm]:12.3f}")
    s_std, s_none = (np.mean(m["norms"][n]["surrogate"]) for n in NORMS)
    print(
        f"  none / std: the surrogate's gradient × {s_none / s_std:.3f}, the KL term's × "
        f"{np.mean(m['norms']['none']['kl']) / np.mean(m['norms']['std']['kl']):.3f}, "
        f"the KL term's share × {ratios['none'] / ratios['std']:.2f}"
    )
    counts, total = m["counts"], int(m["counts"].sum())
    mixed = counts[1:group_size].sum()
    stds = [np.sqrt(k / group_size * (1 - k / group_size)) for k in range(1, group_size)]
    print(f"  groups: {total}; all equal {total - mixed}; with signal {mixed}, by right answers k (std):")
    print("  " + "  ".join(f"k={k}: {counts[k]} ({s:.2f})" for k, s in zip(range(1, group_size), stds, strict=True)))
    shares = {n: m["abs_adv"][n][0] / max(m["abs_adv"][n][1], 1e-12) for n in NORMS}
    print(
        f"  lopsided groups (k = 1 or {group_size - 1}): {counts[1] + counts[group_size - 1]} of {mixed} with signal; "
        f"their share of Σ|A|: std {shares['std']:.3f}, none {shares['none']:.3f}"
    )
    cells = [ratios["std"], ratios["none"], ratios["none"] / ratios["std"], s_none / s_std, shares["std"]]
    cells += [shares["none"], last["val_pass1"], last["val_kl_ref"], last["clip_frac"], last["outside_frac"]]
    return {"label": label, "cells": [*cells, last["zero_signal"]]}


SUMMARY = (
    ("KL share std", ".3f"),
    ("none", ".3f"),
    ("× share", ".2f"),
    ("× surrogate", ".3f"),
    ("lopsided std", ".3f"),
    ("none", ".3f"),
    ("val pass@1", ".4f"),
    ("kl_ref", ".3f"),
    ("clip_frac", ".4f"),
    ("outside_frac", ".4f"),
    ("zero_signal", ".4f"),
)


def print_summary(rows: list[dict]) -> None:
    """The last lines: per run, the KL term's share ‖∇ β·KL‖ / ‖∇ surrogate‖ under std and none and their quotient,
    the surrogate's gradient none / std, the lopsided groups' share of Σ|A| under std and none; then the end of
    that run's RL (validation, and the last block's clip_frac, outside_frac and zero_signal)."""
    print("\nsummary: each run's final policy under both advantages, then the end of that run")
    print(f"{'run':<18}" + "".join(f"{name:>14}" for name, _ in SUMMARY))
    for row in rows:
        print(f"{row['label']:<18}" + "".join(f"{v:>14{fmt}}" for v, (_, fmt) in zip(row["cells"], SUMMARY)))


def main(argv=None) -> None:
    a = parse(argv)
    g = load_script(SCRIPT)
    import jax

    g.use_compile_cache(g.Args().compile_cache)
    shorter = {"iterations": a.iterations} if a.iterations else {}
    base = g.Args(task="number", seed=a.seed, score_test=False, beta=a.beta, kl=a.kl, **shorter)
    data = g.load_data(base)._replace(x_test=None, y_test=None)  # no test digit is read
    print(
        f"--task number, seed {a.seed}, the script's defaults except --adv-norm and the KL term: G={base.group_size}, "
        f"μ={base.inner_steps}, β={base.beta}, kl {base.kl}, {base.loss_agg}, learning rate {base.learning_rate}, "
        f"{base.iterations} RL iterations; {a.batches} rollouts of {base.batch_size} prompts × {base.group_size} "
        "answers per measured policy"
    )
    rows = []
    for norm in NORMS:
        args = replace(base, adv_norm=norm)
        with jax.set_mesh(g.make_mesh(args, jax.devices())):
            with contextlib.redirect_stdout(io.StringIO()):  # train()'s progress lines are not this tool's output
                policy, reference, history, _ = g.train(args, data)
            m = measure(g, args, policy, reference, data, a.batches, a.seed)
        rows.append(report(f"--adv-norm {norm}", {"history": history}, m, args.group_size))
    print_summary(rows)


if __name__ == "__main__":
    main()
