"""What the GRPO validation sweep's runs say beyond greedy accuracy: sampled accuracy, reward, zero-signal groups, KL.

tools/grpo_val_sweep.py chooses on greedy validation accuracy and keeps every run's metrics.json. This reads them
back and prints, for every GRPO configuration of the sweep, the mean over its seeds at the last epoch of:

    val_greedy     greedy validation accuracy (what the sweep chose on)
    val_sampled    the accuracy of one sampled answer on validation, mean π(label | x) (what GRPO maximises)
    train_reward   the mean reward of the answers sampled in the last training epoch
    zero_signal    the share of groups whose G rewards were all equal (no gradient)
    kl_ref         the exact KL(π ‖ π_ref) on validation, in nats

and which configuration each validation metric would choose. No test number is read: the sweep's runs have none.

    python tools/grpo_val_sweep.py --seeds 0-2 --epochs 10      # writes runs/grpo_val_sweep/
    python tools/grpo_sweep_logs.py runs/grpo_val_sweep
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FLAG_FIELDS = {  # the sweep's flags -> the Args field each sets
    "--objective": "objective",
    "--learning-rate": "learning_rate",
    "--group-size": "group_size",
    "--inner-steps": "inner_steps",
    "--beta": "beta",
    "--kl": "kl",
    "--batch-size": "batch_size",
}


def wanted(flags: list[str]) -> dict:
    """{'learning_rate': 0.001, …} from ['--learning-rate', '1e-3', …]."""
    out = {}
    for name, value in zip(flags[::2], flags[1::2]):
        field = FLAG_FIELDS[name]
        out[field] = value if field in ("objective", "kl") else float(value)
    return out


def matches(args: dict, want: dict, epochs: int) -> bool:
    if args.get("epochs") != epochs or args.get("score_test", True):
        return False
    for k, v in want.items():
        got = args.get(k)
        if isinstance(v, float) and not (isinstance(got, (int, float)) and abs(got - v) < 1e-12):
            return False
        if isinstance(v, str) and got != v:
            return False
    return args.get("kl", "exact") == want.get("kl", "exact")  # a row without --kl means the default, exact


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", help="the --out folder of tools/grpo_val_sweep.py (its summary.json and seeds/)")
    p.add_argument("--epochs", type=int, default=10, help="the sweep's --epochs")
    a = p.parse_args(argv)
    folder = Path(a.sweep)
    if not (folder / "summary.json").is_file():
        sys.exit(f"error: {folder / 'summary.json'}: no such file (run tools/grpo_val_sweep.py first)")
    sweep = json.loads((folder / "summary.json").read_text())
    runs = []
    for path in sorted((folder / "seeds").glob("**/seed_*/metrics.json")):
        metrics = json.loads(path.read_text())
        runs.append((metrics["args"], metrics))

    print(f"{sweep['command']}: GRPO rows, mean over each configuration's seeds at epoch {a.epochs}")
    header = f"{'flags (beyond --objective grpo)':<70}{'val_greedy':>11}{'val_sampled':>12}{'train_reward':>13}"
    print(header + f"{'zero_signal':>12}{'kl_ref':>8}")
    best = {}
    for row in sweep["rows"]:
        if row["objective"] != "grpo":
            continue
        want = wanted(row["flags"])
        seeds = {int(s) for s in row["per_seed"]}
        found = {args["seed"]: m for args, m in runs if args["seed"] in seeds and matches(args, want, a.epochs)}
        label = " ".join(f for f in row["flags"] if f not in ("--objective", "grpo"))
        if set(found) != seeds:
            print(f"{label:<70}  runs missing for seeds {sorted(seeds - set(found))} (overwritten or deleted)")
            continue
        last = [m["history"][-1] for m in found.values()]
        mean = {k: sum(h[k] for h in last) / len(last) for k in ("val_accuracy", "val_sampled_accuracy")}
        mean |= {k: sum(h.get(k, 0.0) for h in last) / len(last) for k in ("train_reward", "zero_signal", "kl_ref")}
        print(
            f"{label:<70}{mean['val_accuracy']:>11.4f}{mean['val_sampled_accuracy']:>12.4f}"
            f"{mean['train_reward']:>13.4f}{mean['zero_signal']:>12.4f}{mean['kl_ref']:>8.3f}"
        )
        for metric in ("val_accuracy", "val_sampled_accuracy"):
            if metric not in best or mean[metric] > best[metric][0]:
                best[metric] = (mean[metric], label)
    for metric, (value, label) in best.items():
        print(f"best on {metric}: {label} ({value:.4f})")


if __name__ == "__main__":
    main()
