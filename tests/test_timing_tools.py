"""tools/time_tests.py's whole-process timing, which tools/dqn_jax_time.py and tools/grpo_time.py share."""

from __future__ import annotations

import os

from conftest import load_script

time_tests = load_script("tools/time_tests.py")
SCRIPT = "1_Q_Learning/Q_Learning.py"


def test_whole_processes_runs_each_command_cold_then_warm_and_reads_the_scripts_metrics():
    """One cold and `rounds` warm runs of every command; a run of the script comes back with its own metrics.json,
    a `python -c` command with None. Catches: a round dropped or run twice, the cold run counted as warm, metrics
    read from the wrong command (or from none)."""
    commands = {"script": [SCRIPT, "--episodes", "3"], "imports": ["-c", "import json"]}
    runs = time_tests.whole_processes(commands, 2, SCRIPT)
    assert set(runs) == set(commands)
    for name, (cold, warm) in runs.items():
        assert len(cold) == 1 and len(warm) == 2, name
        for seconds, metrics in cold + warm:
            assert seconds > 0
            assert (metrics is None) == (name == "imports"), name
    assert all(metrics["episodes"] == 3 for _, metrics in runs["script"][0] + runs["script"][1])


def test_the_default_tier_compiles_without_backend_optimizations(request):
    """`pytest` (unit and smoke) compiles with XLA's CPU backend optimizations off (conftest.py); a run that selects
    the learning or integration tier compiles as the scripts do. Catches the setting lost, or leaking into the tiers
    that check learning."""
    markexpr = request.config.option.markexpr
    default_tier = "not learning" in markexpr and "not integration" in markexpr
    assert ("--xla_backend_optimization_level=0" in os.environ.get("XLA_FLAGS", "")) == default_tier


def test_the_heaviest_test_files_are_handed_out_first():
    """conftest.py collects the heaviest files first, each file's tests in their own order, and pytest.ini keeps
    pytest-xdist from reordering the files by their number of tests. Catches: the order lost (an unstable sort, a
    file's tests shuffled) or xdist's reordering back on, which leaves one worker running test_interrupt.py alone."""
    import conftest

    class Item:
        def __init__(self, name: str, i: int):
            self.path, self.i = conftest.REPO / "tests" / name, i

    names = ["test_cli.py", "test_interrupt.py", "test_docs.py", "test_interrupt.py", "test_grpo.py", "test_cli.py"]
    items = [Item(name, i) for i, name in enumerate(names)]
    conftest.pytest_collection_modifyitems(items)
    assert [(item.path.name, item.i) for item in items] == [
        ("test_grpo.py", 4),
        ("test_interrupt.py", 1),
        ("test_interrupt.py", 3),
        ("test_cli.py", 0),
        ("test_docs.py", 2),
        ("test_cli.py", 5),
    ]
    addopts = (conftest.REPO / "pytest.ini").read_text().split("addopts =")[1].split("\n")[0]
    assert "--dist loadfile" in addopts and "--no-loadscope-reorder" in addopts
