"""The figures of the GRPO module's README, from short validation runs of 4_GRPO_MNIST/grpo_mnist.py.

Every run is `--task number`, seed 0 and `--no-score-test` (no test digit is read), with the script's defaults
for every flag a run does not set. Each run gets its own folder under --out; a folder whose metrics.json was
written with the same flags is reused, so a second call redraws without training. The figures go to
4_GRPO_MNIST/assets/ (--assets):

    grpo_sharpening.png   validation pass@1, pass@k and greedy over the SFT warm start and RL (the default
                          run), beside SFT alone for as many iterations (--objective supervised);
    grpo_kl.png           KL(π ‖ π_ref) on validation over the RL iterations, for --kl exact, k1 and k3 at
                          --beta 0.1, --beta 0, and the defaults;
    grpo_loss_agg.png     the mean answer length and the mean length of wrong answers over the RL iterations,
                          for the three --loss-agg choices, and for Dr. GRPO (dr-grpo with --adv-norm none);
    grpo_zero_signal.png  the share of groups whose G answers are all right, and all wrong, with and without
                          --drop-zero-var, and for RL from scratch (--sft-steps 0).

It prints the numbers the README quotes (the last validation scores of every run, and a few read off the
curves). Ten runs (the others repeat the defaults and are reused):

    python tools/grpo_figures.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script, unwritable  # noqa: E402

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
COMMON = ["--task", "number", "--seed", "0", "--no-score-test"]
KL_BETA = "0.1"
RUNS = {  # name → the flags beyond COMMON and the script's defaults
    "default": [],
    "sft_only": ["--objective", "supervised"],
    "kl_exact": ["--beta", KL_BETA, "--kl", "exact"],
    "kl_k1": ["--beta", KL_BETA, "--kl", "k1"],
    "kl_k3": ["--beta", KL_BETA, "--kl", "k3"],
    "beta_0": ["--beta", "0"],
    "agg_seq-mean-token-mean": ["--loss-agg", "seq-mean-token-mean"],
    "agg_token-mean": ["--loss-agg", "token-mean"],
    "agg_dr-grpo": ["--loss-agg", "dr-grpo"],
    "dr_grpo": ["--loss-agg", "dr-grpo", "--adv-norm", "none"],
    "drop_zero_var": ["--drop-zero-var"],
    "from_scratch": ["--sft-steps", "0"],
}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/grpo_figures", help="folder for the runs (one sub-folder per flag set)")
    p.add_argument("--assets", default="4_GRPO_MNIST/assets", help="folder for the PNG figures")
    a = p.parse_args(argv)
    for folder in (a.out, a.assets):
        if why := unwritable(folder):
            p.exit(1, f"error: {folder!r}: cannot write there ({why})\n")
    return a


def flags_of(name: str, out: Path) -> list[str]:
    return [*COMMON, *RUNS[name], "--out", str(out / name)]


def what_it_trains(args: dict) -> dict:
    """A run's Args without --out and --load (where it writes, and the flag that skips training: off here)."""
    return {k: v for k, v in args.items() if k not in ("out", "load")}


def run(name: str, out: Path, runs_done: dict[str, dict]) -> dict:
    """metrics.json of the run `name`: reused if a run with the same Args already wrote one (here or under another
    name, e.g. --beta 0 when that is the default), else trained now (its output goes to log.txt beside it)."""
    grpo = load_script(SCRIPT)
    wanted = what_it_trains(asdict(grpo.parse_args(flags_of(name, out))))
    for metrics in runs_done.values():
        if what_it_trains(metrics["args"]) == wanted:
            return metrics
    path = out / name / "latest" / "metrics.json"
    if path.is_file():
        metrics = json.loads(path.read_text(encoding="utf-8"))
        if what_it_trains(metrics["args"]) == wanted:
            return metrics
    (out / name).mkdir(parents=True, exist_ok=True)
    with open(out / name / "log.txt", "w", encoding="utf-8") as log:
        proc = subprocess.run([sys.executable, SCRIPT, *flags_of(name, out)], cwd=REPO, stdout=log, stderr=log)
    if proc.returncode != 0:
        sys.exit(f"error: {SCRIPT} {' '.join(flags_of(name, out))} failed; see {out / name / 'log.txt'}")
    return json.loads(path.read_text(encoding="utf-8"))


def rl_part(history: list[dict]) -> list[dict]:
    """The rows from the end of the warm start on: the start of RL, then every RL block."""
    first = next(i for i, h in enumerate(history) if h["phase"] in ("rl", "supervised"))
    return history[first - 1 :]


def k_of(metrics: dict) -> str:
    return next(k for k in metrics if k.startswith("val_pass") and k != "val_pass1")


def plot_scores(ax, history: list[dict], k: int) -> None:
    """Validation pass@1, pass@k and greedy exact match (%) of every scored row, the SFT steps at x ≤ 0 (so RL
    starts at 0): the score panel of the script's own learning curve, drawn as plot_curve draws it."""
    sft = max((h["iteration"] for h in history if h["phase"] == "sft"), default=0)
    steps = [h["iteration"] - (sft if h["phase"] in ("start", "sft") else 0) for h in history]
    for key, style, text in (
        ("val_pass1", "o-", "pass@1"),
        (f"val_pass{k}", "d-", f"pass@{k}"),
        ("val_greedy", "s-", "greedy"),
    ):
        ax.plot(steps, [100 * h[key] for h in history], style, label=f"{text} (validation)")


def sharpening(m: dict, assets: Path) -> None:
    """Each panel is the validation-score panel of the script's own learning curve."""
    k = int(k_of(m["default"])[len("val_pass") :])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, name, title in (
        (axes[0], "default", "SFT warm start, then GRPO (the default)"),
        (axes[1], "sft_only", "SFT alone, as many iterations"),
    ):
        plot_scores(ax, m[name]["history"], k)
        ax.axvline(0, color="grey", lw=0.8, ls=":")
        ax.set(title=title, xlabel="step (warm start at x ≤ 0)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("% of validation prompts")
    fig.tight_layout()
    fig.savefig(assets / "grpo_sharpening.png", dpi=90)
    plt.close(fig)


def kl_curves(m: dict, assets: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    lines = [
        ("kl_exact", "o-", f"exact, β = {KL_BETA}"),
        ("kl_k1", "x--", f"k1, β = {KL_BETA}"),
        ("kl_k3", "s-", f"k3, β = {KL_BETA}"),
        ("beta_0", "^:", "β = 0 (no KL term)"),
        ("default", "d-.", "the default: {kl}, β = {beta}".format(**m["default"]["args"])),
    ]
    if m["default"] is m["beta_0"]:  # β = 0 is the default: one line, named so
        lines = [*lines[:3], ("beta_0", "^:", "β = 0, no KL term (the default)")]
    for name, style, text in lines:
        h = rl_part(m[name]["history"])
        x = [r["iteration"] if r["phase"] == "rl" else 0 for r in h]
        # π_ref is the policy RL starts from, so the KL is 0 at x = 0 (the warm row's kl_ref is to the initial policy)
        axes[0].plot(x, [r["val_kl_ref"] if r["phase"] == "rl" else 0.0 for r in h], style, label=text)
        axes[1].plot(x, [100 * r["val_pass1"] for r in h], style, label=text)
    axes[0].set(title="KL(π ‖ π_ref) per answer on validation (nats)", xlabel="RL iteration")
    axes[1].set(title="validation pass@1 (%)", xlabel="RL iteration")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(assets / "grpo_kl.png", dpi=90)
    plt.close(fig)


AGGS = ("seq-mean-token-mean", "token-mean", "dr-grpo")


def length_curves(m: dict, assets: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    lines = [(f"agg_{agg}", style, agg) for agg, style in zip(AGGS, ("o-", "s--", "^:"))]
    lines.append(("dr_grpo", "d-.", "dr-grpo, --adv-norm none (Dr. GRPO)"))
    for name, style, text in lines:
        h = rl_part(m[name]["history"])
        x = [r["iteration"] if r["phase"] == "rl" else 0 for r in h]
        axes[0].plot(x, [r["val_length"] for r in h], style, label=text)
        axes[1].plot(x, [r["val_wrong_length"] for r in h], style, label=text)
    axes[0].set(title="mean answer length (tokens, EOS included)", xlabel="RL iteration", ylabel="tokens")
    axes[1].set(title="mean length of wrong answers", xlabel="RL iteration")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="--loss-agg")
    fig.tight_layout()
    fig.savefig(assets / "grpo_loss_agg.png", dpi=90)
    plt.close(fig)


def zero_signal(m: dict, assets: Path) -> None:
    """Groups whose G rewards are all equal, split: all right (nothing left to learn) and all wrong (nothing to
    learn from yet)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for name, style, text in (
        ("default", "o-", "after SFT, all groups in the loss"),
        ("drop_zero_var", "s--", "after SFT, --drop-zero-var"),
        ("from_scratch", "^:", "RL from scratch (--sft-steps 0)"),
    ):
        h = [r for r in m[name]["history"] if r["phase"] == "rl"]
        steps = [r["iteration"] for r in h]
        axes[0].plot(steps, [100 * r["all_right"] for r in h], style, label=text)
        axes[1].plot(steps, [100 * (r["zero_signal"] - r["all_right"]) for r in h], style, label=text)
    axes[0].set(title="groups with all G answers right", xlabel="RL iteration", ylabel="% of groups")
    axes[1].set(title="groups with all G answers wrong", xlabel="RL iteration")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(assets / "grpo_zero_signal.png", dpi=90)
    plt.close(fig)


def report(m: dict) -> None:
    """The numbers the README quotes: per run, validation scores at the end of the warm start and at the end."""
    k = k_of(m["default"])
    print(f"validation ({m['default']['val_prompts']} prompts), seed 0, --task number; 'warm' = end of the warm start")
    head = f"{'run':<20}{'flags':<32}{'pass@1':>8}{'pass@' + k[8:]:>8}{'greedy':>8}{'length':>8}{'wrong len':>10}"
    warm_k = f"warm pass@{k[8:]}"
    head += f"{'kl_ref':>8}{'zero_sig':>9}{'clip_frac':>10}{'outside':>9}"
    print(head + f"{'warm pass@1':>12}{warm_k:>12}{'warm greedy':>12}")
    for name, metrics in m.items():
        warm = rl_part(metrics["history"])[0]
        flags = " ".join(RUNS[name]) or "(defaults)"
        if next(other for other in m if m[other] is metrics) != name:
            continue  # a reused run (the same flags as an earlier one, e.g. --beta 0 when that is the default)
        name = name.replace("_", "-")
        row = f"{name:<20}{flags:<32}{metrics['val_pass1']:>8.4f}{metrics[k]:>8.4f}{metrics['val_greedy']:>8.4f}"
        rl = "zero_signal" in metrics  # without RL there is no π_ref of RL: its kl_ref is to the initial policy
        kl = f"{metrics['val_kl_ref']:>8.3f}" if rl else f"{'–':>8}"
        row += f"{metrics['val_length']:>8.2f}{metrics['val_wrong_length']:>10.2f}{kl}"
        for key, width in (("zero_signal", 9), ("clip_frac", 10), ("outside_frac", 9)):
            row += f"{metrics[key]:>{width}.4f}" if rl else f"{'–':>{width}}"
        print(row + f"{warm['val_pass1']:>12.4f}{warm[k]:>12.4f}{warm['val_greedy']:>12.4f}")
    named = (("default", "default run"), ("drop_zero_var", "--drop-zero-var"), ("from_scratch", "from scratch"))
    for name, text in named:
        rl_rows = [r for r in m[name]["history"] if r["phase"] == "rl"]
        first, last = rl_rows[0], rl_rows[-1]
        shares = [(r["zero_signal"], r["all_right"], r["zero_signal"] - r["all_right"]) for r in (first, last)]
        split = [f"{z:.4f} (all right {right:.4f}, all wrong {wrong:.4f})" for z, right, wrong in shares]
        print(f"{text}: zero_signal {split[0]} in the first RL block, {split[1]} in the last")
    args = m["default"]["args"]
    print(
        f"defaults: G={args['group_size']}, μ={args['inner_steps']}, β={args['beta']}, kl {args['kl']}, "
        f"{args['loss_agg']}, learning rate {args['learning_rate']}, SFT {m['default']['sft_steps']} steps, "
        f"RL {args['iterations']} iterations, label fraction {args['label_fraction']}"
    )


def main(argv=None) -> None:
    a = parse(argv)
    out, assets = Path(a.out), Path(a.assets)
    metrics: dict[str, dict] = {}
    for name in RUNS:
        metrics[name] = run(name, out, metrics)
    sharpening(metrics, assets)
    kl_curves(metrics, assets)
    length_curves(metrics, assets)
    zero_signal(metrics, assets)
    report(metrics)
    figures = ("grpo_sharpening.png", "grpo_kl.png", "grpo_loss_agg.png", "grpo_zero_signal.png")
    print("wrote " + ", ".join(f"{assets}/{f}" for f in figures))


if __name__ == "__main__":
    main()
