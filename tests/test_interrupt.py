"""Every way a run can stop, as a user meets it: Ctrl-C (SIGINT) or SIGTERM at any moment, a full disk, two runs
started at once. One line on stderr, exit status 130, 143 or 1, no traceback. Each run writes a folder of its own,
<out>/<date>-<time>-seed<seed>, so no folder ever mixes two runs and an earlier run is never touched; each file is
whole under its name or absent; metrics.json is written last and only by a complete run, and <out>/latest points at
the newest complete run.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, load_script

pytestmark = pytest.mark.smoke

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}

# Per script: tiny flags for a whole run, in this process (what a script does around training is the same code as on
# the command line), and the files a complete run writes besides metrics.json, in the order it saves them.
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
SAVED = {
    "1_Q_Learning/Q_Learning.py": ["learning_curve.png"],
    "2_Cart_Pole_DQN/cart_pole_dqn.py": ["q_network", "learning_curve.png"],
    "3_Pendulum/pendulum.py": ["params", "learning_curve.png"],
    "4_GRPO_MNIST/grpo_mnist.py": ["policy", "learning_curve.png"],
    "5_Sharding_Mesh/sharding_mesh.py": ["loss_curve.png"],
}
# Per script, from the command line: flags that train far longer than the test waits, the stdout line to wait for (a
# progress line: training has started), and the signal the test sends (SIGINT as Ctrl-C, SIGTERM as a scheduler).
LONG = {
    "1_Q_Learning/Q_Learning.py": (["--episodes", "5000000", "--evals", "5000"], "episode=", signal.SIGTERM),
    "2_Cart_Pole_DQN/cart_pole_dqn.py": (
        [*FLAGS["2_Cart_Pole_DQN/cart_pole_dqn.py"], "--total-timesteps", "10000000"],
        "step=",
        signal.SIGINT,
    ),
    "3_Pendulum/pendulum.py": (
        [*FLAGS["3_Pendulum/pendulum.py"], "--total-timesteps", "100000000"],
        "update=",
        signal.SIGTERM,
    ),
    "4_GRPO_MNIST/grpo_mnist.py": (
        [*FLAGS["4_GRPO_MNIST/grpo_mnist.py"], "--iterations", "1000000"],
        "phase=rl",
        signal.SIGINT,
    ),
    "5_Sharding_Mesh/sharding_mesh.py": (
        [*FLAGS["5_Sharding_Mesh/sharding_mesh.py"], "--host-devices", "2", "--rules", "all", "--steps", "100000"],
        "rules=single_device step=",
        signal.SIGTERM,
    ),
}


def test_every_script_is_covered():
    assert sorted(FLAGS) == sorted(SAVED) == sorted(LONG) == SCRIPTS


def earlier_run(out: Path) -> dict:
    """A complete earlier run under `out`, that `latest` points at. Returns {path: bytes} of everything in `out`."""
    folder = out / "20000101-000000-seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"earlier run": True}))
    (folder / "learning_curve.png").write_bytes(b"an earlier run's figure")
    (out / "latest").symlink_to(folder.name)
    return snapshot(out)


def snapshot(out: Path) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def new_folders(out: Path) -> list[Path]:
    """This test's run folders: every folder under `out` but the earlier run's."""
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("2000"))


def whole(path: Path) -> bool:
    """A complete file of its kind: a PNG up to its IEND chunk, a GIF up to its trailer, JSON that parses, an orbax
    checkpoint folder that orbax marked committed."""
    if path.is_dir():
        return (path / "_CHECKPOINT_METADATA").exists() or (path / "commit_success.txt").exists()
    data = path.read_bytes()
    if path.suffix == ".png":
        return data.startswith(b"\x89PNG") and data[-8:-4] == b"IEND"
    if path.suffix == ".gif":
        return data.startswith(b"GIF8") and data.endswith(b";")
    return bool(json.loads(data))


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


def send(sig) -> None:
    """The signal, to this process, as a user's Ctrl-C or a scheduler's SIGTERM: its handler runs at the next line."""
    os.kill(os.getpid(), sig)


def interrupt(script, argv, wait_for, cwd, sig=signal.SIGINT, env=None, after=0.0, timeout=180):
    """Start `script`; once a stdout line starts with `wait_for`, wait `after` seconds and send `sig` (None for
    wait_for: send nothing). Returns (return code, stdout, stderr). A run still going after `timeout` s is killed."""
    # A child inherits an ignored SIGINT (as under `nohup` or a background job): start it with SIGINT handled.
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
                    time.sleep(after)
                    proc.send_signal(sig)
                    break
        rest, stderr = proc.communicate()
    finally:
        watchdog.cancel()
    return proc.returncode, "".join(stdout) + rest, stderr


# ------------------------------------------------------------------ a stop during training, from the command line
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_during_training_keeps_nothing_and_leaves_the_earlier_run(script, tmp_path):
    """Ctrl-C or SIGTERM while the script trains, into an --out that holds an earlier complete run: one line,
    'interrupted; nothing written', exit status 130 / 143; this run's folder is gone; the earlier run and `latest`
    are untouched. Catches: a traceback, status -2 / -15, a half run left as a folder, an earlier run changed."""
    flags, wait_for, sig = LONG[script]
    out = tmp_path / "out"
    earlier = earlier_run(out)
    code, stdout, stderr = interrupt(script, [*flags, "--out", str(out)], wait_for, tmp_path, sig)
    assert (code, stderr) == (STATUS[sig], "interrupted; nothing written\n"), (code, stderr[-3000:])
    assert snapshot(out) == earlier and new_folders(out) == []
    assert os.readlink(out / "latest") == "20000101-000000-seed0"


PRESS_WHILE_LOADING = """
import os, signal, sys


class Press:
    def find_spec(self, name, path=None, target=None):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back  # importlib's own frames, up to the import statement
        library = name.partition(".")[0] not in sys.stdlib_module_names
        if library and frame is not None and frame.f_globals.get("__name__") == "__main__":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGNAL)
        return None


sys.meta_path.insert(0, Press())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_the_libraries_load(sig, tmp_path):
    """The signal arrives during the script's first import of a library (NumPy): it waits until main can report it,
    one line, exit status 130 / 143, nothing written. Catches the traceback Python prints for a KeyboardInterrupt at
    import time (status -2), and a SIGTERM that kills the process without a word (-15). The lines that hold it back
    are the same in every script (tests/test_cli.py)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(PRESS_WHILE_LOADING.replace("SIGNAL", sig.name))
    out = tmp_path / "out"
    env = {"PYTHONPATH": str(tmp_path / "site")}
    code, stdout, stderr = interrupt("1_Q_Learning/Q_Learning.py", ["--out", str(out)], None, tmp_path, env=env)
    assert (code, stderr, stdout) == (STATUS[sig], "interrupted; nothing written\n", ""), stderr[-3000:]
    assert not out.exists() or new_folders(out) == []


@pytest.mark.parametrize("after", [0.0, 0.05])
def test_a_signal_while_a_finished_run_exits(after, tmp_path):
    """SIGTERM just after the run printed its last line (its files are complete): the process has exited 0 already,
    or it ends with the true line and status 143. Never killed silently (-15) and never a traceback."""
    out = tmp_path / "out"
    flags = [*FLAGS["1_Q_Learning/Q_Learning.py"], "--out", str(out)]
    code, stdout, stderr = interrupt(
        "1_Q_Learning/Q_Learning.py", flags, "outputs:", tmp_path, signal.SIGTERM, after=after
    )
    (folder,) = new_folders(out)
    assert (code, stderr) in [(0, ""), (143, f"interrupted once the run was complete; {folder} holds all of it\n")]
    assert sorted(p.name for p in folder.iterdir()) == sorted(["metrics.json", *SAVED["1_Q_Learning/Q_Learning.py"]])


# ------------------------------------------------------------------ a stop after training, in this process
def stop_at(module, monkeypatch, method: str, call: int, sig, before: bool = True) -> None:
    """The signal arrives at the call-th call of Run.<method>: before it does anything, or once it is done."""
    real, calls = getattr(module.Run, method), []

    def wrapped(self, *args, **kwargs):
        calls.append(None)
        if before and len(calls) == call:
            send(sig)
        result = real(self, *args, **kwargs)
        if not before and len(calls) == call:
            send(sig)
        return result

    monkeypatch.setattr(module.Run, method, wrapped)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stop_after_training_keeps_what_was_saved_and_says_so(script, tmp_path, monkeypatch, capsys):
    """SIGTERM once the run has saved its trained parameters and figures, before metrics.json: the one line names
    this run's folder and every file kept there (the checkpoint first, in the scripts that save one), and says the
    run is not complete; the folder holds exactly those files, each whole, and no metrics.json; `latest` still
    points at the earlier complete run. Catches: a finished training thrown away, a line that names files not on
    disk, a metrics.json that claims a complete run, `latest` moved to an incomplete run."""
    module = load_script(script)
    out = tmp_path / "out"
    earlier = earlier_run(out)
    stop_at(module, monkeypatch, "finish", 1, signal.SIGTERM)
    assert exit_status(module.main, module.parse_args([*FLAGS[script], "--out", str(out)])) == 143
    (folder,) = new_folders(out)
    kept = SAVED[script]
    assert capsys.readouterr().err == (
        f"interrupted; kept in {folder}: {', '.join(kept)} (not complete: no metrics.json)\n"
    )
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)
    assert all(whole(folder / name) for name in kept)
    assert {k: v for k, v in snapshot(out).items() if not k.startswith(folder.name)} == earlier


@pytest.mark.parametrize("call", [1, 2])
def test_a_stop_at_each_save_keeps_exactly_the_files_before_it(call, tmp_path, monkeypatch, capsys):
    """SIGINT as the run starts its call-th save (the figure, then metrics.json): the files saved before it are
    kept and named, the one it was about to write is absent, nothing is partial. Catches a partial file left behind
    and a line that lists a file the stop prevented."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    out = tmp_path / "out"
    stop_at(ql, monkeypatch, "save", call, signal.SIGINT)
    assert exit_status(ql.main, ql.parse_args([*FLAGS["1_Q_Learning/Q_Learning.py"], "--out", str(out)])) == 130
    kept = SAVED["1_Q_Learning/Q_Learning.py"][: call - 1]
    line = capsys.readouterr().err
    if not kept:
        assert line == "interrupted; nothing written\n"
        assert not out.exists() or new_folders(out) == []
        return
    (folder,) = new_folders(out)
    assert line == f"interrupted; kept in {folder}: {', '.join(kept)} (not complete: no metrics.json)\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted(kept)
    assert not (out / "latest").exists()


def test_a_stop_inside_a_write_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """SIGTERM while a figure is half-written: the half file goes with the stop. Catches a `partial-` file left."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    real = ql.plot_curve

    def half_then_stop(path, *args):
        Path(path).write_bytes(b"\x89PNG half")
        send(signal.SIGTERM)
        return real(path, *args)

    monkeypatch.setattr(ql, "plot_curve", half_then_stop)
    out = tmp_path / "out"
    assert exit_status(ql.main, ql.parse_args([*FLAGS["1_Q_Learning/Q_Learning.py"], "--out", str(out)])) == 143
    assert capsys.readouterr().err == "interrupted; nothing written\n"
    assert not out.exists() or new_folders(out) == []


@pytest.mark.parametrize("script", ["2_Cart_Pole_DQN/cart_pole_dqn.py", "3_Pendulum/pendulum.py"])
def test_a_stop_while_orbax_writes_the_checkpoint_leaves_nothing(script, tmp_path, monkeypatch, capsys):
    """SIGTERM as orbax returns from writing the checkpoint (its last step, moving the folder into place, may still
    be under way): nothing is kept, and no temporary checkpoint folder is left in the run's folder (module 4 checks
    its own in tests/test_grpo.py). Catches an orbax temporary folder left behind beside no metrics.json."""
    import orbax.checkpoint as ocp

    module = load_script(script)
    real = ocp.StandardCheckpointer.save

    def save(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        send(signal.SIGTERM)
        return result

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", save)
    out = tmp_path / "out"
    assert exit_status(module.main, module.parse_args([*FLAGS[script], "--out", str(out)])) == 143
    time.sleep(0.5)  # anything orbax still had running in the background has had its time
    assert capsys.readouterr().err == "interrupted; nothing written\n"
    assert not out.exists() or new_folders(out) == []


def test_a_stop_once_the_run_is_complete_says_so(tmp_path, monkeypatch, capsys):
    """SIGTERM right after metrics.json is in place: the run is complete and kept whole, `latest` points at it, and
    the one line says so, exit status 143. Catches a complete run reported as lost or as incomplete."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    out = tmp_path / "out"
    stop_at(ql, monkeypatch, "finish", 1, signal.SIGTERM, before=False)
    assert exit_status(ql.main, ql.parse_args([*FLAGS["1_Q_Learning/Q_Learning.py"], "--out", str(out)])) == 143
    (folder,) = new_folders(out)
    assert capsys.readouterr().err == f"interrupted once the run was complete; {folder} holds all of it\n"
    assert json.loads((out / "latest" / "metrics.json").read_text())["episodes"] == 200
    assert (out / "latest").resolve() == folder.resolve()


# ------------------------------------------------------------------ a signal swallowed by a library callback
def swallow_at_episode(ql, monkeypatch, episode: int, sig) -> None:
    """At that episode, the signal lands inside a garbage-collector callback, as it can inside JAX's
    (_xla_gc_callback): Python cannot pass the KeyboardInterrupt on from there, and the run goes on."""
    real, calls = ql.run_episode, []

    def callback(phase, info):
        gc.callbacks.remove(callback)
        send(sig)
        time.sleep(1)  # the handler runs here, in the collector's callback: the signal cuts the sleep short

    def run_episode(*args):
        calls.append(None)
        if len(calls) == episode:
            gc.callbacks.append(callback)
            gc.collect()
        return real(*args)

    monkeypatch.setattr(ql, "run_episode", run_episode)


def test_a_swallowed_signal_still_ends_the_run_before_it_is_complete(tmp_path, monkeypatch, capsys):
    """SIGTERM swallowed inside a library callback during training, and sent once only (as a scheduler does): the
    run does not mark itself complete; it ends at finish() with the one line and status 143, its figure kept, no
    metrics.json. Catches a stop lost (the run completes and exits 0) and Python's 'Exception ignored' lines."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    swallow_at_episode(ql, monkeypatch, 10, signal.SIGTERM)
    ignored = []  # what Python would print as 'Exception ignored in: ...' (pytest's own hook turns it into a warning)
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    out = tmp_path / "out"
    assert exit_status(ql.main, ql.parse_args(["--episodes", "200", "--out", str(out)])) == 143
    assert ignored == []
    (folder,) = new_folders(out)
    assert capsys.readouterr().err == (
        f"interrupted; kept in {folder}: learning_curve.png (not complete: no metrics.json)\n"
    )


def test_a_second_ctrl_c_stops_the_run_when_the_first_was_swallowed(tmp_path, monkeypatch, capsys):
    """The first Ctrl-C is swallowed by a library callback; the user presses again: the run stops there, during
    training, in one line. Catches a handler that ignores a second signal once one was received."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    swallow_at_episode(ql, monkeypatch, 10, signal.SIGINT)
    real, calls = ql.evaluate_greedy, []

    def evaluate_greedy(*args):
        calls.append(None)
        if len(calls) == 2:
            send(signal.SIGINT)  # the second press
        if len(calls) > 2:
            raise AssertionError("the run went on after the second Ctrl-C")
        return real(*args)

    monkeypatch.setattr(ql, "evaluate_greedy", evaluate_greedy)
    out = tmp_path / "out"
    flags = ["--episodes", "1000000", "--evals", "1000", "--out", str(out)]
    assert exit_status(ql.main, ql.parse_args(flags)) == 130
    assert capsys.readouterr().err == "interrupted; nothing written\n"
    assert len(calls) == 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_that_a_library_turns_into_another_error_is_still_a_stop(sig, tmp_path, monkeypatch, capsys):
    """The signal lands inside library code that catches the KeyboardInterrupt and raises its own error (JAX's cache
    does: 'ValueError: Cache keys should be comparable using __eq__', seen on GRPO's jax.random.split): still one
    line, 'interrupted; …', status 130 / 143. Catches a handler that lets that ValueError out as a traceback."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    real, calls = ql.run_episode, []

    def run_episode(*args):
        calls.append(None)
        if len(calls) == 10:
            try:
                send(sig)
                time.sleep(1)  # the handler runs here and raises KeyboardInterrupt
            except KeyboardInterrupt as stop:
                raise ValueError("Cache keys should be comparable using __eq__") from stop
        return real(*args)

    monkeypatch.setattr(ql, "run_episode", run_episode)
    out = tmp_path / "out"
    earlier = earlier_run(out)
    assert exit_status(ql.main, ql.parse_args(["--episodes", "200", "--out", str(out)])) == STATUS[sig]
    assert capsys.readouterr().err == "interrupted; nothing written\n"
    assert snapshot(out) == earlier and new_folders(out) == [] and len(calls) == 10


def test_an_error_without_a_stop_is_not_called_a_stop(tmp_path, monkeypatch):
    """The same ValueError with no signal is a bug: it leaves main as itself (its traceback), not as 'interrupted'.
    Catches a handler that calls every exception a stop."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    monkeypatch.setattr(ql, "run_episode", lambda *args: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        ql.main(ql.parse_args(["--episodes", "200", "--out", str(tmp_path / "out")]))


# ------------------------------------------------------------------ a full disk
@pytest.mark.parametrize("full_at", [1, 2])
def test_a_full_disk_is_one_line_and_keeps_what_was_whole(full_at, tmp_path, monkeypatch, capsys):
    """No room left on the disk from the full_at-th file on (the figure, then metrics.json): one line,
    'error: no space left on device while writing <file>; <what the folder holds>', exit status 1; the half-written
    file is gone (its space given back), the files before it are whole; the earlier run is untouched. Catches: a
    traceback, a partial file left behind, a metrics.json beside a failed figure."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    real, calls = ql.Run.save, []

    def save(self, name, writer, *args):
        calls.append(name)

        def full(path, *args):
            Path(path).write_bytes(b"the first bytes")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

        return real(self, name, full if len(calls) >= full_at else writer, *args)

    monkeypatch.setattr(ql.Run, "save", save)
    out = tmp_path / "out"
    earlier = earlier_run(out)
    assert exit_status(ql.main, ql.parse_args([*FLAGS["1_Q_Learning/Q_Learning.py"], "--out", str(out)])) == 1
    named = [*SAVED["1_Q_Learning/Q_Learning.py"], "metrics.json"][full_at - 1]
    kept = SAVED["1_Q_Learning/Q_Learning.py"][: full_at - 1]
    line = capsys.readouterr().err
    assert line.startswith(f"error: no space left on device while writing {named}; ") and line.count("\n") == 1
    folders = new_folders(out)
    if not kept:
        assert line.endswith("; nothing written\n") and folders == []
    else:
        assert sorted(p.name for p in folders[0].iterdir()) == sorted(kept)
        assert line.endswith(f"; kept in {folders[0]}: {', '.join(kept)} (not complete: no metrics.json)\n")
    assert {k: v for k, v in snapshot(out).items() if k.startswith(("2000", "latest"))} == earlier


ORBAX_FULL_DISK = "RESOURCE_EXHAUSTED: Failed writing \"d/0\": No space left on device [os_error_code='28']"


@pytest.mark.parametrize(
    "script", ["2_Cart_Pole_DQN/cart_pole_dqn.py", "3_Pendulum/pendulum.py", "4_GRPO_MNIST/grpo_mnist.py"]
)
def test_a_full_disk_while_orbax_writes_the_checkpoint_is_one_line(script, tmp_path, monkeypatch, capsys):
    """orbax reports a write that found the disk full as this ValueError (measured on a 40 kB tmpfs): the run ends
    with 'error: no space left on device while writing <checkpoint>; nothing written', exit status 1, and no folder.
    Catches the ValueError let through as a traceback, and orbax's temporary folder left in the run's folder."""
    import orbax.checkpoint as ocp

    module = load_script(script)

    def full_disk(self, path, *args, **kwargs):
        os.makedirs(f"{path}.orbax-checkpoint-tmp/d")
        raise ValueError(ORBAX_FULL_DISK)

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", full_disk)
    out = tmp_path / "out"
    assert exit_status(module.main, module.parse_args([*FLAGS[script], "--out", str(out)])) == 1
    checkpoint = SAVED[script][0]
    assert capsys.readouterr().err == f"error: no space left on device while writing {checkpoint}; nothing written\n"
    assert not out.exists() or new_folders(out) == []


# ------------------------------------------------------------------ two runs at once
def test_two_runs_started_at_once_with_the_same_flags_both_keep_their_results(tmp_path):
    """Two processes, the same flags and seed, started together into one --out: each gets a folder of its own (the
    second takes the name with -2 when both start in the same second), both complete, and `latest` points at one of
    them. Catches two runs writing into one folder (one's files replacing the other's)."""
    out = tmp_path / "out"
    argv = [sys.executable, str(REPO / "1_Q_Learning/Q_Learning.py"), *FLAGS["1_Q_Learning/Q_Learning.py"]]
    procs = [subprocess.Popen([*argv, "--out", str(out)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    folders = new_folders(out)
    assert len(folders) == 2
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ["metrics.json", *SAVED["1_Q_Learning/Q_Learning.py"]]
        )
        assert sum(f"outputs: {folder} " in text for text in outputs) == 1
    assert (out / "latest").resolve() in [f.resolve() for f in folders]


@pytest.mark.unit
def test_runs_in_the_same_second_get_folders_of_their_own(tmp_path):
    """Run() in the same second as another run with the same seed takes the next name; neither writes into the
    other's folder. Catches a folder shared because its name is only the time and the seed."""
    ql = load_script("1_Q_Learning/Q_Learning.py")
    args = ql.Args(out=str(tmp_path))
    folders = [ql.Run(args).folder for _ in range(3)]
    assert len(set(folders)) == 3 and all(os.path.isdir(f) for f in folders)
    assert folders[1] == folders[0] + "-2" or os.path.basename(folders[1]) != os.path.basename(folders[0])
