"""GRPO on a device mesh (4_GRPO_MNIST/grpo_mnist.py --host-devices / --mesh / --rules).

Faked CPU devices must be asked for before JAX starts, so the multi-device checks run the script (or a short
snippet) in a fresh process; the one-line errors run in-process on this process's single device."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import jax
import numpy as np
import pytest
from conftest import REPO, free_port, launch_processes, load_script, run_script
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


class FakeDevice:
    """Stands in for a device where make_mesh only counts and checks: jax.make_mesh is not reached."""

    platform = "cpu"


@pytest.mark.unit
def test_a_weight_the_mesh_cannot_split_is_one_line():
    """fsdp on 8 'data' devices cannot split the digit task's decoder input (140 rows): make_mesh says which weight
    and why, before any work. Uses a fake device list: make_mesh only counts and checks, it does not run on them."""
    with pytest.raises(g.RunError, match=r"--rules fsdp splits decoder/kernel/value \(140, 256\) along 'data'"):
        g.make_mesh(g.Args(task="digit", rules="fsdp", batch_size=64), [FakeDevice()] * 8)


# ---------------------------------------------------------------- --distributed: processes joined by JAX
# Each process runs the script with the same flags but its --process-id and --out; only process 0 may write.
SCORED = [f for f in SHORT if f != "--no-score-test"]  # the test set too: its scores must match as well


def launch(tmp_path, name: str, *flags: str, flags_of_1: tuple = ()) -> list[subprocess.Popen]:
    """The script as 2 processes × 2 CPU devices on this machine, one 4-device mesh over both; process i writes
    under <name>/p<i>. flags_of_1: flags only process 1 gets."""
    out, last = (lambda i: tmp_path / name / f"p{i}"), (lambda i: flags_of_1 * i)
    return launch_processes(SCRIPT, [*flags, "--host-devices", "2"], tmp_path, out, last)


def lines(err: str) -> list[str]:
    """stderr without JAX's own notices (W1207 …: e.g. that a process may die without aborting the others)."""
    return [line for line in err.splitlines() if not re.match(r"[WI]\d{4} ", line)]


@pytest.mark.integration
@pytest.mark.parametrize("rules", ["dp", "fsdp"])
def test_two_processes_are_one_run_on_four_devices(tmp_path, rules):
    """2 processes × 2 devices and 1 process × 4 devices, the same flags and seed: the same validation rows at
    every score, the same final val / test pass@1 and greedy, the same trained parameters (each run's checkpoint
    read back in this one process), and the one-process checkpoint scored alike by two processes. Only process 0
    writes, and neither prints to stderr. Catches: a process that
    feeds the rows of another (the batch would repeat), val / test prompts scored twice or not at all, a
    checkpoint of one process's shards, files from process 1."""
    one = run_script(
        SCRIPT,
        *SCORED,
        "--rules",
        rules,
        "--host-devices",
        "4",
        "--out",
        str(tmp_path / "one"),
        cwd=tmp_path,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    procs = launch(tmp_path, "two", *SCORED, "--rules", rules)
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    assert [lines(err) for _, err in outs] == [[], []]
    assert not (tmp_path / "two" / "p1").exists() and outs[1][0].count("phase=") == 0  # process 1: no files, no lines
    a = json.loads((tmp_path / "one" / "latest" / "metrics.json").read_text())
    b = json.loads((tmp_path / "two" / "p0" / "latest" / "metrics.json").read_text())
    assert b["args"]["distributed"] and b["history"][-1]["iteration"] == 6
    # counts are exact; sums of floats (loss, KL) differ in the last bits: Gloo adds the devices' parts in another order
    for row_a, row_b in zip(a["history"], b["history"], strict=True):
        assert row_a.keys() == row_b.keys() and row_a["iteration"] == row_b["iteration"]
        for key in row_a.keys() - {"phase", "iteration", "seconds"}:
            exact = key.startswith(("val_pass", "val_greedy", "val_length", "reward", "zero_signal"))  # counts
            assert row_a[key] == row_b[key] if exact else abs(row_a[key] - row_b[key]) <= TOLERANCE, (key, row_a, row_b)
    for key in ("val_pass1", "val_greedy", "test_pass1", "test_pass2", "test_greedy"):
        assert a[key] == b[key], key
    args = g.parse_args(SCORED)
    mesh = g.make_mesh(args, jax.devices()[:1])
    policies = [
        g.load_policy(replace(args, load=str(tmp_path / d / "latest" / "policy")), mesh) for d in ("one", "two/p0")
    ]
    pa, pb = (jax.tree.leaves(nnx.state(p)) for p in policies)
    assert max(float(np.abs(x - y).max()) for x, y in zip(pa, pb, strict=True)) <= TOLERANCE
    # and the other way: the one-process policy, scored by two processes (--load; orbax reads it in each process),
    # gets the scores the one process gave it
    procs = launch(tmp_path, "load", *SCORED, "--rules", rules, "--load", str(tmp_path / "one" / "latest" / "policy"))
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-1500:] for _, err in outs]
    scored = json.loads((tmp_path / "load" / "p0" / "eval" / "latest" / "metrics.json").read_text())
    assert scored["val_pass1"] == a["val_pass1"] and scored["test_greedy"] == a["test_greedy"]
    assert not (tmp_path / "load" / "p1").exists()


LONG = [*SHORT, "--iterations", "3000"]  # the flags that come last win: long enough to be stopped mid-run


def wait_for_progress(proc: subprocess.Popen) -> None:
    """Read process 0's stdout until its first RL line: both processes are then inside the training loop."""
    for line in proc.stdout:
        if line.startswith("phase=rl"):
            return
    raise AssertionError("the run ended before its first RL line")


@pytest.mark.integration
def test_a_killed_process_ends_the_other_with_one_line(tmp_path):
    """kill -9 on process 1 mid-run: process 0 notices that it has gone silent and ends within 60 s with one line,
    status 1, and no folder (nothing of the run was complete). Catches: a hang in the next collective, JAX's abort
    with a C++ trace (status 134), a folder left behind."""
    p0, p1 = launch(tmp_path, "kill", *LONG)
    wait_for_progress(p0)
    start = time.monotonic()
    p1.kill()
    _, err = p0.communicate(timeout=90)
    assert time.monotonic() - start < 60 and p0.returncode == 1, err[-1500:]
    assert lines(err) == ["error: process 1 fell silent for 30 s (killed, or its host is down); nothing written"]
    assert not any((tmp_path / "kill" / "p0").iterdir())
    p1.communicate()


@pytest.mark.integration
@pytest.mark.parametrize("stopped", [0, 1])
def test_ctrl_c_on_either_process_ends_both_with_one_line_each(tmp_path, stopped):
    """SIGINT to one process mid-run: it ends as a one-process run does ('interrupted; nothing written', 130), and
    the other within seconds with one line that names it (status 1); no folder is left. Catches: process 1 aborted
    by JAX (134) once process 0's coordination service is gone, a process left waiting in a collective."""
    procs = launch(tmp_path, "stop", *LONG)
    wait_for_progress(procs[0])
    start = time.monotonic()
    procs[stopped].send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=60) for p in procs]
    other = 1 - stopped
    assert time.monotonic() - start < 20, [e for _, e in outs]
    assert [procs[stopped].returncode, procs[other].returncode] == [130, 1], [e for _, e in outs]
    assert lines(outs[stopped][1]) == ["interrupted; nothing written"]
    assert lines(outs[other][1]) == [f"error: process {stopped} ended: interrupted; nothing written"]
    assert not any((tmp_path / "stop" / "p0").iterdir())


@pytest.mark.integration
def test_processes_with_different_flags_are_refused(tmp_path):
    """Process 1 started with another --seed: both end with the same one line before any work. Catches: two
    processes that train different runs into one mesh."""
    procs = launch(tmp_path, "mismatch", *SHORT, flags_of_1=("--seed", "1"))
    outs = [p.communicate(timeout=120) for p in procs]
    want = "error: the processes were started with different flags (only --process-id and --out may differ)"
    assert [p.returncode for p in procs] == [1, 1] and [lines(e) for _, e in outs] == [[want + "; nothing written"]] * 2


@pytest.mark.smoke
def test_a_coordinator_nobody_answers_is_one_line(tmp_path):
    """Process 1 of 2 alone, its process 0 never started: after --join-timeout it ends with one line and status 1,
    before JAX's own limit would abort it with a C++ trace (status 134). Catches: a wait of JAX's 300 s, the abort."""
    flags = ["--distributed", "--coordinator-address", f"localhost:{free_port()}", "--num-processes", "2"]
    res = run_script(SCRIPT, *flags, "--process-id", "1", "--join-timeout", "3", "--out", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 1, res.stderr[-1500:]
    assert lines(res.stderr) == ["error: not every process joined within --join-timeout 3 s; nothing written"]
