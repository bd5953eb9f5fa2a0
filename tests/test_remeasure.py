"""tools/remeasure.py: it reads back the command every results file records, and runs it through the right tool."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import REPO, load_script

remeasure = load_script("tools/remeasure.py")
results = load_script("tools/results.py")


def write_results(folder):
    summary = {"n": 2, "median_seconds": 1.5, "provenance": results.provenance("python tools/seeds.py x --save a")}
    summary["provenance"]["versions"]["jax"] = "0.0.1"
    (folder / "a.json").write_text(json.dumps(summary))
    (folder / "a.test_greedy.json").write_text(json.dumps(summary))  # --also: the same sweep, one entry
    header = {**results.provenance("python 1_Q_Learning/Q_Learning.py --gamma 0"), "seconds": 0.7}
    (folder / "b.txt").write_text("# " + json.dumps(header) + "\n\nout\n")


@pytest.mark.unit
def test_recorded_reads_both_kinds_once_each(tmp_path):
    write_results(tmp_path)
    found = remeasure.recorded(tmp_path)
    assert sorted(found) == ["a", "b"]
    assert found["a"]["kind"] == "seeds" and found["a"]["command"] == "python tools/seeds.py x --save a"
    assert found["a"]["seconds"] == 3.0 and found["a"]["jax"] == "0.0.1"
    assert found["b"]["kind"] == "capture" and found["b"]["seconds"] == 0.7


@pytest.mark.unit
def test_a_capture_runs_again_through_capture_py(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(remeasure, "run", lambda argv: calls.append(argv) or 0.0)
    remeasure.remeasure("b", {"kind": "capture", "command": "python 1_Q_Learning/Q_Learning.py --gamma 0"})
    remeasure.remeasure("a", {"kind": "seeds", "command": "python tools/seeds.py x --save a"})
    assert calls[0] == [sys.executable, "tools/capture.py", "b", "--", sys.executable, "1_Q_Learning/Q_Learning.py"] + [
        "--gamma",
        "0",
    ]
    assert calls[1] == [sys.executable, "tools/seeds.py", "x", "--save", "a"]
    calls.clear()
    remeasure.remeasure("v", {"kind": "capture", "command": "python tools/grpo_val_sweep.py --task digit --reuse"})
    assert calls == [[sys.executable, "tools/grpo_val_sweep.py", "--task", "digit", "--reuse"]]  # writes its own file
    calls.clear()
    remeasure.remeasure("ppo_value_map", {"kind": "capture", "command": "python tools/ppo_value_map.py runs/pendulum"})
    assert calls[0] == [sys.executable, "3_Pendulum/pendulum.py"]  # its prerequisite run comes first


@pytest.mark.unit
def test_every_results_file_names_a_command_that_exists():
    for name, entry in remeasure.recorded().items():
        argv = remeasure.argv_of(entry["command"])
        assert argv[0] == sys.executable and (REPO / argv[1]).is_file(), name


@pytest.mark.unit
def test_an_unknown_name_is_one_error():
    with pytest.raises(remeasure.RemeasureError, match="no results file named nope"):
        remeasure.main(["nope"])


capture = load_script("tools/capture.py")
figures = load_script("tools/figures.py")
DRAW = (
    "import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot as plt; "
    "fig, ax = plt.subplots(figsize=(1, 1)); ax.plot([0, float(sys.argv[2])]); fig.savefig(sys.argv[1]); "
    "print('drew', sys.argv[2])"
)


@pytest.mark.unit
def test_a_capture_stamps_the_figures_its_command_drew(tmp_path, monkeypatch):
    """Catches: a figure copied without its stamp, a stamp that names another file or an older digest, a header
    that forgets the figures (remeasure could not draw them again), and an old image stamped as new."""
    drawn, shown = tmp_path / "curve.png", tmp_path / "assets" / "curve.png"
    shown.parent.mkdir()
    command = [sys.executable, "-c", DRAW, str(drawn), "2"]
    path = capture.capture("run", command, tmp_path, [(str(drawn), str(shown))])
    assert figures.read_stamp(shown) == {"results": "run.txt", "sha256": figures.digest(path)}
    assert figures.check(shown, tmp_path) is None and figures.read_stamp(drawn) is None
    header = json.loads(path.read_text().split("\n", 1)[0].removeprefix("# "))
    assert header["figures"] == [f"{drawn}={shown}"]
    assert remeasure.recorded(tmp_path)["run"]["figures"] == [f"{drawn}={shown}"]
    calls = []
    monkeypatch.setattr(remeasure, "run", lambda argv: calls.append(argv) or 0.0)
    remeasure.remeasure("run", remeasure.recorded(tmp_path)["run"])
    assert calls[0][:5] == [sys.executable, "tools/capture.py", "run", "--figure", f"{drawn}={shown}"]
    old = shown.read_bytes()
    with pytest.raises(capture.CaptureError, match="did not draw"):  # the command draws nothing this time
        capture.capture("run", [sys.executable, "-c", "print(1)"], tmp_path, [(str(drawn), str(shown))])
    assert shown.read_bytes() == old and figures.check(shown, tmp_path) is None  # nothing written


@pytest.mark.unit
def test_a_figure_flag_is_src_equals_dest_or_one_path():
    assert capture.parse_figure("a.png=b/a.png") == ("a.png", "b/a.png")
    assert capture.parse_figure("b/a.png") == ("b/a.png", "b/a.png")
    with pytest.raises(capture.CaptureError):
        capture.parse_figure("a.png=")
