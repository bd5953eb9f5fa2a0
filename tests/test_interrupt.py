"""Every way a run can stop, as a user meets it: Ctrl-C (SIGINT) or SIGTERM at any moment, a full disk, a second run
into the same folder. One line on stderr, exit status 130, 143 or 1, no traceback, and the output folder holds one
consistent run: the earlier one untouched, or this run's complete set (marked `interrupted`, with what is missing,
when it stopped early), never a mix of the two and never a half-written file.
"""

from __future__ import annotations

import builtins
import errno
import functools
import gc
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import REPO, load_script

pytestmark = pytest.mark.smoke

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))

# Per script: tiny flags that train far longer than the test waits, the stdout line to wait for (the first progress
# line; 5_Sharding_Mesh keeps whole rule sets, so the line that starts the second, after the first was kept), what
# metrics.json counts in, how many of them were planned, the files an interrupted run still writes beside it (in the
# order it writes them), and the signal the test sends (SIGINT as Ctrl-C, SIGTERM as a scheduler or `timeout`).
RUNS = {
    "1_Q_Learning/Q_Learning.py": (
        ["--episodes", "5000000", "--evals", "5000"],
        "episode=",
        ("episode", 5_000_000),
        ["learning_curve.png", "q_map.png"],
        signal.SIGTERM,
    ),
    "2_Cart_Pole_DQN/cart_pole_dqn.py": (
        [
            *("--total-timesteps", "10000000", "--learning-starts", "200", "--train-frequency", "50"),
            *("--gradient-steps", "4", "--target-network-frequency", "100", "--eval-frequency", "300"),
            *("--periodic-eval-episodes", "2", "--hidden-size", "16", "--batch-size", "32"),
        ],
        "step=",
        ("env step", 10_000_000),
        ["q_network.npz", "learning_curve.png"],
        signal.SIGINT,
    ),
    "3_Pendulum/pendulum.py": (
        [
            *("--total-timesteps", "100000000", "--num-envs", "4", "--num-steps", "64"),
            *("--minibatch-size", "64", "--update-epochs", "2", "--hidden-size", "16"),
        ],
        "update=",
        ("update", 100_000_000 // 256),
        ["params.npz", "learning_curve.png"],
        signal.SIGTERM,
    ),
    "4_GRPO_MNIST/grpo_mnist.py": (
        [
            *("--task", "digit", "--iterations", "1000000", "--eval-every", "2", "--eval-samples", "4"),
            *("--pass-k", "2", "--batch-size", "8", "--group-size", "4", "--hidden-size", "16"),
            *("--decoder-size", "32"),
        ],
        "phase=rl",
        ("rl iteration", 1_000_000),
        ["policy.npz", "learning_curve.png"],
        signal.SIGINT,
    ),
    "5_Sharding_Mesh/sharding_mesh.py": (
        [
            *("--host-devices", "2", "--steps", "2", "--rules", "all", "--no-visualize", "--embed", "16"),
            *("--mlp", "32", "--vocab", "16", "--heads", "2", "--head-dim", "4", "--seq-len", "4", "--batch-size", "4"),
        ],
        "=== rule set tp",
        ("rule set", 4),
        ["loss_curve.png"],
        signal.SIGTERM,
    ),
}
# Every file a script can write into its folder besides metrics.json (an earlier run's episode.gif included).
NAMES = {
    "1_Q_Learning/Q_Learning.py": ["learning_curve.png", "q_map.png"],
    "2_Cart_Pole_DQN/cart_pole_dqn.py": ["q_network.npz", "learning_curve.png", "episode.gif"],
    "3_Pendulum/pendulum.py": ["params.npz", "learning_curve.png", "episode.gif"],
    "4_GRPO_MNIST/grpo_mnist.py": ["policy.npz", "learning_curve.png"],
    "5_Sharding_Mesh/sharding_mesh.py": ["loss_curve.png"],
}
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


def test_every_script_is_covered():
    assert sorted(RUNS) == sorted(NAMES) == SCRIPTS


def earlier_run(folder, names) -> dict:
    """Fill `folder` with an earlier run's files: metrics.json and each of `names`. Returns {name: bytes}."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"metrics.json": json.dumps({"earlier run": True}).encode()}
    files.update({name: f"{name} of an earlier run".encode() for name in names})
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def whole(name: str, data: bytes) -> bool:
    """Whether `data` is a complete file of its kind: a PNG up to its IEND chunk, a GIF up to its trailer, a NumPy
    archive whose arrays all read back, a JSON document."""
    if name.endswith(".png"):
        return data.startswith(b"\x89PNG") and data[-8:-4] == b"IEND"
    if name.endswith(".gif"):
        return data.startswith(b"GIF8") and data.endswith(b";")
    if name.endswith(".npz"):
        with np.load(io.BytesIO(data), allow_pickle=False) as f:
            return all(f[key].size >= 0 for key in f.files)
    return bool(json.loads(data))


def one_run(folder, earlier: dict) -> dict | None:
    """Assert that `folder` holds exactly one consistent run and return its metrics, or None when it is the earlier
    run, untouched. A new run: no file of the earlier run is left, no temporary file or lock, every file is whole,
    and every file that metrics.json lists as not done is absent."""
    names = sorted(p.name for p in folder.iterdir())
    assert not [n for n in names if n.startswith((".", "partial"))], names  # staging folder, lock, partial files
    files = {name: (folder / name).read_bytes() for name in names}
    if files.get("metrics.json") == earlier["metrics.json"]:
        assert files == earlier, "the earlier run was changed"
        return None
    assert not [name for name, data in earlier.items() if files.get(name) == data], "an earlier file survived"
    assert all(whole(name, data) for name, data in files.items()), names
    metrics = json.loads(files["metrics.json"])
    assert not set(metrics.get("interrupted", {}).get("missing", [])) & set(files), metrics["interrupted"]
    return metrics


def kept(line: str, out) -> tuple[str, set, list]:
    """'interrupted during X; kept in OUT: a, b (not done: c, d)' -> ('interrupted during X', {a, b}, [c, d])."""
    head, _, rest = line.partition(f"; kept in {out}: ")
    listed, _, not_done = rest.partition(" (not done: ")
    return head, set(listed.split(", ")), not_done.removesuffix(")").split(", ") if not_done else []


def interrupt(
    script: str,
    argv: list[str],
    wait_for: str | None,
    cwd,
    env: dict | None = None,
    timeout: float = 180,
    sig=signal.SIGINT,
    meanwhile=None,
):
    """Start `script`; once a stdout line starts with `wait_for`, call meanwhile(process) if given, then send `sig`
    (SIGINT, as Ctrl-C does; None for wait_for: send nothing, the run interrupts itself). Returns (return code,
    stdout, stderr). A run still going after `timeout` seconds is killed."""
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
                    if meanwhile is not None:
                        meanwhile(proc)
                    proc.send_signal(sig)
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
def test_a_stop_during_training_keeps_what_was_measured(script, tmp_path):
    """SIGINT or SIGTERM after the first progress line, into a folder holding an earlier run. Catches: a traceback,
    an exit status other than 130 / 143, more than one line on stderr, a run that writes nothing (or metrics.json
    without where it stopped), a line that names a unit count or files other than those on disk, and an earlier
    run's file left beside the new ones (DQN's and PPO's episode.gif)."""
    flags, wait_for, (unit, planned), files, sig = RUNS[script]
    out = tmp_path / "out"
    earlier = earlier_run(out, NAMES[script])
    code, stdout, stderr = interrupt(script, [*flags, "--out", str(out)], wait_for, tmp_path, sig=sig)
    assert wait_for in stdout, (stdout[-2000:], stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == STATUS[sig], (code, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted at "), stderr[-2000:]
    metrics = one_run(out, earlier)
    stop = metrics["interrupted"]
    assert stop["unit"] == unit and stop["of"] == planned and 0 < stop["at"] < planned, stop
    assert stop["during"] in ("training", "the rule sets"), stop  # 5_Sharding_Mesh trains and checks rule sets
    assert stop["missing"][0] in ("the rest of training", "the other rule sets"), stop
    not_done = f" (not done: {', '.join(stop['missing'])})"
    listed = ", ".join(["metrics.json", *files])
    assert lines[0] == f"interrupted at {unit} {stop['at']} of {planned}; kept in {out}: {listed}{not_done}"
    assert sorted(p.name for p in out.iterdir()) == sorted(["metrics.json", *files])


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
    line = "interrupted at rl iteration 2 of 8; kept in {}: metrics.json, policy.npz, learning_curve.png (not done: {})"
    assert capsys.readouterr().err == line.format(out, "the rest of training, the test scores") + "\n"
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert [(row["phase"], row["iteration"]) for row in history] == [("start", 0), ("rl", 2)]
    assert all("val_pass1" in row for row in history)


def send_at(module, monkeypatch, name: str, sig, call: int = 1) -> None:
    """Make the `call`-th call of module.<name> (a dotted name reaches into the module's imports) send `sig` to this
    process, as Ctrl-C (SIGINT) or a scheduler (SIGTERM) would while that code runs. The run's handler must be in
    place: without one, SIGTERM would end the test process."""
    *path, attr = name.split(".")
    owner = functools.reduce(getattr, path, module)
    real, calls = getattr(owner, attr), []

    def sends(*args, **kwargs):
        calls.append(None)
        if len(calls) == call:
            assert callable(signal.getsignal(sig)), f"nothing handles {signal.Signals(sig).name}: it ends the run"
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, sends)


def test_pendulum_jax_backend_finished_is_finished(tmp_path, monkeypatch, capsys):
    """--backend jax trains in one compiled call, which a signal cannot stop: SIGTERM comes during it (here: sent
    when jax.block_until_ready starts waiting), and Python takes it when the call returns, every update done. The
    run stops there and says so truly: training ran to its end, the final evaluation was not made; metrics.json
    (update 2 of 2), the curve and params.npz are kept, exit status 143. Catches: a line that reports an unfinished
    training ('interrupted at update 2 of 2'), a run that loses the compiled call's results ('nothing written'),
    one that goes on to evaluate and exits 0, and a SIGTERM that nothing handles."""
    pen = load_script("3_Pendulum/pendulum.py")
    send_at(pen, monkeypatch, "jax.block_until_ready", signal.SIGTERM)
    out = tmp_path / "out"
    flags = ["--backend", "jax", "--host-devices", "0", "--total-timesteps", "512", "--num-envs", "4"]
    flags += ["--num-steps", "64", "--minibatch-size", "64", "--update-epochs", "1", "--out", str(out)]
    assert exit_status(pen.main, pen.parse_args(flags)) == 143
    during = "training, which the compiled call ran to its end"
    files = "metrics.json, params.npz, learning_curve.png"
    line = f"interrupted during {during}; kept in {out}: {files} (not done: the final evaluation)"
    assert capsys.readouterr().err == line + "\n"
    metrics = json.loads((out / "metrics.json").read_text())
    stop = {"unit": "update", "at": 2, "of": 2, "during": during, "missing": ["the final evaluation"]}
    assert metrics["interrupted"] == stop and len(metrics["history"]) == 2
    assert "eval_return_mean" not in metrics  # nothing evaluated after the stop
    assert whole("params.npz", (out / "params.npz").read_bytes())


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


# ------------------------------------------------------------------ a stop after training, at each moment
# Tiny runs, in this process: what each script does after training is the same code as on the command line.
FLAGS = {
    "1_Q_Learning/Q_Learning.py": ["--episodes", "200"],
    "2_Cart_Pole_DQN/cart_pole_dqn.py": [
        *("--total-timesteps", "600", "--learning-starts", "200", "--train-frequency", "50", "--gradient-steps", "4"),
        *("--eval-frequency", "300", "--periodic-eval-episodes", "2", "--eval-episodes", "3", "--hidden-size", "16"),
    ],
    "3_Pendulum/pendulum.py": [
        *("--total-timesteps", "512", "--num-envs", "4", "--num-steps", "64", "--minibatch-size", "64"),
        *("--update-epochs", "1", "--hidden-size", "16", "--eval-episodes", "3"),
    ],
    "4_GRPO_MNIST/grpo_mnist.py": [
        *("--task", "digit", "--beta", "0", "--iterations", "4", "--eval-every", "2", "--eval-samples", "4"),
        *("--pass-k", "2", "--batch-size", "8", "--group-size", "4", "--hidden-size", "16", "--decoder-size", "32"),
    ],
    "5_Sharding_Mesh/sharding_mesh.py": [
        *("--host-devices", "0", "--rules", "fsdp", "--steps", "2", "--no-visualize", "--embed", "16", "--mlp", "32"),
        *("--vocab", "16", "--heads", "2", "--head-dim", "4", "--seq-len", "4", "--batch-size", "4"),
    ],
}
# script, extra flags, the function whose call-th call receives the signal, the signal, where the run is then
# (metrics.json's interrupted.during; None: the set was being put in place, and it is complete).
MOMENTS = [
    ("1_Q_Learning/Q_Learning.py", [], "evaluate_greedy", 20, signal.SIGINT, "training"),  # training's last one
    ("1_Q_Learning/Q_Learning.py", [], "evaluate_final", 1, signal.SIGTERM, "the final evaluation"),
    ("1_Q_Learning/Q_Learning.py", [], "json.dump", 1, signal.SIGINT, None),
    ("2_Cart_Pole_DQN/cart_pole_dqn.py", [], "evaluate", 3, signal.SIGINT, "the final evaluation"),
    ("2_Cart_Pole_DQN/cart_pole_dqn.py", ["--video"], "record_gif", 1, signal.SIGTERM, "writing episode.gif"),
    ("3_Pendulum/pendulum.py", [], "evaluate_seeds", 1, signal.SIGTERM, "the final evaluation"),
    ("3_Pendulum/pendulum.py", [], "plot_curve", 2, signal.SIGINT, "writing learning_curve.png"),
    ("4_GRPO_MNIST/grpo_mnist.py", [], "score_test_set", 1, signal.SIGINT, "the test scoring"),
    ("5_Sharding_Mesh/sharding_mesh.py", [], "report_8b", 1, signal.SIGTERM, "the 8B memory table"),
]


@pytest.mark.parametrize(
    "script, extra, name, call, sig, during", MOMENTS, ids=[f"{m[0][0]}-{m[2]}-{m[4].name}" for m in MOMENTS]
)
def test_a_stop_after_training_keeps_one_consistent_run(
    script, extra, name, call, sig, during, tmp_path, monkeypatch, capsys
):
    """SIGINT or SIGTERM at the end of training (the evaluation at its last episode, which ends the loop as if
    complete) or after it (during the final evaluation, the test scoring, a file's writing, the set's move into
    place), into a folder holding an earlier run. The finished training is kept, as one consistent set:
    metrics.json says where the run stopped and what is not done, the files it lists are this run's and whole, the
    earlier run's are gone (its episode.gif included); one true line, exit status 130 or 143. Catches: 'nothing
    written' after a finished training, a stop at training's last step that the run ignores (it evaluates and exits
    0), the new checkpoint beside the earlier metrics.json (or any other mix), a half-written file, a stale
    episode.gif, a line that names files not on disk, and a SIGTERM nothing handles."""
    module = load_script(script)
    out = tmp_path / "out"
    earlier = earlier_run(out, NAMES[script])
    send_at(module, monkeypatch, name, sig, call)
    assert exit_status(module.main, module.parse_args([*FLAGS[script], *extra, "--out", str(out)])) == STATUS[sig]
    line = capsys.readouterr().err
    metrics = one_run(out, earlier)
    assert metrics is not None, line  # the finished training is kept
    files = {p.name for p in out.iterdir()}
    if during is None:  # the signal waited until the set was in place: the run is complete
        assert line == f"interrupted once the run was saved; {out} holds all of it\n"
        assert "interrupted" not in metrics and files == {"metrics.json", *NAMES[script]} - {"episode.gif"}
        return
    stop = metrics["interrupted"]
    assert stop["during"] == during and stop["at"] == stop["of"], stop  # training ran to its end
    where = f"{'while' if during.startswith('writing') else 'during'} {during}"
    assert line.count("\n") == 1 and kept(line.strip(), out) == (f"interrupted {where}", files, stop["missing"])


def test_a_stop_during_a_load_run_leaves_the_earlier_evaluation(tmp_path, monkeypatch, capsys):
    """--load writes into <out>/eval/, a folder of its own under the same rules: SIGTERM during its evaluation keeps
    the earlier evaluation there untouched (nothing measured yet), and the training run's files beside it too.
    Catches an evaluation folder emptied or mixed by a stopped --load."""
    dqn = load_script("2_Cart_Pole_DQN/cart_pole_dqn.py")
    out = tmp_path / "out"
    trained = earlier_run(out, NAMES["2_Cart_Pole_DQN/cart_pole_dqn.py"][:2])
    agent = dqn.build_agent(dqn.Args(hidden_size=16), dqn.nnx.Rngs(0))
    dqn.save_checkpoint(str(out / "q_network.npz"), {"q_network": agent.q_network})
    trained["q_network.npz"] = (out / "q_network.npz").read_bytes()
    earlier = earlier_run(out / "eval", ["episode.gif"])
    send_at(dqn, monkeypatch, "evaluate", signal.SIGTERM)
    flags = ["--load", str(out / "q_network.npz"), "--hidden-size", "16", "--eval-episodes", "3", "--video"]
    assert exit_status(dqn.main, dqn.parse_args([*flags, "--out", str(out)])) == 143
    assert capsys.readouterr().err == f"interrupted; nothing written to {out / 'eval'}\n"
    assert one_run(out / "eval", earlier) is None
    assert {name: (out / name).read_bytes() for name in trained} == trained


# ------------------------------------------------------------------ a full disk
def full_disk(monkeypatch, folder, refused: set) -> None:
    """A disk that has no room for the files named in `refused` (under `folder`; a partial- prefix aside): opening
    one for writing puts a few bytes into it, then fails with ENOSPC, as a write on a full disk does."""
    real = builtins.open

    def open_(file, mode="r", *args, **kwargs):
        path = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
        name = os.path.basename(path).removeprefix("partial-")
        if path.startswith(str(folder)) and name in refused and any(c in mode for c in "wxa+"):
            with real(file, "wb") as f:
                f.write(b"the first bytes")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)  # zipfile (np.savez) opens through io.open


def no_room_for(script: str) -> set:
    return {"metrics.json", *NAMES[script]}


# script, extra flags, the files the disk has no room for, the file the line names, the files kept (None: nothing).
# Outputs is the same code in every script (tests/test_cli.py): a full disk at each point of one script's run, and a
# GIF too big for the disk in DQN's.
FULL = [
    ("1_Q_Learning/Q_Learning.py", [], no_room_for("1_Q_Learning/Q_Learning.py"), "learning_curve.png", None),
    ("1_Q_Learning/Q_Learning.py", [], {"q_map.png", "metrics.json"}, "q_map.png", None),
    ("1_Q_Learning/Q_Learning.py", [], {"metrics.json"}, "metrics.json", None),
    (
        "2_Cart_Pole_DQN/cart_pole_dqn.py",
        ["--video"],
        {"episode.gif"},
        "episode.gif",
        {"metrics.json", "q_network.npz", "learning_curve.png"},
    ),
    ("3_Pendulum/pendulum.py", [], no_room_for("3_Pendulum/pendulum.py"), "params.npz", None),
]


@pytest.mark.parametrize(
    "script, extra, refused, named, files", FULL, ids=[f"{f[0][0]}-{f[3]}-{len(f[2])}" for f in FULL]
)
def test_a_full_disk_is_one_line_and_leaves_one_consistent_run(
    script, extra, refused, named, files, tmp_path, monkeypatch
):
    """No room left on the disk, into a folder holding an earlier run: for every file from the first one written on
    (the earlier run stays as it was), for metrics.json alone (the same), or for the GIF alone (the rest of the set
    is kept, metrics.json saying the GIF is missing and why). One line, 'error: no space left on device while
    writing <file>; <what the folder holds>', exit status 1. Catches: a traceback, a metrics.json that claims a
    complete run beside no checkpoint, a truncated file, a partial file left behind."""
    module = load_script(script)
    out = tmp_path / "out"
    earlier = earlier_run(out, NAMES[script])
    full_disk(monkeypatch, out, refused)
    with pytest.raises(SystemExit) as exit_:
        module.main(module.parse_args([*FLAGS[script], *extra, "--out", str(out)]))
    line = exit_.value.code  # sys.exit(line): printed on stderr, exit status 1
    assert isinstance(line, str) and "\n" not in line, line
    assert line.startswith(f"error: no space left on device while writing {named}; "), line
    metrics = one_run(out, earlier)
    if files is None:
        assert metrics is None and line.endswith(f"; nothing written to {out}"), line
        return
    stop = metrics["interrupted"]
    assert stop["error"] == f"no space left on device while writing {named}" and named in stop["missing"]
    assert {p.name for p in out.iterdir()} == files and kept(line, out)[1:] == (files, stop["missing"])


@pytest.mark.unit
def test_a_file_that_fails_half_way_gives_its_space_back(tmp_path):
    """Outputs.write of a file that fails half-way (here ENOSPC after a few bytes): a WriteError of one line that
    names it, and its partial file is deleted at once, so that the smaller metrics.json of the kept set may still
    fit. Catches a partial file left to fill the disk."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    out = ql.Outputs(str(tmp_path / "out"), {"learning_curve.png": True})

    def half(path):
        with open(path, "wb") as f:
            f.write(b"the first bytes")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    try:
        with pytest.raises(ql.WriteError, match="^no space left on device while writing learning_curve.png$"):
            out.write("learning_curve.png", half)
        assert os.listdir(out.staging) == [] and out.written == []
    finally:
        out.close()
    assert sorted(os.listdir(tmp_path / "out")) == []  # no lock, no staging folder


# ------------------------------------------------------------------ two runs, one folder
def test_a_second_run_into_the_same_folder_is_refused(tmp_path, capsys):
    """Two runs into one --out: while a process holds the folder's lock (here a `sleep`, standing for a first run),
    a second run refuses at once, in one line that names that process, and writes nothing; the first run's lock and
    the earlier run's files stay. Catches: two runs that both write (the one that ends last silently replacing the
    other's files), a refusal without the PID, a second run that removes the first's lock."""
    out = tmp_path / "out"
    earlier = earlier_run(out, NAMES["1_Q_Learning/Q_Learning.py"])
    first = subprocess.Popen(["sleep", "60"])
    try:
        (out / ".lock").write_text(str(first.pid))
        ql = load_script("1_Q_Learning/Q_Learning.py")
        with pytest.raises(SystemExit) as exit_:
            ql.main(ql.parse_args(["--episodes", "100", "--out", str(out)]))
    finally:
        first.kill()
        first.wait()
    lock = out / ".lock"
    assert exit_.value.code == (
        f"error: --out {str(out)!r} is in use by the run of PID {first.pid}; wait for it to end or pick another "
        f"--out (its lock file: {lock})"
    )
    assert capsys.readouterr().out == ""  # refused before any work
    assert lock.read_text() == str(first.pid)
    lock.unlink()
    assert one_run(out, earlier) is None


def test_a_stale_lock_is_taken_over(tmp_path, capsys):
    """A lock left by a run that no longer exists (killed with SIGKILL, or its machine rebooted) does not block the
    folder: the next run says that it takes the lock over, runs, and removes the lock when it ends. Catches a lock
    that is never released, and a stale one that blocks every later run."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(ended.stdout)  # a process that has ended
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text(str(pid))
    ql = load_script("1_Q_Learning/Q_Learning.py")
    ql.main(ql.parse_args(["--episodes", "100", "--out", str(out)]))
    assert f"{out / '.lock'}: PID {pid} has ended; its lock is taken over\n" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["learning_curve.png", "metrics.json", "q_map.png"]


# ------------------------------------------------------------------ SIGTERM before main, and a swallowed signal
def test_sigterm_while_the_libraries_load(tmp_path):
    """SIGTERM during the script's first import of a library waits until main can report it: one line, exit
    status 143, nothing written. Catches the process killed without a word (status -15) and a traceback. (The
    line that holds SIGTERM back is in every script: the test below.)"""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PRESS_WHILE_LOADING.replace("SIGINT", "SIGTERM"))
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(tmp_path / "site")}
    code, stdout, stderr = interrupt("1_Q_Learning/Q_Learning.py", ["--out", str(out)], None, tmp_path, env)
    assert (code, stderr, stdout) == (143, f"interrupted; nothing written to {out}\n", "")
    assert not out.exists()


@pytest.mark.unit
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_holds_sigterm_back_while_its_libraries_load(script):
    """The statement that holds a SIGTERM back until main handles it comes right before the guarded imports of the
    libraries, and runs from the command line only (a test that imports the script keeps its own SIGTERM). Catches
    a script without it, whose SIGTERM while loading ends it without a word."""
    import ast

    body = ast.parse((REPO / script).read_text()).body
    guarded = next(k for k, node in enumerate(body) if isinstance(node, ast.Try))  # try: import numpy as np ...
    assert "import numpy as np" in ast.unparse(body[guarded]), script
    hold = "if __name__ == '__main__':\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})"
    assert ast.unparse(body[guarded - 1]) == hold, script


def test_a_signal_swallowed_by_a_library_callback_still_stops_the_run(tmp_path, monkeypatch, capsys):
    """JAX runs Python code from the garbage collector (_xla_gc_callback); a KeyboardInterrupt raised inside such a
    callback cannot propagate: Python prints 'Exception ignored … KeyboardInterrupt' and goes on. Here SIGINT lands
    in a garbage-collector callback during training: the run still stops, a moment later, with one line and exit
    status 130. Catches a run that goes on to its end and exits 0, and the lines of 'Exception ignored'."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    real, calls = ql.run_episode, []

    def callback(phase, info):
        gc.callbacks.remove(callback)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs here, in the collector's callback: the signal cuts the sleep short

    def run_episode(*args):
        calls.append(None)
        if len(calls) == 10:
            gc.callbacks.append(callback)
            gc.collect()
        return real(*args)

    monkeypatch.setattr(ql, "run_episode", run_episode)
    out = tmp_path / "out"
    assert exit_status(ql.main, ql.parse_args(["--episodes", "100000", "--evals", "100", "--out", str(out)])) == 130
    line = capsys.readouterr().err
    assert line.startswith("interrupted at episode ") and line.count("\n") == 1, line
    assert json.loads((out / "metrics.json").read_text())["interrupted"]["at"] < 100_000
