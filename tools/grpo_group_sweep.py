"""Per-image groups against one batch-wide baseline, at several group sizes, scored on the VALIDATION split.

`--group-mode prompt` (real GRPO) normalises each image's G rewards by that image's own mean and standard
deviation; `--group-mode batch` (the original guide's variant) normalises all B·G rewards of the batch with one mean
and one standard deviation. Each row runs `tools/seeds.py --metric val_accuracy` on the same seeds with
`--no-score-test` (no test digit is read) and the defaults for every flag it does not list, then reads the runs'
metrics.json back for the sampled validation accuracy and the share of all-equal groups in the last epoch.

    python tools/grpo_group_sweep.py                 # seeds 0-2, writes runs/grpo_group_sweep/
    python tools/grpo_group_sweep.py --seeds 0-4

Prints one markdown table, with the command that made it.
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
ROWS = [  # (baseline, answers per image, flags)
    ("per image (the default)", 16, []),
    ("whole batch", 16, ["--group-mode", "batch"]),
    ("per image", 4, ["--group-size", "4"]),
    ("whole batch", 4, ["--group-mode", "batch", "--group-size", "4"]),
    ("per image", 2, ["--group-size", "2"]),
    ("whole batch", 2, ["--group-mode", "batch", "--group-size", "2"]),
    ("whole batch", 1, ["--group-mode", "batch", "--group-size", "1"]),
    (
        "whole batch, the original guide's settings",
        1,
        [
            "--group-mode",
            "batch",
            "--group-size",
            "1",
            "--batch-size",
            "1024",
            "--learning-rate",
            "1e-4",
            "--beta",
            "0",
        ],
    ),
]


def last_epoch_means(folder: Path) -> dict:
    """Mean over the sweep folder's runs of the last epoch's sampled validation accuracy and zero-signal share."""
    rows = [json.loads(p.read_text())["history"][-1] for p in sorted(folder.glob("seed_*/metrics.json"))]
    return {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in ("val_sampled_accuracy", "zero_signal")}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0-2", help="seeds of every row")
    p.add_argument("--out", default="runs/grpo_group_sweep", help="folder of the runs")
    a = p.parse_args(argv)
    out = Path(a.out) / "seeds"
    lines = [
        "`" + " ".join(["python", "tools/grpo_group_sweep.py", *map(shlex.quote, argv)]) + "`",
        "",
        f"| baseline | answers per image | flags | val accuracy, mean of seeds {a.seeds} | min | "
        "sampled val accuracy | `zero_signal`, last epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for baseline, answers, flags in ROWS:
        run_flags = [*flags, "--no-score-test"]
        summary = seeds.main(
            [SCRIPT, "--seeds", a.seeds, "--metric", "val_accuracy", "--out", str(out), "--", *run_flags]
        )
        extra = last_epoch_means(out / Path(SCRIPT).stem.lower() / seeds.default_tag(run_flags, a.seeds))
        shown = f"`{' '.join(flags)}`" if flags else "(none)"
        lines.append(
            f"| {baseline} | {answers} | {shown} | {summary['mean']:.4f} | {summary['min']:.4f} | "
            f"{extra['val_sampled_accuracy']:.4f} | {extra['zero_signal']:.4f} |"
        )
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    try:
        main()
    except seeds.SweepError as e:
        sys.exit(f"error: {e}")
