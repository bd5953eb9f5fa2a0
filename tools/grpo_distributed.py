"""GRPO as 2 processes × 2 CPU devices (--distributed) next to 1 process × 4 devices: the same run, and its time.

    python tools/grpo_distributed.py                  # the table the benchmarks page quotes
    python tools/capture.py grpo_distributed -- python tools/grpo_distributed.py
    python tools/capture.py grpo_distributed_run -- python tools/grpo_distributed.py --run   # the module README's

`--run` runs the module README's two commands once (process 1 in the background, its output dropped; process 0 in
front, --out runs/capture/grpo_distributed) and prints what process 0 printed, stdout and stderr as a terminal shows
them. Otherwise:

Both layouts run 4_GRPO_MNIST/grpo_mnist.py with its default flags (1500 RL iterations after 300 SFT steps) and
--compile-cache '' (each run compiles, as a first run does), --repeats times each, one run at a time, alternating.
Whole: from starting the process(es) to the last one's exit. train_seconds: the run's own clock around SFT, RL and
validation scoring (metrics.json). Outside it: start-up (imports, joining, reading MNIST), the test set, the
checkpoint and the figure. A steady RL block: the median `sec` of the RL blocks after the first (which compiles),
150 iterations each; the difference per iteration is what the collectives between the processes (Gloo over
localhost) cost over those inside one process. Then the two runs' scores side by side, where their histories part
(the largest difference between two logged numbers at each validation score), and the largest difference overall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, free_port  # noqa: E402

SCRIPT = REPO / "4_GRPO_MNIST" / "grpo_mnist.py"


def one_process(out: Path, flags: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *flags, "--host-devices", "4", "--out", str(out)], capture_output=True, text=True
    )
    if proc.returncode:
        sys.exit(f"error: 1 process: {proc.stderr.strip().splitlines()[-1]}")
    return time.perf_counter() - start


def two_processes(out: Path, flags: list[str]) -> float:
    common = [sys.executable, str(SCRIPT), *flags, "--host-devices", "2", "--distributed"]
    common += ["--coordinator-address", f"localhost:{free_port()}", "--num-processes", "2"]
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*common, "--process-id", str(i), "--out", str(out if i == 0 else out.with_name("p1"))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    errors = [p.communicate()[1] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"error: 2 processes: {errors}")
    return time.perf_counter() - start


def readme_run() -> None:
    """The module README's two commands, on the port it names; process 0's output goes to this process's."""
    flags = ["--distributed", "--coordinator-address", "localhost:12355", "--num-processes", "2", "--host-devices", "2"]
    out = ["--out", "runs/capture/grpo_distributed"]
    one = subprocess.Popen([sys.executable, str(SCRIPT), *flags, "--process-id", "1", *out], stdout=subprocess.DEVNULL)
    zero = subprocess.run([sys.executable, str(SCRIPT), *flags, "--process-id", "0", *out], stderr=subprocess.STDOUT)
    if one.wait() or zero.returncode:
        sys.exit(f"error: the two processes ended with status {zero.returncode} and {one.returncode}")


def summary(metrics: dict) -> dict:
    rl = [row["seconds"] for row in metrics["history"] if row["phase"] == "rl"][1:]
    return {"train": metrics["train_seconds"], "block": statistics.median(rl)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flags", default="--compile-cache=", help="more flags for the script, as one string")
    p.add_argument("--run", action="store_true", help="run the module README's two commands once, show process 0")
    args = p.parse_args()
    if args.run:
        return readme_run()
    flags = args.flags.split()
    runs = {"1 process × 4 devices": [], "2 processes × 2 devices": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, launch in zip(runs, (one_process, two_processes)):
                out = Path(tmp) / f"{len(runs[name])}-{name[0]}" / "p0"
                whole = launch(out, flags)
                metrics = json.loads((out / "latest" / "metrics.json").read_text())
                runs[name].append({"whole": whole, **summary(metrics), "metrics": metrics})
                print(
                    f"ran {name} #{r + 1}: whole {whole:.1f} s, train_seconds {metrics['train_seconds']:.1f} s",
                    flush=True,
                )
    print(f"\nflags: (defaults) {' '.join(flags)}; median of {args.repeats} runs each, one at a time\n")
    print("| layout | whole process(es) | train_seconds | outside training | steady RL block (150 it.) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    medians = {}
    for name, rows in runs.items():
        med = {k: statistics.median(row[k] for row in rows) for k in ("whole", "train", "block")}
        medians[name] = med
        print(
            f"| {name} | {med['whole']:.1f} s | {med['train']:.1f} s | {med['whole'] - med['train']:.1f} s "
            f"| {med['block']:.2f} s |"
        )
    one, two = medians.values()
    print(
        f"\ntwo processes: {two['whole'] - one['whole']:+.1f} s in all; {two['train'] - one['train']:+.1f} s in "
        f"training, of which {(two['block'] - one['block']) / 150 * 1000:+.2f} ms per RL iteration in a steady block; "
        f"{(two['whole'] - two['train']) - (one['whole'] - one['train']):+.1f} s outside training"
    )
    a, b = (rows[0]["metrics"] for rows in runs.values())
    keys = ("val_pass1", "val_pass8", "val_greedy", "test_pass1", "test_pass8", "test_greedy")
    print("\n| layout | " + " | ".join(keys) + " |\n| --- |" + " ---: |" * len(keys))
    for name, m in zip(runs, (a, b)):
        print(f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")
    print("\nwhere the two runs part (the first run of each layout), at every validation score:")
    print("| phase | iteration | val_pass1 (1 × 4) | val_pass1 (2 × 2) | largest difference in the row |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for x, y in zip(a["history"], b["history"], strict=True):
        gap = max(abs(x[k] - y[k]) for k in x if k not in ("phase", "iteration", "seconds"))
        print(f"| {x['phase']} | {x['iteration']} | {x['val_pass1']:.4f} | {y['val_pass1']:.4f} | {gap:.2e} |")
    same = all(a[k] == b[k] for k in keys)
    worst = max(
        abs(x[k] - y[k])
        for x, y in zip(a["history"], b["history"], strict=True)
        for k in x
        if k not in ("phase", "iteration", "seconds")
    )
    print(
        f"\nfinal scores identical: {same}; largest difference in the logged history: {worst:.2e} "
        f"(over {len(a['history'])} rows)"
    )
    print(f"cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
