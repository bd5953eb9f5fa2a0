"""Measure the answers to 5_Sharding_Mesh's exercises and the costs in its bug table.

    python tools/mesh_answers.py fallback      # exercise 1: ("embed", "model") after ("mlp", "model") in tp
    python tools/mesh_answers.py meshes        # exercise 2: every rule set on an 8x1 and a 1x8 mesh
    python tools/mesh_answers.py sgd           # exercise 3: optax.sgd in place of optax.adam
    python tools/mesh_answers.py fsdp-8b       # exercise 4: the 8B model under fsdp on meshes of 1, 2 and 4 devices
    python tools/mesh_answers.py skip-layout   # exercise 5: TinyLM without batch_layout for position, or for table
    python tools/mesh_answers.py bugs          # the bug table: rules as a dict, a plain nnx.Linear, names missing,
                                               # the 8B model counted in bf16 only, a step that donates nothing

A change to the script is made on a copy in a temporary folder, never in the repository. The tool prints the change
as a diff, what the changed script printed, and, for sgd and skip-layout, whether the test named for it fails on a
copy of the repository with that change (it must). The others compute with the script's own functions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script, pytest_on_a_changed_copy  # noqa: E402
from course import changed_source as course_changed_source  # noqa: E402

SCRIPT = "5_Sharding_Mesh/sharding_mesh.py"

# (source piece, its replacement): each piece occurs exactly once in the script (tests/test_sharding.py checks it).
CHANGES = {
    "fallback": (
        '"tp": (("vocab", "model"), ("heads", "model"), ("mlp", "model")),',
        '"tp": (("vocab", "model"), ("heads", "model"), ("mlp", "model"), ("embed", "model")),',
    ),
    "sgd": (
        "nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param)",
        "nnx.Optimizer(model, optax.sgd(args.learning_rate), wrt=nnx.Param)",
    ),
    "skip-position": (
        'position = batch_layout(self.pos_embed[...][:L], ("length", "embed"), rules)  # (L, E)',
        "position = self.pos_embed[...][:L]  # (L, E)",
    ),
    "skip-table": (
        'table = batch_layout(self.token_embed.embedding[...], ("vocab", "embed"), rules)  # (V, E)',
        "table = self.token_embed.embedding[...]  # (V, E)",
    ),
}
# The test meant to catch each change that runs the script (tests/test_sharding.py).
CATCHING_TEST = {
    "sgd": "test_state_shardings_follow_the_logical_names_for_params_and_adam",
    "skip-position": "test_cli_fsdp_compiles_without_full_rematerialization",
    "skip-table": "test_cli_fsdp_compiles_without_full_rematerialization",
}
REMAT = "Involuntary full rematerialization"


def changed_source(change: str) -> str:
    return course_changed_source(SCRIPT, change, *CHANGES[change])


def show_change(change: str) -> None:
    piece, replacement = CHANGES[change]
    print(f"change in {SCRIPT}:\n-    {piece}\n+    {replacement}")


def run_changed(change: str, flags: list[str], folder: Path) -> subprocess.CompletedProcess:
    """Run a copy of the script with `change` made, from the repository root, with `flags`."""
    script = folder / f"{change}.py"
    script.write_text(changed_source(change))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(script), *flags, "--out", str(folder / change)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )


def catching_test_fails(change: str) -> str:
    """Run the test named for `change` on a copy of the repository with the change made: 'fails' or 'PASSES'."""
    parts = ("5_Sharding_Mesh", "tests", "tools")
    verdict = pytest_on_a_changed_copy(
        SCRIPT, changed_source(change), parts, ["tests/test_sharding.py", "-k", CATCHING_TEST[change]]
    )
    return f"tests/test_sharding.py::{CATCHING_TEST[change]} on a copy with this change: {verdict}"


def exception_line(stderr: str) -> str:
    """The last 'SomeError: message' line of a traceback, without the exception's module path."""
    lines = [line for line in stderr.splitlines() if re.match(r"^[\w.]+(Error|Exception): ", line)]
    if not lines:
        return first_line(stderr.strip().splitlines()[-1] if stderr.strip() else "")
    name, _, message = lines[-1].partition(": ")
    return f"{name.rsplit('.', 1)[-1]}: {message}"


def first_line(text: str, width: int = 110) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(nothing)"
    return line if len(line) <= width else line[: width - 1] + "…"


# ---------------------------------------------------------------- the answers


def fallback() -> None:
    """Exercise 1: which weights change their spec when tp gets the fallback rule ('embed', 'model')."""
    sm = load_script(SCRIPT)
    show_change("fallback")
    tp = sm.RULE_SETS["tp"]
    with_fallback = (*tp, ("embed", "model"))
    _, abstract = sm.abstract_state(sm.Args())
    model = sm.nnx.to_flat_state(sm.nnx.get_partition_spec(abstract["model"]))
    print(f"{'weight':<24}{'logical axes':<28}{'tp':<24}tp + fallback")
    changed = []
    for path, names in model:
        names = tuple(names)
        before, after = (sm.fmt_spec(sm.logical_to_mesh_axes(names, rules)) for rules in (tp, with_fallback))
        name = "/".join(map(str, path))
        changed += [name] if before != after else []
        print(f"{name:<24}{str(names):<28}{before:<24}{after}{'  <- changed' if before != after else ''}")
    print(f"weights whose spec changes: {', '.join(changed) or 'none'}")


def meshes() -> None:
    """Exercise 2: the state bytes per device of every rule set on an 8x1 and a 1x8 mesh, from the script's runs
    (--host-devices 8 --mesh 8x1 or 1x8 --no-visualize), and their checks."""
    columns = {}
    for mesh in ("8x1", "1x8"):
        with tempfile.TemporaryDirectory() as tmp:
            flags = ["--host-devices", "8", "--mesh", mesh, "--no-visualize", "--out", tmp]
            proc = subprocess.run(
                [sys.executable, str(REPO / SCRIPT), *flags], cwd=REPO, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise SystemExit(f"error: sharding_mesh.py --mesh {mesh} failed: {exception_line(proc.stderr)}")
            columns[mesh] = json.loads((Path(tmp) / "latest" / "metrics.json").read_text())
    print(f"{'state':<10}" + "".join(f"{mesh:>14}{'vs dp':>7}" for mesh in columns))
    for name in columns["8x1"]["rules"]:
        cells = [
            (m["bytes_per_device"][name], m["bytes_per_device"][name] / m["bytes_per_device"]["dp"])
            for m in columns.values()
        ]
        print(f"{name:<10}" + "".join(f"{b:>14,}{r:>7.2f}" for b, r in cells))
    print("check passed: " + ", ".join(f"{mesh}: {m['check_passed']}" for mesh, m in columns.items()))


def sgd() -> None:
    """Exercise 3: the bytes per device and the compiled step with plain SGD (no Adam moments)."""
    show_change("sgd")
    with tempfile.TemporaryDirectory() as tmp:
        proc = run_changed("sgd", ["--no-visualize", "--log-every", "40"], Path(tmp))
    if proc.returncode != 0:
        raise SystemExit(f"error: the changed script failed: {exception_line(proc.stderr)}")
    for line in proc.stdout.splitlines():
        if line.startswith(("=== rule set", "  bytes/device", "  compiled step")):
            print(line.split(":")[0] if line.startswith("===") else line)
    print(catching_test_fails("sgd"))


def fsdp_8b() -> None:
    """Exercise 4: GB per device of the 8B model under fsdp, by mesh, and what an 80 GB chip has left."""
    sm = load_script(SCRIPT)
    widths, _ = sm.MEMORY_COUNTS["mixed"]
    print(
        f"{'mesh':<8}{'devices':>8}{'GB per device':>15}{'left of 80 GB':>15}   (8B model, fsdp, {sum(widths)} B/param)"
    )
    for data, model in ((1, 1), (2, 1), (2, 2), (4, 1), (1, 4)):
        total = sm.big_model_memory(sm.RULE_SETS["fsdp"], {"data": data, "model": model}, widths)["total_gb"]
        print(f"{data}x{model:<6}{data * model:>8}{total:>15.2f}{80 - total:>15.2f}")


def skip_layout() -> None:
    """Exercise 5: TinyLM without batch_layout for position, then for table, in both axis modes."""
    for change in ("skip-position", "skip-table"):
        show_change(change)
        for axes in ("auto", "explicit"):
            flags = ["--rules", "fsdp", "--steps", "2", "--no-visualize", "--axis-types", axes, "--compile-cache", ""]
            with tempfile.TemporaryDirectory() as tmp:
                proc = run_changed(change, flags, Path(tmp))
            remats = [line for line in proc.stderr.splitlines() if REMAT in line]
            if proc.returncode == 0:
                verdict = re.search(r"check=(\w+)", proc.stdout)
                what = f"runs, check={verdict.group(1) if verdict else '?'}"
            else:
                what = f"stops with {exception_line(proc.stderr)}"
            print(f"  --axis-types {axes:<9} {what}; {REMAT!r} on stderr {len(remats)} time(s)")
        print(catching_test_fails(change))


def bugs() -> None:
    """The bug table's costs, each computed with the script's own code or Flax's."""
    import flax.linen as nn
    import jax

    sm = load_script(SCRIPT)
    nnx = sm.nnx
    rules = {"embed": "data", "mlp": "model"}
    mesh = sm.make_mesh((1, 1), jax.devices()[:1])
    init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("embed", "mlp"))

    def error(call, width: int = 100) -> str:
        try:
            return f"gives {call()}"
        except Exception as e:  # noqa: BLE001 - the error is the measurement
            return f"raises {type(e).__name__}: {first_line(str(e), width)}"

    def eager_linear(rule_set):
        with jax.set_mesh(mesh), nnx.logical_axis_rules(rule_set):
            return nnx.Linear(8, 16, use_bias=False, kernel_init=init, rngs=nnx.Rngs(0)).kernel.shape

    linen, eager = (
        error(lambda: nn.logical_to_mesh_axes(("embed", "mlp"), rules), 19),
        error(lambda: eager_linear(rules)),
    )
    print(f"rules as a dict {rules}: flax.linen.logical_to_mesh_axes {linen}")
    print(f"  nnx.Linear inside jax.set_mesh and nnx.logical_axis_rules {eager}")
    missing = error(lambda: eager_linear(sm.RULE_SETS["tp"]))
    print(f"names missing: nnx.Linear inside nnx.logical_axis_rules(RULE_SETS['tp'])\n  {missing}")
    sizes = {"data": 4, "model": 2}
    plain = nnx.Linear(64, 256, use_bias=False, rngs=nnx.Rngs(0))
    named = nnx.Linear(64, 256, use_bias=False, kernel_init=sm.with_axes(("embed", "mlp")), rngs=nnx.Rngs(0))
    cells = []
    for label, layer in (("without nnx.with_partitioning", plain), ("with with_axes", named)):
        spec = nnx.to_pure_dict(sm.mesh_specs(nnx.state(layer), sm.RULE_SETS["fsdp"]))["kernel"]
        cells.append(f"{label} {spec} {sm.analytic_bytes((64, 256), 4, spec, sizes):,} B")
    print(f"nnx.Linear(64, 256) kernel per device, fsdp on 4x2: {'; '.join(cells)}")
    cells = []
    for count, (widths, _) in sm.MEMORY_COUNTS.items():
        total = sm.big_model_memory(sm.RULE_SETS["dp"], sizes, widths)["total_gb"]
        cells.append(f"--memory-count {count} {total:.2f} GB fits={total <= 80}")
    print(f"8B model per device, dp on 4x2, 80 GB chips: {'; '.join(cells)}")
    print("compiled step per device, fsdp on 4x2 (sharding_mesh.py --rules fsdp --steps 2):")
    for donate in ("--donate", "--no-donate"):
        with tempfile.TemporaryDirectory() as tmp:
            flags = ["--rules", "fsdp", "--steps", "2", "--no-visualize", donate, "--out", tmp]
            proc = subprocess.run(
                [sys.executable, str(REPO / SCRIPT), *flags], cwd=REPO, capture_output=True, text=True
            )
        if proc.returncode != 0:
            raise SystemExit(f"error: sharding_mesh.py {donate} failed: {exception_line(proc.stderr)}")
        line = next(x for x in proc.stdout.splitlines() if x.startswith("  compiled step per device"))
        print(f"  {donate:<12} {line.split(': ', 1)[1].replace(' (XLA memory_analysis)', '')}")


ANSWERS = {
    "fallback": fallback,
    "meshes": meshes,
    "sgd": sgd,
    "fsdp-8b": fsdp_8b,
    "skip-layout": skip_layout,
    "bugs": bugs,
}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("answer", choices=list(ANSWERS), help="which answer to measure")
    ANSWERS[p.parse_args(argv).answer]()


if __name__ == "__main__":
    main()
