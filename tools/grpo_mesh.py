"""GRPO on 1, 2 and 4 faked CPU devices under each rule set: what one device holds, and what the compiled step needs.

    python tools/grpo_mesh.py                      # the table 4_GRPO_MNIST/README.md quotes
    python tools/capture.py grpo_mesh -- python tools/grpo_mesh.py

Each cell is one short `--task number` run of 4_GRPO_MNIST/grpo_mnist.py (`--host-devices N --rules R`, 100 SFT
steps, then --iterations RL iterations in one block, --no-score-test) in its own process, because JAX fixes its
device count when it starts. From each run's metrics.json["mesh"]: the bytes of the policy + Adam state on the first
device (measured from its shards), of π_ref there, of the critic + Adam that PPO would add under the same rules, and
XLA's memory_analysis of the compiled RL block (arguments, outputs, temporaries); and the run's validation pass@1,
which must not depend on the mesh.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "4_GRPO_MNIST" / "grpo_mnist.py"


def run(devices: int, rules: str, iterations: int, out: Path) -> dict:
    flags = ["--task", "number", "--sft-steps", "100", "--iterations", str(iterations), "--eval-every", str(iterations)]
    flags += ["--no-score-test", "--host-devices", str(devices), "--rules", rules, "--out", str(out)]
    proc = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {devices} devices, rules {rules}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads((out / "metrics.json").read_text())


def kb(n: int) -> str:
    return f"{n / 1000:,.0f} kB"  # kB = 1,000 bytes, as GB = 10⁹ in module 5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", default="1,2,4", help="device counts, comma-separated")
    p.add_argument("--iterations", type=int, default=20, help="RL iterations per run (also the compiled block)")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rules in ("dp", "fsdp"):
            for n in (int(d) for d in args.devices.split(",")):
                m = run(n, rules, args.iterations, Path(tmp) / f"{rules}_{n}")
                rows.append((n, rules, m["mesh"], m["val_pass1"]))
                print(f"ran devices={n} rules={rules} val_pass1={m['val_pass1']:.4f}", flush=True)
    total = rows[0][2]["policy_adam_bytes_total"]
    print(f"\npolicy + Adam state in all: {kb(total)} (float32 weights, Adam's m and v); per device:")
    print("| devices | rules | policy + Adam | π_ref | critic + Adam (PPO) ", end="")
    print("| compiled: arguments | outputs | temp | val pass@1 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, rules, mesh, pass1 in rows:
        c = mesh["compiled_block"]
        compiled = [kb(c[k]) for k in ("argument", "output", "temp")] if c else ["not reported"] * 3
        cells = [
            str(n),
            rules,
            kb(mesh["policy_adam_bytes"]),
            kb(mesh["reference_bytes"]),
            kb(mesh["critic_adam_bytes"]),
        ]
        print("| " + " | ".join(cells + compiled + [f"{pass1:.4f}"]) + " |")
    spread = max(r[3] for r in rows) - min(r[3] for r in rows)
    print(f"\nval pass@1 spread across the {len(rows)} runs: {spread:.4f}")


if __name__ == "__main__":
    main()
