"""Choose token-level GRPO's and the supervised baseline's settings on VALIDATION pass@1, with the same budget.

    python tools/grpo_val_sweep.py --task digit                  # one image, one digit (~10 s a run)
    python tools/grpo_val_sweep.py --task number                 # strips of up to 4 digits, SFT warm start first
    python tools/grpo_val_sweep.py --task number --seeds 0-2 -- --iterations 1000   # flags after -- go to every run

The quantity GRPO maximises is the expected reward of answers sampled at temperature 1, so every choice is made
on `val_pass1`; pass@8, greedy exact match, the length of wrong answers and the KL to π_ref are shown beside it.
Each configuration runs on the same seeds through
`tools/seeds.py --metric val_pass1 --also val_pass8,val_greedy,val_length,val_wrong_length,val_kl_ref`.

- GRPO, stage 1, the KL term: β = 0 (the base: G = 8, μ = 2, lr 5e-4, seq-mean-token-mean), β = 0.01 and 0.1
  with k3, β = 0.1 with the exact KL and with k1.
- GRPO, stage 2, one knob at a time away from the best of stage 1: the learning rate, G, μ (kept ≥ 2, so the
  clip acts) and the loss aggregation. One more row, μ = 1 (the plain policy gradient: the ratio stays 1), is
  a reference and never a candidate.
- The supervised baseline, on all labels (`--label-fraction 1`): the learning rate × the batch size, as many
  configurations as GRPO's candidates (BUDGET), with the same --iterations.

The chosen configuration of each objective has the highest mean val_pass1 over the seeds. The test set is never
read for a choice: every run gets `--no-score-test`, so its metrics.json holds no test number; the test set is
scored afterwards, once, with `tools/seeds.py`. Every run's flags are written out in full (not left to the
script's defaults), so the table keeps its meaning when the defaults change.

Writes `benchmarks/results/grpo_val_sweep_<task>.txt` (a provenance header line, as tools/capture.py writes it,
then the table; `--results-dir` moves it), `grpo_val_sweep_<task>.first.json` and `.second.json` beside it (the
chosen GRPO row and the runner-up, as tools/seeds.py summarises seeds, with their flags), and `<out>/summary.json`
with every row.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seeds  # noqa: E402  (tools/seeds.py, beside this file)
from results import RESULTS_DIR, provenance  # noqa: E402

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
METRIC = "val_pass1"
ALSO = ("val_pass8", "val_greedy", "val_length", "val_wrong_length", "val_kl_ref")
GRPO_BASE = [  # stage 1's base (G = 8, μ = 2, β = 0, lr 5e-4, seq-mean-token-mean), written out
    "--objective",
    "grpo",
    "--group-size",
    "8",
    "--inner-steps",
    "2",
    "--beta",
    "0",
    "--kl",
    "k3",
    "--learning-rate",
    "5e-4",
    "--loss-agg",
    "seq-mean-token-mean",
]
GRPO_STAGE1 = [  # the KL term; [] is the base itself (β = 0: no KL term)
    [],
    ["--beta", "0.01", "--kl", "k3"],
    ["--beta", "0.1", "--kl", "k3"],
    ["--beta", "0.1", "--kl", "exact"],
    ["--beta", "0.1", "--kl", "k1"],
]
GRPO_STAGE2 = [  # one knob at a time away from the best configuration of stage 1
    ["--learning-rate", "2.5e-4"],
    ["--learning-rate", "1e-3"],
    ["--group-size", "4"],
    ["--group-size", "16"],
    ["--inner-steps", "4"],
    ["--loss-agg", "token-mean"],
    ["--loss-agg", "dr-grpo"],
]
GRPO_REFERENCE = [["--inner-steps", "1"]]  # μ = 1: the plain policy-gradient case, shown, never chosen
SUPERVISED = [
    ["--objective", "supervised", "--label-fraction", "1", "--learning-rate", lr, "--batch-size", b]
    for b in ("32", "64", "128")
    for lr in ("2.5e-4", "5e-4", "1e-3", "2e-3")
]
BUDGET = len(GRPO_STAGE1) + len(GRPO_STAGE2)
assert len(SUPERVISED) == BUDGET, "both objectives get the same number of candidate configurations"

COLUMNS = {  # table column -> the flag it shows
    "G": "--group-size",
    "μ": "--inner-steps",
    "β": "--beta",
    "KL": "--kl",
    "lr": "--learning-rate",
    "loss-agg": "--loss-agg",
    "batch": "--batch-size",
}


def with_moves(base: list[str], moves: list[str]) -> list[str]:
    """base flags with `moves` overriding the same flags:
    ['--learning-rate', '5e-4'] + ['--learning-rate', '1e-3'] -> ['--learning-rate', '1e-3']."""
    pairs = dict(zip(base[::2], base[1::2]))
    pairs.update(zip(moves[::2], moves[1::2]))
    return [x for kv in pairs.items() for x in kv]


def tag(flags: list[str], seeds_text: str) -> str:
    """A run folder per configuration, from all of its flags (seeds.default_tag cuts them at 80 characters)."""
    name = "_".join(a.lstrip("-") for a in flags)
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", f"{name}_seeds-{seeds_text}").strip("_")


def earlier(folder: Path, flags: list[str], seeds_text: str) -> dict | None:
    """The summaries that tools/seeds.py wrote for exactly these flags and seeds, if a run left them:
    {metric: summary} for val_pass1 and every ALSO key, read from the runs' own metrics.json."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    expected = " -- " + " ".join(map(shlex.quote, flags))
    wanted = seeds.parse_seeds(seeds_text)
    if not (summary.get("command", "").endswith(expected) and summary.get("metric") == METRIC):
        return None
    if [int(s) for s in summary.get("per_seed", {})] != wanted:
        return None
    metrics = {s: json.loads((folder / f"seed_{s}" / "latest" / "metrics.json").read_text()) for s in wanted}
    seconds = {s: summary["seconds_per_seed"][str(s)] for s in wanted}
    return {
        key: seeds.summarise({s: float(m[key]) for s, m in metrics.items()}, seconds, seeds.Headline(key, None))
        for key in (METRIC, *ALSO)
    }


def measure(flags: list[str], a: argparse.Namespace, root: Path) -> dict:
    """Run one configuration over the seeds; {metric: summary} for val_pass1 and every ALSO key."""
    folder_tag = tag(flags, a.seeds)
    if a.reuse and (found := earlier(root / Path(SCRIPT).stem / folder_tag, flags, a.seeds)):
        print(f"reused {root / Path(SCRIPT).stem / folder_tag}", flush=True)
        return found
    argv = [
        SCRIPT,
        "--seeds",
        a.seeds,
        "--metric",
        METRIC,
        "--also",
        ",".join(ALSO),
        "--out",
        str(root),
        "--tag",
        folder_tag,
        "--",
        *flags,
    ]
    summary = seeds.main(argv)
    folder = root / Path(SCRIPT).stem / folder_tag
    found = earlier(folder, flags, a.seeds) if (folder / "summary.json").is_file() else None
    return found or {METRIC: summary}


def interval(summary: dict) -> str:
    """'0.7812 [0.7650, 0.7901]': the IQM of the seeds' scores and its 95 % bootstrap CI ('–' below 2 seeds)."""
    ci = summary.get("iqm_ci95")
    return f"{summary['iqm']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "–"


def cell(values: dict | None, key: str) -> str:
    return "–" if values is None or key not in values else f"{values[key]['mean']:.4f}"


def table(rows: list[dict], chosen: dict, seeds_text: str) -> list[str]:
    """The markdown table of every configuration, its cells padded so it also reads as plain text."""
    head = ["objective", "stage", *COLUMNS, "pass@1", "IQM [95 % CI]", "per seed", "pass@8", "greedy", "length"]
    head += ["wrong len"]
    head += ["KL ref", "median s", "chosen"]
    body = []
    for r in rows:
        pairs = dict(zip(r["flags"][::2], r["flags"][1::2]))
        m = r["metrics"]
        per_seed = "/".join(f"{v:.4f}" for v in m[METRIC]["per_seed"].values())
        if r["stage"] == "ref":
            mark = "not a candidate"
        else:
            mark = "**yes**" if r["flags"] == chosen[r["objective"]] else ""
        body.append(
            [
                r["objective"],
                str(r["stage"]),
                *(pairs.get(f, "") for f in COLUMNS.values()),
                f"{m[METRIC]['mean']:.4f}",
                interval(m[METRIC]),
                per_seed,
                *(cell(m, k) for k in ("val_pass8", "val_greedy", "val_length", "val_wrong_length", "val_kl_ref")),
                f"{m[METRIC]['median_seconds']:.1f}",
                mark,
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *body)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)]


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=("digit", "number"), default="digit", help="the script's --task")
    p.add_argument("--seeds", default="0-1", help="seeds of every configuration")
    p.add_argument(
        "--out", default=None, help="folder of the runs and summary.json (default: runs/grpo_val_sweep_TASK)"
    )
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="folder of grpo_val_sweep_TASK.txt")
    p.add_argument(
        "--reuse",
        action="store_true",
        help="reuse a configuration's runs from an earlier sweep with the same flags and seeds instead of running "
        "them again",
    )
    a = p.parse_args(ours)
    if "--score-test" in extra:
        p.error("--score-test: the sweep makes choices, so its runs never score the test set")
    for f in ("--task", "--seed", "--out"):
        if any(x == f or x.startswith(f + "=") for x in extra):
            p.error(f"{f} after --: the sweep sets it")
    seeds.parse_seeds(a.seeds)  # bad --seeds fails before any run
    out = Path(a.out or f"runs/grpo_val_sweep_{a.task}")
    results = Path(a.results_dir)
    for folder in (out, results):
        seeds.check_writable(folder)  # before any run
    common = ["--task", a.task, "--no-score-test", *extra]  # choices never see the test set
    command = "python tools/grpo_val_sweep.py " + " ".join(map(shlex.quote, argv))
    header = provenance(command)  # the load average as the sweep starts
    start = time.perf_counter()
    rows: list[dict] = []

    def run(objective: str, stage: int | str, grid: list[list[str]]) -> list[str]:
        """Score every configuration of `grid` on validation; return the flags of the best candidate so far."""
        for flags in grid:
            metrics = measure(flags + common, a, out / "seeds")
            rows.append({"objective": objective, "stage": stage, "flags": flags, "metrics": metrics})
        candidates = [r for r in rows if r["objective"] == objective and r["stage"] != "ref"]
        return max(candidates, key=lambda r: r["metrics"][METRIC]["mean"])["flags"]

    best = run("grpo", 1, [with_moves(GRPO_BASE, m) for m in GRPO_STAGE1])
    chosen = {"grpo": run("grpo", 2, [with_moves(best, m) for m in GRPO_STAGE2])}
    run("grpo", "ref", [with_moves(best, m) for m in GRPO_REFERENCE])
    chosen["supervised"] = run("supervised", 1, SUPERVISED)
    header["seconds"] = round(time.perf_counter() - start, 1)

    n = len(seeds.parse_seeds(a.seeds))
    per_run = [s for r in rows for s in r["metrics"][METRIC]["seconds_per_seed"].values()]
    runs, run_seconds = len(per_run), sum(per_run)
    lines = [
        f"`{command}`: task {a.task}, every configuration on seeds {a.seeds} ({n} runs), chosen on the mean "
        f"val_pass1 (sampled at temperature 1), shown with the IQM of the runs and its 95 % bootstrap CI; the other "
        f"columns are means over the same runs.",
        f"Every run: python {SCRIPT} FLAGS {' '.join(map(shlex.quote, common))} --seed S",
        "",
        *table(rows, chosen, a.seeds),
        "",
        *(f"chosen on validation, {objective}: {' '.join(flags)}" for objective, flags in chosen.items()),
        f"cost: {runs} runs, {run_seconds / 3600:.1f} h in all (each run's whole process, reused runs included; "
        f"median {statistics.median(per_run):.0f} s a run)",
    ]
    text = "\n".join(lines) + "\n"
    path = results / f"grpo_val_sweep_{a.task}.txt"
    path.write_text("# " + json.dumps(header, ensure_ascii=False) + "\n\n" + text)
    ranked = sorted(
        (r for r in rows if r["objective"] == "grpo" and r["stage"] != "ref"),
        key=lambda r: r["metrics"][METRIC]["mean"],
        reverse=True,
    )
    for place, r in zip(("first", "second"), ranked):  # the chosen GRPO row and the runner-up, for the READMEs
        top = {**r["metrics"][METRIC], "flags": " ".join(r["flags"]), "provenance": header}
        (results / f"grpo_val_sweep_{a.task}.{place}.json").write_text(
            json.dumps(top, indent=2, ensure_ascii=False) + "\n"
        )
    summary = {"provenance": header, "rows": rows, "chosen": chosen}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    print("\n" + text + f"wrote {path} and {out / 'summary.json'} ({header['seconds']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    try:
        main()
    except seeds.SweepError as e:
        sys.exit(f"error: {e}")
