"""GRPO on a device mesh (4_GRPO_MNIST/grpo_mnist.py --host-devices / --mesh / --rules).

Faked CPU devices must be asked for before JAX starts, so the multi-device checks run the script (or a short
snippet) in a fresh process; the one-line errors run in-process on this process's single device."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace

import jax
import numpy as np
import pytest
from conftest import REPO, load_script, run_script
from flax import nnx

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
g = load_script(SCRIPT)
SHORT = ["--sft-steps", "2", "--iterations", "6", "--eval-every", "3", "--eval-samples", "4", "--pass-k", "2"]
SHORT += ["--batch-size", "16", "--group-size", "4", "--no-score-test", "--compile-cache", ""]
# Why not 0: on 4 devices every sum over the batch (the loss, the gradient) is reduced in another order (a
# partial sum per device, then an all-reduce), so float32 rounding differs in the last bits (~1e-7 per step). Over a
# few Adam steps that stays far below 1e-5; a long run can drift further once a rounding flips a sampled token.
TOLERANCE = 1e-5


def run(tmp_path, name: str, *flags: str) -> tuple[dict, dict]:
    """The script's run with `flags` through tools/grpo_mesh.py --cell (which adds what each device holds, as
    metrics["mesh"]) and its trained parameters, read from the orbax checkpoint onto this process's one device."""
    out = tmp_path / name
    proc = run_script("tools/grpo_mesh.py", "--cell", *SHORT, *flags, "--out", str(out), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((out / "latest" / "metrics.json").read_text())
    args = g.parse_args([*SHORT, *flags])
    policy = g.load_policy(replace(args, load=str(out / "latest" / "policy")), g.make_mesh(args, jax.devices()[:1]))
    params = {path: np.asarray(a) for path, a in jax.tree_util.tree_leaves_with_path(nnx.state(policy))}
    return {**metrics, "mesh": json.loads((out / "mesh.json").read_text())}, params


@pytest.mark.integration
def test_four_devices_match_one_within_tolerance(tmp_path):
    """A short run (SFT, then GRPO) on a 4-device mesh ends with the one-device parameters within TOLERANCE and the
    same scores, under both rule sets. Fails if the prompts or weights are laid out in a way that changes the math
    (e.g. a rule that drops a shard), or if the mesh run draws other random numbers than the one-device run."""
    one, p1 = run(tmp_path, "one", "--host-devices", "1")
    assert one["mesh"]["devices"] == 1
    total = one["mesh"]["policy_adam_bytes_total"]
    assert one["mesh"]["policy_adam_bytes"] == total
    for rules in ("dp", "fsdp"):
        four, p4 = run(tmp_path, rules, "--host-devices", "4", "--rules", rules)
        assert four["mesh"]["devices"] == 4 and four["mesh"]["mesh"] == {"data": 4, "model": 1}
        worst = max(float(np.abs(p1[k] - p4[k]).max()) for k in p1)
        assert worst <= TOLERANCE, (rules, worst)
        assert four["val_pass1"] == pytest.approx(one["val_pass1"], abs=1e-6)
        # what each device holds: dp replicates the weights, fsdp splits the two large ones
        if rules == "dp":
            assert four["mesh"]["policy_adam_bytes"] == total
        else:
            assert four["mesh"]["policy_adam_bytes"] < 0.4 * total
        # π_ref: parameters only, no gradient and no Adam moments: a third of what the policy + Adam take
        assert four["mesh"]["reference_bytes"] * 3 == pytest.approx(four["mesh"]["policy_adam_bytes"], rel=0.02)


SNIPPET = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
sys.path.insert(0, {tests!r})
from conftest import load_script
import jax
from flax import nnx
g = load_script("4_GRPO_MNIST/grpo_mnist.py")
for rules in ("dp", "fsdp"):
    args = g.Args(task="number", rules=rules)
    mesh = g.make_mesh(args, jax.devices())
    with jax.set_mesh(mesh):
        state = g.place(nnx.state(g.Policy(4, 128, 256, rngs=nnx.Rngs(0))), rules)
    kernel = state["encoder"]["kernel"][...]
    print(rules, tuple(kernel.sharding.spec), [tuple(s.data.shape) for s in kernel.addressable_shards])
"""


@pytest.mark.integration
def test_arrays_really_are_split():
    """Read .sharding and the addressable shards of the encoder's kernel (784 × 128) on 4 devices: dp keeps a whole
    copy on each device; fsdp gives each device 196 of the 784 rows. Fails if `place` ignores the rules."""
    code = SNIPPET.format(tests=str(REPO / "tests"))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["dp"] == "(None, None) [(784, 128), (784, 128), (784, 128), (784, 128)]"
    assert lines["fsdp"] == "('data', None) [(196, 128), (196, 128), (196, 128), (196, 128)]"


@pytest.mark.unit
def test_host_devices_after_jax_started_is_one_line(tmp_path, capsys):
    """In-process (JAX has started with one CPU device): --host-devices 64 comes too late, one line on stderr and exit
    status 1, before any work. Catches: a traceback, or a run on fewer devices than asked for."""
    g.jax.devices()  # started here, whichever tests ran before in this process
    with pytest.raises(SystemExit) as e:
        g.main(g.Args(out=str(tmp_path), host_devices=64))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("error: --host-devices 64 came too late") and err.count("\n") == 1


class FakeDevice:
    """Stands in for a device where make_mesh only counts and checks: jax.make_mesh is not reached."""

    platform = "cpu"


@pytest.mark.unit
def test_a_weight_the_mesh_cannot_split_is_one_line():
    """fsdp on 8 'data' devices cannot split the digit task's decoder input (140 rows): make_mesh says which weight
    and why, before any work. Uses a fake device list: make_mesh only counts and checks, it does not run on them."""
    with pytest.raises(g.RunError, match=r"--rules fsdp splits decoder/kernel/value \(140, 256\) along 'data'"):
        g.make_mesh(g.Args(task="digit", rules="fsdp", batch_size=64), [FakeDevice()] * 8)
