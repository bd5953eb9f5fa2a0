"""tools/seeds.py: the seed parser and statistics against hand-computed numbers, and the CLI on tiny runs."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, load_script

seeds = load_script("tools/seeds.py")


def run_tool(*args: str, cwd=REPO, timeout: float = 300):
    return subprocess.run(
        [sys.executable, str(REPO / "tools/seeds.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# ----------------------------------------------------------------------------- unit


@pytest.mark.unit
@pytest.mark.parametrize(
    "text, expected",
    [
        ("0-4", [0, 1, 2, 3, 4]),
        ("3", [3]),
        ("0,5,7-9", [0, 5, 7, 8, 9]),
        (" 2 - 3 ", [2, 3]),
        ("10-10", [10]),
    ],
)
def test_parse_seeds(text, expected):
    assert seeds.parse_seeds(text) == expected


@pytest.mark.unit
@pytest.mark.parametrize("text", ["", "5-3", "a-b", "1-", "-2", "1,,2", "1-3,2", "1.5"])
def test_parse_seeds_rejects(text):
    with pytest.raises(seeds.SweepError):
        seeds.parse_seeds(text)


@pytest.mark.unit
def test_iqm_is_the_mean_of_the_middle_half():
    # 8 scores: drop the 2 lowest and the 2 highest, average the middle 4.
    x = [1, 100, 3, 4, 5, 6, -50, 8]
    assert seeds.iqm(x) == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert seeds.iqm([2.0, 2.0, 2.0, 2.0]) == 2.0
    # 10 scores: int(0.25 · 10) = 2 cut from each end; the middle six are 3, 4, 5, 6, 7, 8 -> 33 / 6 = 5.5.
    assert seeds.iqm([9, 1000, 3, 4, 5, 6, 7, 8, -1000, 2]) == pytest.approx(5.5)


@pytest.mark.unit
def test_iqm_ci_brackets_the_iqm_and_is_reproducible():
    rng = np.random.default_rng(1)
    x = rng.normal(400, 50, size=20)
    lo, hi = seeds.iqm_ci(x)
    assert lo < seeds.iqm(x) < hi
    assert (lo, hi) == seeds.iqm_ci(x)  # fixed bootstrap seed: the table reproduces
    assert hi - lo < 100  # a 95 % interval of 20 draws with σ = 50 is tens wide, not hundreds
    assert seeds.iqm_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)
    assert seeds.iqm_ci([5.0]) is None


@pytest.mark.unit
def test_summary_counts_the_bar_and_takes_the_median_time():
    s = seeds.summarise(
        {0: 500.0, 1: 474.9, 2: 475.0, 3: 120.0},
        {0: 7.0, 1: 9.0, 2: 8.0, 3: 100.0},
        seeds.Headline("eval_return_mean", 475.0),
    )
    assert s["solved"] == 2  # 500 and 475 reach the bar; 474.9 does not
    assert s["mean"] == pytest.approx((500 + 474.9 + 475 + 120) / 4)
    assert s["median"] == pytest.approx((474.9 + 475) / 2)
    assert s["min"] == 120.0 and s["median_seconds"] == pytest.approx(8.5)
    assert seeds.summarise({0: 0.9}, {0: 1.0}, seeds.Headline("test_pass1", None))["solved"] is None


@pytest.mark.unit
def test_known_headlines():
    h = seeds.headline_for(REPO / "2_Cart_Pole_DQN" / "cart_pole_dqn.py", None, None)
    assert h == seeds.Headline("eval_return_mean", 475.0)
    assert seeds.headline_for(REPO / "3_Pendulum" / "pendulum.py", None, None).bar == -200.0
    assert seeds.headline_for(REPO / "1_Q_Learning" / "Q_Learning.py", None, None).metric == "policy_is_optimal"
    grpo = REPO / "4_GRPO_MNIST" / "grpo_mnist.py"
    assert seeds.headline_for(grpo, None, None) == seeds.Headline("test_pass1", None)
    assert seeds.headline_for(REPO / "4_GRPO_MNIST" / "grpo_mnist.py", "val_pass1", None).bar is None
    with pytest.raises(seeds.SweepError):
        seeds.headline_for(REPO / "tools" / "seeds.py", None, None)


# ----------------------------------------------------------------------------- CLI on tiny runs


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One sweep of two tiny Q-learning seeds, in this process (its command line's one-line error is run as a
    subprocess below); each seed is still a subprocess of its own, run through --python by a wrapper interpreter
    that logs its calls, then runs this Python. Returns (the sweep's --out, what it printed, the wrapper, its log).
    Two seeds: enough for a seed to be dropped or repeated, and for the IQM's interval (none below two seeds)."""
    tmp_path = tmp_path_factory.mktemp("sweep")
    calls = tmp_path / "calls.txt"
    wrapper = tmp_path / "python-peer"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    argv = ["--python", str(wrapper), "1_Q_Learning/Q_Learning.py", "--seeds", "0-1", "--out", str(tmp_path)]
    argv += ["--metric", "greedy_return", "--bar", "95", "--save", "demo", "--also", "env_steps,episodes@4"]
    argv += ["--results-dir", str(tmp_path / "results"), "--", "--episodes", "3"]
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(io.StringIO()) as stdout:
        monkeypatch.chdir(REPO)
        seeds.main(argv)
    return tmp_path, stdout.getvalue(), wrapper, calls


@pytest.mark.smoke
def test_sweep_runs_each_seed_and_writes_the_table(sweep):
    tmp_path, stdout, wrapper, _ = sweep
    folder = tmp_path / "q_learning" / "episodes_3_seeds-0-1"
    summary = json.loads((folder / "summary.json").read_text())
    # Each run is really a separate run with its own seed and folder.
    per_run = {s: json.loads((folder / f"seed_{s}" / "latest" / "metrics.json").read_text()) for s in (0, 1)}
    assert [per_run[s]["args"]["seed"] for s in (0, 1)] == [0, 1]
    assert all(per_run[s]["episodes"] == 3 for s in (0, 1))
    assert summary["per_seed"] == {str(s): per_run[s]["greedy_return"] for s in (0, 1)}
    assert summary["solved"] == sum(per_run[s]["greedy_return"] >= 95 for s in (0, 1))
    # By hand: 25 % of 2 scores is 0.5, so scipy's trim_mean cuts int(0.5) = 0 from each end and the IQM of two
    # seeds is their plain mean (a tool that summarised the wrong key, or dropped a seed, fails here); its bootstrap
    # interval resamples the two scores, so it lies within [min, max] of them.
    returns = [per_run[s]["greedy_return"] for s in (0, 1)]
    assert summary["iqm"] == pytest.approx(sum(returns) / 2)
    lo, hi = summary["iqm_ci95"]
    assert min(returns) <= lo <= summary["iqm"] <= hi <= max(returns)
    saved = json.loads((tmp_path / "results" / "demo.json").read_text())  # --save: the same summary + provenance
    assert saved["per_seed"] == summary["per_seed"] and saved["iqm"] == summary["iqm"]
    assert saved["provenance"]["command"].endswith("--also env_steps,episodes@4 --save demo -- --episodes 3")
    # --also: the same runs, other keys, one file each (a tool that re-ran seeds or mixed keys up fails here)
    for key in ("env_steps", "episodes"):
        also = json.loads((tmp_path / "results" / f"demo.{key}.json").read_text())
        assert also["metric"] == key and also["per_seed"] == {str(s): per_run[s][key] for s in (0, 1)}
        assert also["provenance"] == saved["provenance"]
    # KEY@BAR: the also-file counts the seeds at or above its own bar (3 episodes < 4: none; no bar: no count)
    assert json.loads((tmp_path / "results" / "demo.episodes.json").read_text())["solved"] == 0
    assert json.loads((tmp_path / "results" / "demo.env_steps.json").read_text()).get("solved") is None
    assert saved["provenance"]["versions"]["jax"] and saved["provenance"]["machine"]["cores"] >= 1
    assert (folder / "scores.png").stat().st_size > 1000
    table = (folder / "summary.md").read_text()
    command = f"python tools/seeds.py --python {wrapper} 1_Q_Learning/Q_Learning.py --seeds 0-1"  # the peer's python
    assert command in table and "-- --episodes 3" in table
    assert "IQM [95 % CI]" in table and table in stdout
    assert stdout.count("seed=") == 2


@pytest.mark.smoke
@pytest.mark.parametrize(
    "argv, message",
    [
        (["no/such_script.py", "--seeds", "0-2"], "no such script"),
        (["1_Q_Learning/Q_Learning.py", "--seeds", "4-2"], "empty range"),
        (["1_Q_Learning/Q_Learning.py", "--seeds", "x"], "cannot read"),
        (["1_Q_Learning/Q_Learning.py"], "--seeds"),
        (["1_Q_Learning/Q_Learning.py", "--seeds", "0", "--", "--seed", "3"], "set by the sweep"),
        (
            ["1_Q_Learning/Q_Learning.py", "--seeds", "0", "--metric", "no_such_key", "--", "--episodes", "2"],
            "no_such_key",
        ),
    ],
)
def test_bad_input_is_one_line(argv, message, tmp_path, monkeypatch):
    """In this process: every bad input is a SweepError with a one-line message, which the command line prints as
    `error: …` with exit status 1 (test_a_failing_run_stops_the_sweep… runs that path as a subprocess)."""
    monkeypatch.chdir(REPO)
    with pytest.raises(seeds.SweepError) as error:
        seeds.main(["--out", str(tmp_path), *argv])
    assert message in str(error.value) and "\n" not in str(error.value), error.value


@pytest.mark.smoke
def test_a_failing_run_stops_the_sweep_but_keeps_the_finished_ones(tmp_path, monkeypatch):
    # A bad flag value (--episodes -1) makes every run fail: the sweep stops at the first one.
    r = run_tool("1_Q_Learning/Q_Learning.py", "--seeds", "0-3", "--out", str(tmp_path), "--", "--episodes", "-1")
    assert r.returncode != 0 and "seed 0 failed" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("summary.json"))  # nothing finished, nothing to summarise
    # A finished run is summarised even when a later one fails: make seed 1's folder unwritable.
    blocker = tmp_path / "q_learning" / "episodes_2_seeds-0-3" / "seed_1"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the run's folder should be")
    # In this process (the command line's `error: …` path is the subprocess above): the same SweepError, one line.
    monkeypatch.chdir(REPO)
    with pytest.raises(seeds.SweepError) as error:
        seeds.main(["1_Q_Learning/Q_Learning.py", "--seeds", "0-3", "--out", str(tmp_path), "--", "--episodes", "2"])
    message = str(error.value)
    assert message.startswith("seed 1: cannot create") and "1 finished run(s) summarised" in message, message
    assert "\n" not in message
    assert not (blocker.parent / "seed_2").exists()  # the sweep stopped at the failure
    summary = json.loads((blocker.parent / "summary.json").read_text())
    assert list(summary["per_seed"]) == ["0"]
    # this interpreter (no --python): the command names none
    assert summary["command"] == "python tools/seeds.py 1_Q_Learning/Q_Learning.py --seeds 0-3 -- --episodes 2"


@pytest.mark.smoke
def test_python_runs_each_seed_with_that_interpreter(sweep):
    """--python: a peer's seeds run in the peer's own venv, while the sweep itself (and its summary, seed_summary)
    runs here. The sweep fixture's wrapper interpreter stands in for it."""
    *_, calls = sweep
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all("Q_Learning.py" in line for line in lines)
    assert [line.split("--seed ")[1].split()[0] for line in lines] == ["0", "1"]


@pytest.mark.smoke
def test_unwritable_sweep_folder_is_refused_before_any_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = run_tool("1_Q_Learning/Q_Learning.py", "--seeds", "0-1", "--out", str(blocker / "x"))
    assert r.returncode != 0 and r.stderr.startswith("error: cannot write into") and "seed=" not in r.stdout


@pytest.mark.unit
def test_long_flag_lists_get_their_own_folders():
    """Two flag lists that differ only after 80 characters get different folders (a plain cut at 80 made the
    second sweep overwrite the first's runs); short ones keep their readable name."""
    base = ["--task", "number", "--objective", "grpo", "--group-size", "8", "--inner-steps", "2", "--beta", "0"]
    base += ["--kl", "k3", "--learning-rate"]
    a = seeds.default_tag([*base, "1e-3", "--loss-agg", "token-mean"], "0-1")
    b = seeds.default_tag([*base, "1e-3", "--loss-agg", "dr-grpo"], "0-1")
    assert a != b and len(a) < 100 and a.endswith("_seeds-0-1")
    assert seeds.default_tag(["--episodes", "3"], "0-2") == "episodes_3_seeds-0-2"
