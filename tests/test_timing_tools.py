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
