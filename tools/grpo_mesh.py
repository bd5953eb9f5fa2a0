"""GRPO on 1, 2 and 4 faked CPU devices under each rule set: what one device holds, and what the compiled step needs.

    python tools/grpo_mesh.py                      # the table 4_GRPO_MNIST/README.md quotes
    python tools/capture.py grpo_mesh -- python tools/grpo_mesh.py

Each cell is one short `--task number` run of 4_GRPO_MNIST/grpo_mnist.py (`--host-devices N --rules R`, 100 SFT
steps, then --iterations RL iterations in one block, --no-score-test) in its own process, because JAX fixes its
device count when it starts: this tool again, as `--cell`, which runs the script's `main` and then measures, on the
same mesh (`mesh_memory`): the bytes of the policy + Adam state on the first device (measured from its shards), of
π_ref there, of the critic + Adam that PPO would add under the same rules, and XLA's memory_analysis of the compiled
RL block (arguments, outputs, temporaries), written to <out>/mesh.json beside the run's folder; and the run's
validation pass@1, which must not depend on the mesh.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "4_GRPO_MNIST" / "grpo_mnist.py"


def run(devices: int, rules: str, iterations: int, out: Path) -> dict:
    """One cell in a process of its own: the script's metrics.json, with the cell's measurement under "mesh"."""
    flags = ["--task", "number", "--sft-steps", "100", "--iterations", str(iterations), "--eval-every", str(iterations)]
    flags += ["--no-score-test", "--host-devices", str(devices), "--rules", rules, "--out", str(out)]
    proc = subprocess.run([sys.executable, __file__, "--cell", *flags], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {devices} devices, rules {rules}: {proc.stderr.strip().splitlines()[-1]}")
    metrics = json.loads((out / "latest" / "metrics.json").read_text())
    return {**metrics, "mesh": json.loads((out / "mesh.json").read_text())}


def bytes_on(tree, device) -> int:
    """Bytes that `device` holds of every array in `tree` (its addressable shards), measured, not computed."""
    return sum(
        shard.data.nbytes for a in jax.tree.leaves(tree) for shard in a.addressable_shards if shard.device == device
    )


def critic_layers(g, n_slots: int, hidden_size: int, decoder_size: int, *, rngs: nnx.Rngs) -> nnx.Dict:
    """The layers of PPO's value network V(x) = out(relu(trunk(relu(encoder(images)) · slots))) (P,), the policy's
    widths with one output, tagged as the policy's are (g: the script). GRPO has no critic: this one is never called
    or trained, only laid out on the mesh; the script's print_header counts the same layers."""
    return nnx.Dict(
        encoder=nnx.Linear(784, hidden_size, **g.named(("pixels", "features")), rngs=rngs),
        trunk=nnx.Linear(n_slots * hidden_size, decoder_size, **g.named(("inputs", "hidden")), rngs=rngs),
        out=nnx.Linear(decoder_size, 1, **g.named(("hidden", "value")), rngs=rngs),
    )


def mesh_memory(g, args, data, mesh) -> dict:
    """On the first device of the mesh (g: the script): the bytes of the policy + Adam state, of π_ref (parameters
    only: it is never trained, so it has no gradient and no optimizer state) and of the critic + Adam that GRPO does
    not build; and what XLA's compiled RL block (--eval-every iterations) reserves there (memory_analysis; None if
    not reported). Call it under jax.set_mesh(mesh): the states are placed as train() places them."""
    sizes, device = (g.slots_for(args), args.hidden_size, args.decoder_size), mesh.devices.flat[0]

    def adam(model):
        return nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param)

    policy = g.Policy(*sizes, rngs=nnx.Rngs(g.run_keys(args.seed).init))
    graphdef, state = nnx.split(g.TrainState(policy, adam(policy)))
    state = g.place(state, args.rules)  # as train() places it
    critic = critic_layers(g, *sizes, rngs=nnx.Rngs(args.seed))
    critic_state = g.place(nnx.state((critic, adam(critic))), args.rules)  # the critic and its Adam, never trained
    block = partial(g.train_block, graphdef, nnx.graphdef(policy), args)
    draw_keys, keys = jax.vmap(jax.random.split, out_axes=1)(jax.random.split(jax.random.key(0), args.eval_every))
    draw = jax.vmap(partial(g.draw_prompts, n_images=len(data.y_train), n_prompts=args.batch_size, n_slots=sizes[0]))
    prompts = g.feed(draw(draw_keys), jax.P(None, args.batch_axis))  # as train() places a block's prompts
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    stats = jax.jit(block).lower(state, state["policy"], 0, x, y, keys, prompts).compile().memory_analysis()
    compiled = None
    if stats is not None:
        compiled = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
    return {
        "devices": mesh.size,
        "mesh": dict(mesh.shape),
        "rules": args.rules,
        "policy_adam_bytes": bytes_on(state, device),
        "policy_adam_bytes_total": sum(a.nbytes for a in jax.tree.leaves(state)),
        "reference_bytes": bytes_on(state["policy"], device),
        "critic_adam_bytes": bytes_on(critic_state, device),
        "compiled_block": compiled,
    }


def cell(argv: list[str]) -> None:
    """--cell FLAGS: the script's main(FLAGS) in this process, then mesh_memory on its mesh, into <out>/mesh.json."""
    g = load_script("4_GRPO_MNIST/grpo_mnist.py")
    args = g.parse_args(argv)
    g.main(args)
    mesh, data = g.make_mesh(args, g.start_devices(args)), g.load_data(args)
    with jax.set_mesh(mesh):
        measured = mesh_memory(g, args, data, mesh)
    (Path(args.out) / "mesh.json").write_text(json.dumps(measured, indent=2))


def kb(n: int) -> str:
    return f"{n / 1000:,.0f} kB"  # kB = 1,000 bytes, as GB = 10⁹ in module 5


def main() -> None:
    if sys.argv[1:2] == ["--cell"]:
        return cell(sys.argv[2:])
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
