"""Figure of PPO's clipped surrogate: the per-sample objective min(ρA, clip(ρ, 1−ε, 1+ε)A) and where its gradient is
zero, for A = +1 and A = −1, both computed by 3_Pendulum/pendulum.py's own ppo_clip_loss and jax.grad.

    python tools/plot_clip_objective.py                                   # -> runs/clip_objective/clip_objective.png
    python tools/plot_clip_objective.py --out 3_Pendulum/assets           # the README's figure

The course script is imported by path (like tests/conftest.py); the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script  # noqa: E402


def plot_clip_objective(pen, path: str, clip_eps: float = 0.2) -> None:
    """Draw the per-sample clipped objective and its zero-gradient region for A = +1 and A = −1."""
    import jax
    import jax.numpy as jnp
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratio = jnp.linspace(0.0, 2.0, 401)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=100, sharey=True)
    for ax, a in zip(axes, (1.0, -1.0)):

        def objective(log_ratio, a=a):  # −loss of one sample with log π_old = 0
            return -pen.ppo_clip_loss(log_ratio, 0.0, a, clip_eps)

        log_r = jnp.log(jnp.maximum(ratio, 1e-6))
        obj = jax.vmap(objective)(log_r)
        grad = jax.vmap(jax.grad(objective))(log_r)  # d objective / d log π_new
        ax.plot(ratio, ratio * a, color="gray", ls=":", label="unclipped ρ·A")
        ax.plot(ratio, obj, lw=2.5, color="C0", label="min(ρA, clip(ρ, 1−ε, 1+ε)A)")
        flat = np.asarray(grad) == 0.0
        ax.fill_between(ratio, -2.2, 2.2, where=flat, color="C3", alpha=0.12, label="gradient = 0 (clipped)")
        ax.axvline(1 - clip_eps, color="k", lw=0.6, ls="--")
        ax.axvline(1 + clip_eps, color="k", lw=0.6, ls="--")
        ax.set(title=f"A = {a:+.0f}", xlabel="ratio ρ = π_new(a|s) / π_old(a|s)", ylim=(-2.2, 2.2))
        ax.legend(fontsize=8, loc="upper left" if a > 0 else "lower left")
    axes[0].set_ylabel("objective (maximised)")
    fig.suptitle(f"PPO clipped surrogate, ε = {clip_eps}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clip-eps", type=float, default=0.2, help="the clip range ε")
    p.add_argument("--out", default="runs/clip_objective", help="folder for clip_objective.png")
    a = p.parse_args(argv)
    if not 0 < a.clip_eps < 1:
        p.exit(1, f"error: --clip-eps must be in (0, 1), got {a.clip_eps}\n")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({e.strerror})\n")
    path = os.path.join(a.out, "clip_objective.png")
    plot_clip_objective(load_script("3_Pendulum/pendulum.py"), path, a.clip_eps)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
