"""What GRPO's policy π(·|x) looks like: the ten answer probabilities on a few held-out test digits.

Loads trained actors from runs of 4_GRPO_MNIST/grpo_mnist.py (each run's actor.npz, and the flags it was
trained with from the metrics.json beside it), rebuilds the frozen reference π_ref (the initial actor: the
same seed gives the same initial weights), and draws one column per test digit:

    row 1        the digit;
    row 2        π_ref(·|x), the frozen initial actor the KL term pulls towards;
    rows 3, …    π_θ(·|x) of each given run, the right digit's bar in colour.

The digits are the first --digits images of the held-out test split, a fixed choice that does not depend on
any result. The script also prints, per run, over the whole held-out test split: the greedy accuracy (argmax
right), the expected accuracy of a sampled answer (the mean of π(label|x): the reward GRPO maximises, computed
exactly, no sampling), and the mean entropy of π(·|x) in nats (log 10 ≈ 2.30 is uniform).

    python 4_GRPO_MNIST/grpo_mnist.py --out runs/grpo_mnist
    python 4_GRPO_MNIST/grpo_mnist.py --beta 0 --out runs/grpo_beta0
    python tools/grpo_policy_figure.py runs/grpo_mnist runs/grpo_beta0 --out runs/grpo_policy

Writes <out>/grpo_policy.png. The course script is imported by path (like tests/conftest.py); the script
itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script, unwritable  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="training runs' folders (grpo_mnist.py --out): actor.npz, metrics.json")
    p.add_argument("--digits", type=int, default=8, help="how many held-out test digits to draw (the first ones)")
    p.add_argument("--out", default="runs/grpo_policy", help="folder for grpo_policy.png")
    a = p.parse_args(argv)
    for run in map(Path, a.runs):
        for name in ("actor.npz", "metrics.json"):
            if not (run / name).is_file():
                p.exit(1, f"error: {run / name}: no such file (give the --out folder of a grpo_mnist.py run)\n")
    if not 1 <= a.digits <= 20:
        p.exit(1, f"error: --digits must be in [1, 20], got {a.digits}\n")
    if why := unwritable(a.out):
        p.exit(1, f"error: --out {a.out!r}: cannot write there ({why})\n")
    return a


def run_args(grpo, run: Path):
    """The Args a run was trained with, read from its metrics.json (fields this script no longer has are dropped)."""
    saved = json.loads((run / "metrics.json").read_text())["args"]
    known = {f.name for f in dataclasses.fields(grpo.Args)}
    return grpo.Args(**{k: v for k, v in saved.items() if k in known})


def run_label(args) -> str:
    if args.objective != "grpo":
        return args.objective
    kl = f"β = {args.beta:g}, {args.kl} KL" if args.beta > 0 else "β = 0 (no KL term)"
    return f"GRPO, {kl}"


def policies(grpo, run: Path, x: np.ndarray):
    """(args, π_θ(·|x), π_ref(·|x)) of one run: the trained actor from actor.npz and its initial weights."""
    import jax
    from flax import nnx

    args = run_args(grpo, run)
    reference = grpo.Actor(args.hidden_size, rngs=nnx.Rngs(args.seed))  # the initial actor, as train builds it
    actor = grpo.Actor(args.hidden_size, rngs=nnx.Rngs(args.seed))
    try:
        grpo.load_checkpoint(str(run / "actor.npz"), {"actor": actor})
    except grpo.InputError as e:
        sys.exit(f"error: {e}")
    probs = [np.asarray(jax.nn.softmax(model(x).logits, axis=-1)) for model in (actor, reference)]
    return args, probs[0], probs[1]


def summary_line(label: str, probs: np.ndarray, y: np.ndarray) -> str:
    greedy = float(np.mean(probs.argmax(axis=1) == y))
    sampled = float(np.mean(probs[np.arange(len(y)), y]))  # E_{a~π}[a = y], exactly
    entropy = float(np.mean(-(probs * np.log(np.clip(probs, 1e-30, 1.0))).sum(axis=1)))
    return f"{label:<34}{greedy:>10.4f}{sampled:>13.4f}{entropy:>13.3f}"


def draw(path: str, images, y, rows: list[tuple[str, np.ndarray]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(y)
    fig, axes = plt.subplots(
        1 + len(rows), n, figsize=(1.6 * n + 1.2, 1.5 + 1.45 * len(rows)), squeeze=False, sharey="row"
    )
    for j in range(n):
        axes[0, j].imshow(images[j].reshape(28, 28), cmap="gray_r")
        axes[0, j].set_title(f"label {y[j]}", fontsize=9)
        axes[0, j].axis("off")
        for i, (label, probs) in enumerate(rows, start=1):
            ax = axes[i, j]
            colors = ["tab:green" if d == y[j] else "0.65" for d in range(10)]
            ax.bar(range(10), probs[j], color=colors)
            ax.set_ylim(0, 1)
            ax.set_xticks(range(10))
            ax.tick_params(labelsize=6)
            ax.set_title(f"π(label) = {probs[j, y[j]]:.2f}", fontsize=7)
            if j == 0:
                ax.set_ylabel(label, fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> None:
    a = parse(argv)
    grpo = load_script("4_GRPO_MNIST/grpo_mnist.py")
    runs = [Path(r) for r in a.runs]
    first = run_args(grpo, runs[0])
    data = grpo.load_data(first)  # every run must use the same data and split: checked below
    x, y = np.asarray(data.x_test), np.asarray(data.y_test)
    header = f"{'policy':<34}{'greedy':>10}{'sampled':>13}{'entropy':>13}"
    print(f"held-out test digits: {len(y)}; greedy = argmax right, sampled = mean π(label|x), entropy in nats")
    print(header)
    rows, reference_row = [], None
    for run in runs:
        args, probs, ref_probs = policies(grpo, run, x)
        for name in ("data", "dataset", "data_dir", "split_test_set"):
            if hasattr(first, name) and getattr(args, name) != getattr(first, name):
                sys.exit(f"error: {run} was trained on other data ({name}={getattr(args, name)!r}) than {runs[0]}")
        if reference_row is None:
            reference_row = (f"π_ref (initial actor, seed {args.seed})", ref_probs)
            print(summary_line(reference_row[0], ref_probs, y))
        label = f"{run_label(args)}, seed {args.seed}"
        print(summary_line(label, probs, y))
        rows.append((label.replace(", seed", "\nseed"), probs))
    k = a.digits
    rows = [(reference_row[0].replace(" (", "\n("), reference_row[1][:k])] + [(lbl, p[:k]) for lbl, p in rows]
    path = os.path.join(a.out, "grpo_policy.png")
    draw(path, x[:k], y[:k], rows, f"π(·|x) on the first {k} held-out test digits (green: the right digit)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
