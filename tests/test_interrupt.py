"""Ctrl-C during a run, as a user presses it: one line on stderr, exit status 130 and no traceback; what the run had
measured is on disk (metrics.json saying where it stopped, the curve, the checkpoint); pressed before anything was
measured, the line says that nothing was written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from conftest import REPO, load_script

pytestmark = pytest.mark.smoke

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))

# Per script: tiny flags that train far longer than the test waits, the stdout line to wait for (the first progress
# line; 5_Sharding_Mesh keeps whole rule sets, so the line that starts the second, after the first was kept), what
# metrics.json counts in, how many of them were planned, and the files an interrupted run still writes beside it.
RUNS = {
    "1_Q_Learning/Q_Learning.py": (
        ["--episodes", "5000000", "--evals", "5000"],
        "episode=",
        ("episode", 5_000_000),
        ["learning_curve.png", "q_map.png"],
    ),
    "2_Cart_Pole_DQN/cart_pole_dqn.py": (
        [
            *("--total-timesteps", "10000000", "--learning-starts", "200", "--train-frequency", "50"),
            *("--gradient-steps", "4", "--target-network-frequency", "100", "--eval-frequency", "300"),
            *("--periodic-eval-episodes", "2", "--hidden-size", "16", "--batch-size", "32"),
        ],
        "step=",
        ("env step", 10_000_000),
        ["learning_curve.png", "q_network.npz"],
    ),
    "3_Pendulum/pendulum.py": (
        [
            *("--total-timesteps", "100000000", "--num-envs", "4", "--num-steps", "64"),
            *("--minibatch-size", "64", "--update-epochs", "2", "--hidden-size", "16"),
        ],
        "update=",
        ("update", 100_000_000 // 256),
        ["learning_curve.png", "params.npz"],
    ),
    "4_GRPO_MNIST/grpo_mnist.py": (
        [
            *("--task", "digit", "--iterations", "1000000", "--eval-every", "2", "--eval-samples", "4"),
            *("--pass-k", "2", "--batch-size", "8", "--group-size", "4", "--hidden-size", "16"),
            *("--decoder-size", "32"),
        ],
        "phase=rl",
        ("rl iteration", 1_000_000),
        ["learning_curve.png", "policy.npz"],
    ),
    "5_Sharding_Mesh/sharding_mesh.py": (
        [
            *("--host-devices", "2", "--steps", "2", "--rules", "all", "--no-visualize", "--embed", "16"),
            *("--mlp", "32", "--vocab", "16", "--heads", "2", "--head-dim", "4", "--seq-len", "4", "--batch-size", "4"),
        ],
        "=== rule set tp",
        ("rule set", 4),
        ["loss_curve.png"],
    ),
}


def test_every_script_is_covered():
    assert sorted(RUNS) == SCRIPTS


def interrupt(script: str, argv: list[str], wait_for: str | None, cwd, env: dict | None = None, timeout: float = 180):
    """Start `script`; once a stdout line starts with `wait_for`, send SIGINT, as Ctrl-C does (None: send nothing,
    the run interrupts itself). Returns (return code, stdout, stderr). A run still going after `timeout` seconds is
    killed."""
    # A child inherits an ignored SIGINT (as under `nohup` or a background job), and Python then never raises
    # KeyboardInterrupt: start it with SIGINT handled, as in a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / script), *argv],
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        stdout = []
        if wait_for is not None:
            for line in proc.stdout:
                stdout.append(line)
                if line.startswith(wait_for):
                    proc.send_signal(signal.SIGINT)
                    break
        rest, stderr = proc.communicate()
    finally:
        watchdog.cancel()
    return proc.returncode, "".join(stdout) + rest, stderr


def exit_status(main, args) -> int:
    """main(args) called in this process, as the command line calls it: the status it exits with. A KeyboardInterrupt
    that escapes it (a traceback on the command line) fails the test instead of stopping pytest."""
    try:
        main(args)
    except KeyboardInterrupt:
        pytest.fail("the KeyboardInterrupt escaped main (a traceback on the command line)")
    except SystemExit as exit_:
        return exit_.code
    pytest.fail("main returned instead of exiting")


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_keeps_what_was_measured(script, tmp_path):
    """Ctrl-C after the first progress line. Catches: a traceback, an exit status other than 130, more than one line
    on stderr, a run that writes nothing (or metrics.json without where it stopped) and a line that names a unit
    count other than the one metrics.json records."""
    flags, wait_for, (unit, planned), files = RUNS[script]
    out = tmp_path / "out"
    code, stdout, stderr = interrupt(script, [*flags, "--out", str(out)], wait_for, tmp_path)
    assert wait_for in stdout, (stdout[-2000:], stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 130, (code, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted at "), stderr[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    stop = metrics["interrupted"]
    assert stop["unit"] == unit and stop["of"] == planned and 0 < stop["at"] < planned, stop
    assert lines[0] == f"interrupted at {unit} {stop['at']} of {planned}; metrics so far in {out / 'metrics.json'}"
    for name in files:
        assert (out / name).stat().st_size > 0, name


# Put on PYTHONPATH as sitecustomize.py, which Python imports at start-up: at the script's first import of a library
# outside the standard library, SIGINT, as if Ctrl-C were pressed while the libraries load.
PRESS_WHILE_LOADING = """
import os, signal, sys


class PressCtrlC:
    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back  # importlib's own frames, up to the import statement
        library = name.partition(".")[0] not in sys.stdlib_module_names
        if library and frame is not None and frame.f_globals.get("__name__") == "__main__":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, PressCtrlC())
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_while_the_libraries_load(script, tmp_path):
    """SIGINT during the script's first import of NumPy, JAX or gymnasium. Catches the traceback that Python prints
    for a KeyboardInterrupt at import time, and its exit status (-2, not 130)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PRESS_WHILE_LOADING)
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(tmp_path / "site")}
    code, stdout, stderr = interrupt(script, ["--out", str(out)], None, tmp_path, env)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == 130, (code, stderr[-2000:])
    assert stderr.splitlines() == ["interrupted while loading the libraries; nothing written"], stderr[-2000:]
    assert stdout == "" and not out.exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_before_anything_is_measured(script, tmp_path, monkeypatch, capsys):
    """Ctrl-C during set-up (here: while main checks the flags), before any measurement: one line that says nothing
    was written, exit status 130. Catches a KeyboardInterrupt that escapes main as a traceback."""
    module = load_script(script)

    def pressed(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "validate", pressed)
    out = tmp_path / "out"
    assert exit_status(module.main, module.parse_args(["--out", str(out)])) == 130
    assert capsys.readouterr().err == f"interrupted; nothing written to {out}\n"
    assert not out.exists()


# Per script: the function whose first call makes the training loop's first measurement (compilation included), and
# tiny flags. Ctrl-C there leaves nothing measured.
FIRST_MEASUREMENT = {
    "1_Q_Learning/Q_Learning.py": ("run_episode", ["--episodes", "50"]),
    "2_Cart_Pole_DQN/cart_pole_dqn.py": (
        "evaluate",
        ["--total-timesteps", "600", "--learning-starts", "200", "--eval-frequency", "300", "--hidden-size", "16"],
    ),
    "3_Pendulum/pendulum.py": ("collect_rollout", ["--total-timesteps", "512", "--num-envs", "4", "--num-steps", "64"]),
    "4_GRPO_MNIST/grpo_mnist.py": (
        "scores",
        [
            *("--task", "digit", "--iterations", "4", "--eval-every", "2", "--eval-samples", "4", "--pass-k", "2"),
            *("--batch-size", "8", "--group-size", "4", "--hidden-size", "16", "--decoder-size", "32"),
        ],
    ),
    "5_Sharding_Mesh/sharding_mesh.py": ("run_rule_set", ["--host-devices", "0", "--steps", "2", "--embed", "16"]),
}


@pytest.mark.parametrize("script", SCRIPTS)
def test_ctrl_c_before_the_loop_measured_anything(script, tmp_path, monkeypatch, capsys):
    """Ctrl-C inside the training loop, before its first measurement (here: the first call of the function that makes
    it). Nothing was measured, so nothing is written, and the line says so. Catches a metrics.json of an empty run
    (no episode, no curve point, no update, no scored row, no rule set)."""
    module = load_script(script)
    name, flags = FIRST_MEASUREMENT[script]

    def pressed(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, pressed)
    out = tmp_path / "out"
    assert exit_status(module.main, module.parse_args([*flags, "--out", str(out)])) == 130
    assert capsys.readouterr().err == f"interrupted; nothing written to {out}\n"
    assert not (out / "metrics.json").exists()


def test_grpo_keeps_only_the_rows_it_scored(tmp_path, monkeypatch, capsys):
    """Ctrl-C while GRPO scores a block on validation (here: the third scoring). The block's row is not kept half
    made: the history holds the two rows scored before it, and the run stops at RL iteration 2. Catches a row that
    joins the history before it is scored (its validation scores missing)."""
    g = load_script("4_GRPO_MNIST/grpo_mnist.py")
    real, calls = g.scores, []

    def scores(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(g, "scores", scores)
    out = tmp_path / "out"
    flags = ["--task", "digit", "--iterations", "8", "--eval-every", "2", "--eval-samples", "4", "--pass-k", "2"]
    flags += ["--batch-size", "8", "--group-size", "4", "--hidden-size", "16", "--decoder-size", "32"]
    flags += ["--out", str(out)]
    assert exit_status(g.main, g.parse_args(flags)) == 130
    assert capsys.readouterr().err == f"interrupted at rl iteration 2 of 8; metrics so far in {out / 'metrics.json'}\n"
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert [(row["phase"], row["iteration"]) for row in history] == [("start", 0), ("rl", 2)]
    assert all("val_pass1" in row for row in history)


def test_pendulum_jax_backend_keeps_the_compiled_run(tmp_path, monkeypatch, capsys):
    """--backend jax trains in one compiled call, which Ctrl-C cannot stop: Python raises the KeyboardInterrupt when
    the call returns, in jax.block_until_ready (here raised there after the real wait). Every update is then kept:
    metrics.json at update N of N, the curve and params.npz, and nothing more is evaluated. Catches a run that loses
    the compiled call's results ("nothing written"), or that goes on to evaluate and exits 0."""
    pen = load_script("3_Pendulum/pendulum.py")
    wait = pen.jax.block_until_ready

    def returns_to_python(x):
        wait(x)
        raise KeyboardInterrupt

    monkeypatch.setattr(pen.jax, "block_until_ready", returns_to_python)
    out = tmp_path / "out"
    flags = ["--backend", "jax", "--host-devices", "0", "--total-timesteps", "512", "--num-envs", "4"]
    flags += ["--num-steps", "64", "--minibatch-size", "64", "--update-epochs", "1", "--out", str(out)]
    assert exit_status(pen.main, pen.parse_args(flags)) == 130
    assert capsys.readouterr().err == f"interrupted at update 2 of 2; metrics so far in {out / 'metrics.json'}\n"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["interrupted"] == {"unit": "update", "at": 2, "of": 2} and len(metrics["history"]) == 2
    assert "eval_return_mean" not in metrics  # nothing evaluated after Ctrl-C
    assert (out / "learning_curve.png").stat().st_size > 0 and (out / "params.npz").stat().st_size > 0


@pytest.mark.unit
@pytest.mark.parametrize(
    "flags, rows, where",
    [
        (["--task", "digit"], [("start", 0)], ("rl", 0, 1500)),
        (["--task", "digit"], [("start", 0), ("rl", 150)], ("rl", 150, 1500)),
        (["--task", "digit"], [("start", 0), ("rl", 1500)], None),
        (["--task", "number"], [("start", 0)], ("sft", 0, 300)),
        (["--task", "number"], [("start", 0), ("sft", 150)], ("sft", 150, 300)),
        (["--task", "number"], [("start", 0), ("sft", 300)], ("sft", 300, 300)),
        (["--objective", "supervised"], [("start", 0), ("supervised", 150)], ("supervised", 150, 1500)),
        (["--objective", "supervised"], [("start", 0), ("supervised", 1500)], None),
    ],
)
def test_grpo_says_in_which_phase_training_stopped(flags, rows, where):
    """GRPO trains in two phases (SFT, then RL or more supervised steps): Ctrl-C is reported in the phase of the
    last scored row, counted in that phase's iterations. Catches a run stopped at the end of SFT taken for a finished
    one, and an RL iteration counted against the SFT steps."""
    g = load_script("4_GRPO_MNIST/grpo_mnist.py")
    history = [{"phase": phase, "iteration": it} for phase, it in rows]
    stop = g.stopped_at(g.parse_args(flags), history)
    assert (stop and (stop["unit"].removesuffix(" iteration"), stop["at"], stop["of"])) == where
