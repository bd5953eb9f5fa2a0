"""Choose GRPO's and the supervised baseline's hyperparameters on the VALIDATION split, with the same budget.

    python tools/grpo_val_sweep.py                        # the bundled digits: 7,200 train / 800 validation
    python tools/grpo_val_sweep.py --seeds 0-2 --epochs 10 -- --data full --dataset fashion_mnist

Each objective gets the same number of configurations (BUDGET), each run on the same seeds through
`tools/seeds.py --metric val_accuracy`. GRPO searches in two stages: first the KL term (β, and `--kl`
exact or k3) at the base learning rate, G and μ; then one knob at a time (the learning rate, G, μ) away
from the best of stage 1. The supervised baseline tries the learning rate × the batch size. The chosen
configuration of each objective is the one with the highest mean validation accuracy over the seeds. The test images
are never read for a choice: every run here gets `--no-score-test`, so the script drops the test images before
training and its metrics.json holds no test number. The test accuracy is measured afterwards, once, with
`tools/seeds.py` (see 4_GRPO_MNIST/README.md, "Results"). Flags after `--` go to every run.

Writes `<out>/summary.md` (the table for the README, with this command) and `<out>/summary.json`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seeds  # noqa: E402  (tools/seeds.py, beside this file)

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
GRPO_BASE = [
    "--objective",
    "grpo",
    "--learning-rate",
    "1e-3",
    "--group-size",
    "16",
    "--inner-steps",
    "2",
    "--beta",
    "0.1",
]
GRPO_STAGE1 = [  # the KL term at the base learning rate, G and μ; [] is the base itself
    ["--beta", "0"],
    ["--beta", "0.01"],
    [],
    ["--beta", "0.3"],
    ["--beta", "1"],
    ["--beta", "3"],
    ["--kl", "k3"],
    ["--kl", "k3", "--beta", "0.3"],
    ["--kl", "k3", "--beta", "1"],
]
GRPO_STAGE2 = [  # one knob at a time away from the best configuration of stage 1
    ["--learning-rate", "3e-4"],
    ["--learning-rate", "3e-3"],
    ["--group-size", "8"],
    ["--group-size", "32"],
    ["--inner-steps", "1"],
    ["--inner-steps", "4"],
]
SUPERVISED = (
    [
        ["--objective", "supervised", "--learning-rate", lr, "--batch-size", b]  # the learning rate × the batch
        for b in ("32", "64")
        for lr in ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2")
    ]  # size, then a few more
    + [["--objective", "supervised", "--learning-rate", lr, "--batch-size", "128"] for lr in ("1e-3", "3e-3", "1e-2")]
    + [["--objective", "supervised", "--learning-rate", lr, "--batch-size", "64"] for lr in ("5e-4", "2e-3")]
)
BUDGET = len(GRPO_STAGE1) + len(GRPO_STAGE2)
assert len(SUPERVISED) == BUDGET, "both objectives get the same number of validation runs"


def with_moves(base: list[str], moves: list[str]) -> list[str]:
    """base flags with `moves` overriding the same flags:
    ['--learning-rate', '1e-3'] + ['--learning-rate', '3e-3'] -> ['--learning-rate', '3e-3']."""
    pairs = dict(zip(base[::2], base[1::2]))
    pairs.update(zip(moves[::2], moves[1::2]))
    return [x for kv in pairs.items() for x in kv]


def earlier(root: Path, flags: list[str], seeds_text: str) -> dict | None:
    """The summary.json that tools/seeds.py wrote for exactly these flags and seeds, if there is one."""
    path = root / Path(SCRIPT).stem.lower() / seeds.default_tag(flags, seeds_text) / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    expected = " -- " + " ".join(map(shlex.quote, flags))
    same = summary.get("command", "").endswith(expected) and summary.get("metric") == "val_accuracy"
    return summary if same and summary.get("n") == len(seeds.parse_seeds(seeds_text)) else None


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0-2", help="seeds of every configuration")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--out", default="runs/grpo_val_sweep", help="folder of the table; runs go under <out>/seeds")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="reuse a configuration's summary.json from an earlier "
        "sweep with the same command instead of running it again",
    )
    a = p.parse_args(ours)
    if "--score-test" in extra:
        p.error("--score-test: the sweep makes choices, so its runs never score the test set")
    common = ["--epochs", str(a.epochs), "--no-score-test", *extra]  # choices never see the test set
    out = Path(a.out)
    rows: list[dict] = []

    def run(objective: str, stage: int, grid: list[list[str]]) -> list[str]:
        """Score every configuration of `grid` on validation; return the flags of the best one so far."""
        for flags in grid:
            argv_seeds = [
                SCRIPT,
                "--seeds",
                a.seeds,
                "--metric",
                "val_accuracy",
                "--out",
                str(out / "seeds"),
                "--",
                *flags,
                *common,
            ]
            summary = earlier(out / "seeds", flags + common, a.seeds) if a.reuse else None
            summary = summary or seeds.main(argv_seeds)
            rows.append(
                {
                    "objective": objective,
                    "stage": stage,
                    "flags": flags,
                    "mean": summary["mean"],
                    "min": summary["min"],
                    "per_seed": summary["per_seed"],
                }
            )
        return max((r for r in rows if r["objective"] == objective), key=lambda r: r["mean"])["flags"]

    best = run("grpo", 1, [with_moves(GRPO_BASE, m) for m in GRPO_STAGE1])
    chosen = {
        "grpo": run("grpo", 2, [with_moves(best, m) for m in GRPO_STAGE2]),
        "supervised": run("supervised", 1, SUPERVISED),
    }
    command = "python tools/grpo_val_sweep.py " + " ".join(map(shlex.quote, argv))
    lines = [
        f"`{command}`",
        "",
        f"| objective | stage | flags | val accuracy, mean of seeds {a.seeds} | min | chosen |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "**yes**" if r["flags"] == chosen[r["objective"]] else ""
        lines.append(
            f"| {r['objective']} | {r['stage']} | `{' '.join(r['flags'])}` | {r['mean']:.4f} | "
            f"{r['min']:.4f} | {mark} |"
        )
    table = "\n".join(lines) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(table)
    (out / "summary.json").write_text(json.dumps({"command": command, "rows": rows, "chosen": chosen}, indent=2))
    print("\n" + table)
    for objective, flags in chosen.items():
        print(f"chosen on validation, {objective}: {' '.join(flags)}")
    return {"rows": rows, "chosen": chosen}


if __name__ == "__main__":
    try:
        main()
    except seeds.SweepError as e:
        sys.exit(f"error: {e}")
