"""Bytes per device for every rule set of 5_Sharding_Mesh/sharding_mesh.py on 1, 2, 4 and 8 devices, and its check.

Runs the script once per device count (`--host-devices N`, the default mesh for N, every rule set, the default
model and steps), reads each run's metrics.json, and prints two tables: the total bytes per device on every mesh,
and the equivalence check's largest |sharded - single device| beside the same difference after step 1 of two separate
runs (not checked). Every number is measured from the arrays' shards; the script itself stops if one differs from the
analytic count. The figure draws the params / grads / Adam bytes on the largest mesh and the first table.

    python tools/mesh_bytes.py                       # writes 5_Sharding_Mesh/assets/bytes_per_device.png
    python tools/mesh_bytes.py --devices 2,4 --figure ''   # no figure
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "5_Sharding_Mesh" / "sharding_mesh.py"
PARTS = ("params", "grads", "adam")


def run_script(devices: int, out: Path) -> dict:
    """One run of the script on `devices` faked CPU devices; its metrics.json."""
    command = [sys.executable, str(SCRIPT), "--host-devices", str(devices), "--no-visualize", "--out", str(out)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: sharding_mesh.py --host-devices {devices} failed: {last}")
    return json.loads((out / "latest" / "metrics.json").read_text())


def mesh_label(metrics: dict) -> str:
    return f"{metrics['devices']} ({metrics['mesh']['data']}x{metrics['mesh']['model']})"


def tables(runs: list[dict]) -> str:
    """The two tables, as text, from the runs' metrics (ordered by device count)."""
    rule_sets = runs[0]["rules"]
    largest = runs[-1]
    lines = ["total bytes per device, measured from the shards (float32), by device count (mesh data x model):"]
    lines.append(f"  {'rule set':<9}" + "".join(f"{mesh_label(m):>12}" for m in runs) + f"{'vs dp':>8}")
    dp_total = largest["bytes_per_device"].get("dp")
    for name in rule_sets:
        ratio = f"{largest['bytes_per_device'][name] / dp_total:8.2f}" if dp_total else ""
        lines.append(f"  {name:<9}" + "".join(f"{m['bytes_per_device'][name]:>12,}" for m in runs) + ratio)

    lines.append("\nthe check: largest |sharded - single device| over the loss and every updated value, last step;")
    lines.append(
        "[in brackets, not the check: the same after step 1 of two separate runs, each from a fresh Adam state]"
    )
    lines.append(f"  {'rule set':<9}" + "".join(f"{mesh_label(m):>21}" for m in runs))
    for name in rule_sets:
        cells = []
        for m in runs:
            r = m["rule_sets"][name]
            check = f"{r['max_abs_diff_vs_single_device']:.2e}" if m["devices"] > 1 else "n/a"
            cells.append(f"{check} [{r['fresh_adam_step1_max_abs_diff']:.2e}]".rjust(21))
        lines.append(f"  {name:<9}" + "".join(cells))
    verdicts = ", ".join(f"{m['devices']}: {'n/a' if m['check_passed'] is None else m['check_passed']}" for m in runs)
    lines.append(
        f"  n/a: one device, nothing is sharded. Check passed (tolerance {largest['tolerance']:g}): {verdicts}"
    )
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Left: params / grads / Adam stacked per rule set on the largest mesh. Right: the total per device by count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rule_sets, largest = runs[0]["rules"], runs[-1]
    fig, (ax_parts, ax_count) = plt.subplots(1, 2, figsize=(10, 3.8))
    bottom = [0.0] * len(rule_sets)
    for part, label in zip(PARTS, ("weights", "gradients", "Adam m + v")):
        kib = [largest["rule_sets"][n]["bytes_per_device"][part] / 1024 for n in rule_sets]
        ax_parts.bar(rule_sets, kib, bottom=bottom, label=label)
        bottom = [b + k for b, k in zip(bottom, kib)]
    ax_parts.set(ylabel="KiB per device", title=f"what each device holds, {mesh_label(largest)} devices")
    ax_parts.legend(fontsize=8)
    counts = [m["devices"] for m in runs]
    totals = {name: [m["bytes_per_device"][name] for m in runs] for name in rule_sets}
    for k, name in enumerate(rule_sets):
        same = [other for other in rule_sets[:k] if totals[other] == totals[name]]
        label = f"{name} (same as {same[0]})" if same else name
        kib = [t / 1024 for t in totals[name]]
        ax_count.plot(counts, kib, marker="os^D"[k % 4], ms=9 - 2 * k, ls=("-", "--", ":", "-.")[k % 4], label=label)
    ax_count.set(
        xscale="log",
        yscale="log",
        xticks=counts,
        xticklabels=[mesh_label(m) for m in runs],
        xlabel="devices (mesh data x model)",
        ylabel="KiB per device (total)",
        title="total per device as the mesh grows",
    )
    ax_count.minorticks_off()
    low, high = min(map(min, totals.values())) / 1024, max(map(max, totals.values())) / 1024
    ticks = [2.0**k for k in range(-10, 40) if low / 2 <= 2**k <= high * 2]  # powers of two: halvings line up
    ax_count.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax_count.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", default="1,2,4,8", help="comma-separated device counts, smallest first")
    p.add_argument(
        "--figure",
        default="5_Sharding_Mesh/assets/bytes_per_device.png",
        help="where the figure goes, relative to the repository root ('' = no figure)",
    )
    a = p.parse_args(argv)
    try:
        counts = sorted(int(c) for c in a.devices.split(","))
    except ValueError:
        p.exit(1, f"error: --devices must be comma-separated integers, got {a.devices!r}\n")
    if not counts or counts[0] < 1:
        p.exit(1, f"error: --devices must be positive, got {a.devices!r}\n")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_script(n, Path(tmp) / str(n)) for n in counts]
    print(tables(runs))
    if a.figure:
        plot(runs, REPO / a.figure)


if __name__ == "__main__":
    main()
