"""Run one course script over many seeds and summarise its headline metric as Agarwal et al. (2021) ask:
the per-seed scores, the interquartile mean (IQM) with a 95 % bootstrap confidence interval, and how many
seeds reach the module's success bar.

    python tools/seeds.py 2_Cart_Pole_DQN/cart_pole_dqn.py --seeds 0-19
    python tools/seeds.py 1_Q_Learning/Q_Learning.py --seeds 0-19 -- --env frozenlake --slippery
    python tools/seeds.py 4_GRPO_MNIST/grpo_mnist.py --seeds 0-4 --metric val_pass1 -- --task number --iterations 300
    python tools/seeds.py --python .venv-peers/bin/python benchmarks/peers/sb3_dqn_cartpole.py --seeds 0-19 \
        --metric eval_return_mean --bar 475      # a peer runs in its own venv; the summary is the course's

Each seed is one subprocess, `python SCRIPT --seed S --out <sweep>/seed_S [flags after --]`, run one after
another, so its wall clock is the whole process (imports and compilation included). The sweep folder
(default `runs/seeds/<script>/<flags>_seeds-<seeds>/`) gets every run's own folder and log, `summary.json`, `summary.md`
(a table with the command that made it) and `scores.png`. With `--save NAME` the summary also goes to
`benchmarks/results/NAME.json` with its provenance (command, date, machine, load, package versions); the READMEs
quote it through `<!-- results: NAME -->` markers that `python tools/results.py` fills (never by hand).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import RESULTS_DIR, fmt, provenance  # noqa: E402


@dataclass(frozen=True)
class Headline:
    """A module's headline metric (a key of its metrics.json) and the bar a seed must reach to count as solved."""

    metric: str
    bar: float | None  # None: no bar, nothing is "solved"


# The headline of each module, keyed by the script's folder. A boolean metric counts as 1 (true) or 0.
HEADLINES = {
    "1_Q_Learning": Headline("policy_is_optimal", 1.0),
    "2_Cart_Pole_DQN": Headline("eval_return_mean", 475.0),
    "3_Pendulum": Headline("eval_return_mean", -200.0),
    "4_GRPO_MNIST": Headline("test_pass1", None),
}


class SweepError(Exception):
    """Bad input or a failed run: main prints it as one line and exits non-zero."""


# ----------------------------------------------------------------------------- statistics


def parse_seeds(text: str) -> list[int]:
    """'0-19' -> [0, …, 19]; '3' -> [3]; '0,5,7-9' -> [0, 5, 7, 8, 9]. Seeds are >= 0, distinct, in order given."""
    seeds: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise SweepError(f"--seeds: cannot read {text!r} (use forms like 0-19, 3 or 0,5,7-9)")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise SweepError(f"--seeds: empty range {part.strip()!r} in {text!r}")
        seeds += range(lo, hi + 1)
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds: {text!r} names a seed twice")
    return seeds


def seed_summary(x, bar: float = -np.inf) -> dict:
    """The course's one implementation of the many-seed statistics, for every module's sweeps and for the per-seed
    scores of a --num-seeds run (tools/pg_ladder.py): mean, IQM (25 % trimmed mean) with a 95 % percentile-bootstrap
    CI (10,000 resamples of the seeds, fixed bootstrap seed 0, so the same scores always give the same interval; None
    for one seed, [x, x] when every seed scored x), min, max, std (ddof 0), and how many reach `bar`."""
    from scipy import stats  # on first use: a sweep checks its input before it pays for importing scipy

    x, iqm = np.asarray(x, float), partial(stats.trim_mean, proportiontocut=0.25)
    ci = [float(x[0])] * 2 if len(x) >= 2 and np.all(x == x[0]) else None  # every resample's IQM is that one point
    if len(x) >= 2 and ci is None:
        res = stats.bootstrap((x,), iqm, n_resamples=10_000, method="percentile", random_state=np.random.default_rng(0))
        ci = [float(res.confidence_interval.low), float(res.confidence_interval.high)]
    return dict(
        mean=float(x.mean()),
        iqm=float(iqm(x)),
        min=float(x.min()),
        max=float(x.max()),
        std=float(x.std()),
        solved=int((x >= bar).sum()),
        n=len(x),
        iqm_ci=ci,
    )


def iqm(x) -> float:
    """Interquartile mean: the mean of the middle 50 % of the scores (25 % trimmed from each end)."""
    return seed_summary(x)["iqm"]


def iqm_ci(x) -> tuple[float, float] | None:
    """95 % percentile-bootstrap confidence interval of the IQM (resampling seeds); None for fewer than 2 scores."""
    ci = seed_summary(x)["iqm_ci"]
    return None if ci is None else (ci[0], ci[1])


def summarise(scores: dict[int, float], seconds: dict[int, float], headline: Headline) -> dict:
    """Everything the table shows, from the per-seed scores and wall clocks of the runs that finished."""
    x = np.array(list(scores.values()), dtype=float)
    across = seed_summary(x, -np.inf if headline.bar is None else headline.bar)  # no bar: solved is None below
    return {
        "metric": headline.metric,
        "bar": headline.bar,
        "n": across["n"],
        "per_seed": {str(s): v for s, v in scores.items()},
        "mean": across["mean"],
        "median": float(np.median(x)),
        "min": across["min"],
        "max": across["max"],
        "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,  # ddof 1 here; the lesson's std is ddof 0
        "iqm": across["iqm"],
        "iqm_ci95": across["iqm_ci"],
        "solved": None if headline.bar is None else across["solved"],
        "seconds_per_seed": {str(s): v for s, v in seconds.items()},
        "median_seconds": float(np.median(list(seconds.values()))),
    }


# ----------------------------------------------------------------------------- runs


def headline_for(script: Path, metric: str | None, bar: float | None) -> Headline:
    known = HEADLINES.get(script.parent.name)
    if metric is None and known is None:
        raise SweepError(f"{script}: not a course module with a known headline metric; pass --metric")
    if metric is None or (known is not None and metric == known.metric):
        return Headline(known.metric, known.bar if bar is None else bar)
    return Headline(metric, bar)


def run_seed(script: Path, seed: int, out: Path, flags: list[str], python: str = sys.executable) -> tuple[dict, float]:
    """Run the script for one seed with `python`; return (its metrics.json, whole-process seconds). Its output goes
    to run.log."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SweepError(f"seed {seed}: cannot create {out}: {e.strerror or e}") from None
    cmd = [python, str(script), *flags, "--seed", str(seed), "--out", str(out)]
    start = time.perf_counter()
    with open(out / "run.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise SweepError(f"seed {seed} failed (exit {proc.returncode}): {last}  [log: {out / 'run.log'}]")
    try:
        metrics = json.loads((out / "latest" / "metrics.json").read_text())
    except (OSError, ValueError) as e:
        raise SweepError(f"seed {seed}: cannot read {out / 'latest' / 'metrics.json'}: {e}") from None
    return metrics, seconds


def score_of(metrics: dict, headline: Headline, seed: int) -> float:
    if headline.metric not in metrics:
        raise SweepError(f"seed {seed}: metrics.json has no {headline.metric!r} (keys: {', '.join(sorted(metrics))})")
    value = metrics[headline.metric]
    if not isinstance(value, (bool, int, float)):
        raise SweepError(f"seed {seed}: {headline.metric}={value!r} is not a number")
    return float(value)


# ----------------------------------------------------------------------------- report


def markdown(summary: dict, seeds_text: str, command: str) -> str:
    x = np.array(list(summary["per_seed"].values()))
    ci = summary["iqm_ci95"]
    iqm_cell = fmt(summary["iqm"], x) + (f" [{fmt(ci[0], x)}, {fmt(ci[1], x)}]" if ci else "")
    bar = summary["bar"]
    solved = "–" if bar is None else f"{summary['solved']}/{summary['n']}"
    bar_head = "solved" if bar is None else f"solved (≥ {bar:g})"
    per_seed = " · ".join(f"{s}: {fmt(v, x)}" for s, v in summary["per_seed"].items())
    return "\n".join(
        [
            f"`{command}`",
            "",
            f"| metric | seeds | mean | median | min | IQM [95 % CI] | {bar_head} | median s/run |",
            "|---|---|---|---|---|---|---|---|",
            f"| `{summary['metric']}` | {seeds_text} ({summary['n']}) | {fmt(summary['mean'], x)} | "
            f"{fmt(summary['median'], x)} | {fmt(summary['min'], x)} | {iqm_cell} | {solved} | "
            f"{summary['median_seconds']:.1f} |",
            "",
            f"Per seed: {per_seed}" + (f" (std over seeds {fmt(summary['std'], x)})" if summary["n"] > 1 else ""),
            "",
        ]
    )


def plot(path: Path, summary: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = [int(s) for s in summary["per_seed"]]
    x = list(summary["per_seed"].values())
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(seeds) + 2), 3.6))
    ax.bar(range(len(seeds)), x, color="tab:blue", alpha=0.8, label=summary["metric"])
    ax.set_xticks(range(len(seeds)), [str(s) for s in seeds])
    ax.axhline(summary["iqm"], color="black", lw=1.2, label=f"IQM {summary['iqm']:.4g}")
    if summary["iqm_ci95"]:
        ax.axhspan(*summary["iqm_ci95"], color="black", alpha=0.12, label="IQM 95 % CI")
    if summary["bar"] is not None:
        ax.axhline(summary["bar"], color="tab:red", ls="--", lw=1.2, label=f"bar {summary['bar']:g}")
    lo, hi = min(x + [summary["bar"] or x[0]]), max(x + [summary["bar"] or x[0]])
    pad = 0.08 * (hi - lo or abs(hi) or 1.0)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("seed")
    ax.set_ylabel(summary["metric"])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(folder: Path, summary: dict, seeds_text: str, command: str, title: str) -> str:
    table = markdown(summary, seeds_text, command)
    (folder / "summary.json").write_text(json.dumps({**summary, "command": command}, indent=2))
    (folder / "summary.md").write_text(table)
    plot(folder / "scores.png", summary, title)
    return table


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags before `--`, the script's flags after it."""
    ours, script_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):
            raise SweepError(f"{message} (see --help)")

    p = OneLineParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after -- go to the script, e.g. -- --total-timesteps 20000.",
    )
    p.add_argument("script", help="a course script, e.g. 2_Cart_Pole_DQN/cart_pole_dqn.py")
    p.add_argument("--seeds", required=True, help="seeds to run: 0-19, 3, or 0,5,7-9")
    p.add_argument("--metric", default=None, help="metrics.json key to summarise (default: the module's headline)")
    p.add_argument("--bar", type=float, default=None, help="a seed is solved when metric >= bar (default: module's)")
    p.add_argument(
        "--also",
        default="",
        help="more metrics.json keys to summarise from the same runs, comma-separated; KEY@BAR also counts the seeds "
        "with KEY >= BAR as solved; with --save each is written to <results-dir>/SAVE.KEY.json",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter that runs each seed (default: this one); a peer's own venv, e.g. .venv-peers/bin/python",
    )
    p.add_argument("--tag", default=None, help="name of this sweep's folder (default: the script flags and the seeds)")
    p.add_argument("--out", default="runs/seeds", help="root folder of all sweeps")
    p.add_argument("--save", default=None, help="also write the summary to <results-dir>/SAVE.json for the READMEs")
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="folder of --save (default: benchmarks/results)")
    args = p.parse_args(ours)
    for f in ("--seed", "--out"):
        if any(a == f or a.startswith(f + "=") for a in script_flags):
            raise SweepError(f"{f} after -- is set by the sweep for each seed; remove it")
    return args, script_flags


def default_tag(flags: list[str], seeds_text: str) -> str:
    """A folder name per sweep: the script flags and the seeds, e.g. 'default_seeds-0-19', 'episodes_3_seeds-0-2'.
    Flags longer than 80 characters are cut and end in a hash of all of them, so two sweeps never share a folder."""
    name = "_".join(a.lstrip("-") for a in flags) or "default"
    if len(name) > 80:
        name = f"{name[:71]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return re.sub(r"[^A-Za-z0-9.=_-]+", "_", f"{name}_seeds-{seeds_text}").strip("_")


def also_headline(item: str) -> Headline:
    """One --also item: 'KEY' (no bar) or 'KEY@BAR' (KEY >= BAR counts as solved)."""
    key, _, bar = item.partition("@")
    try:
        return Headline(key, float(bar) if bar else None)
    except ValueError:
        raise SweepError(f"--also: cannot read the bar of {item!r} (use KEY or KEY@BAR, e.g. test_pass8@0.9)") from None


def check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise SweepError(f"cannot write into {folder}: {e.strerror or e}") from None


def main(argv: list[str] | None = None) -> dict:
    args, flags = parse_args(sys.argv[1:] if argv is None else argv)
    script = Path(args.script)
    if not script.is_file() or script.suffix != ".py":
        raise SweepError(f"no such script {args.script!r} (give a path like 2_Cart_Pole_DQN/cart_pole_dqn.py)")
    seeds = parse_seeds(args.seeds)
    headline = headline_for(script.resolve(), args.metric, args.bar)
    folder = Path(args.out) / script.stem.lower() / (args.tag or default_tag(flags, args.seeds))
    check_writable(folder)  # before any run
    if args.save:
        if not re.fullmatch(r"[\w-]+", args.save):
            raise SweepError(f"--save {args.save!r}: use letters, digits, _ and -")
        check_writable(Path(args.results_dir))
    command = " ".join(
        ["python", "tools/seeds.py"]
        + (["--python", shlex.quote(args.python)] if args.python != sys.executable else [])
        + [args.script, "--seeds", args.seeds]
        + (["--metric", args.metric] if args.metric else [])
        + (["--bar", f"{args.bar:g}"] if args.bar is not None else [])
        + (["--also", args.also] if args.also else [])
        + (["--save", args.save] if args.save else [])
        + (["--", *map(shlex.quote, flags)] if flags else [])
    )
    measured = provenance(command)  # the load average as the sweep starts
    print(f"sweep: {script} seeds={args.seeds} metric={headline.metric} bar={headline.bar} folder={folder}", flush=True)

    scores: dict[int, float] = {}
    seconds: dict[int, float] = {}
    also = {also_headline(item): {} for item in filter(None, args.also.split(","))}  # Headline -> {seed: value}
    failure = None
    try:
        for seed in seeds:
            metrics, secs = run_seed(script, seed, folder / f"seed_{seed}", flags, args.python)
            scores[seed], seconds[seed] = score_of(metrics, headline, seed), secs
            for key, values in also.items():
                values[seed] = score_of(metrics, key, seed)
            solved = "" if headline.bar is None else f" solved={'yes' if scores[seed] >= headline.bar else 'no'}"
            print(f"seed={seed} {headline.metric}={scores[seed]:.4f}{solved} seconds={secs:.1f}", flush=True)
    except SweepError as e:
        failure = str(e)
    except KeyboardInterrupt:
        failure = "interrupted"

    summary = {}
    if scores:  # whatever finished is summarised and saved, even after a failure
        summary = summarise(scores, seconds, headline)
        done = ",".join(map(str, scores)) if failure else args.seeds
        print("\n" + write_report(folder, summary, done, command, f"{script.name}: {command.split(' -- ')[-1]}"))
        print(f"wrote {folder}/summary.json, summary.md, scores.png", flush=True)
        if args.save and not failure:
            saved = Path(args.results_dir) / f"{args.save}.json"
            saved.write_text(json.dumps({**summary, "provenance": measured}, indent=2, ensure_ascii=False) + "\n")
            print(f"wrote {saved}", flush=True)
            for key, values in also.items():  # the same runs, another metric: SAVE.KEY.json
                extra = {**summarise(values, seconds, key), "provenance": measured}
                extra_path = Path(args.results_dir) / f"{args.save}.{key.metric}.json"
                extra_path.write_text(json.dumps(extra, indent=2, ensure_ascii=False) + "\n")
                print(f"wrote {extra_path}", flush=True)
    if failure:
        raise SweepError(failure + (f" ({len(scores)} finished run(s) summarised in {folder})" if scores else ""))
    return summary


if __name__ == "__main__":
    try:
        main()
    except SweepError as e:
        sys.exit(f"error: {e}")
