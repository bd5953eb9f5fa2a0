"""Break 1_Q_Learning/Q_Learning.py (and tools/q_stationary_optimum.py, which checks its reference, and tools/q_map.py,
which draws a run's table) on purpose, one mutation at a time, and check that the test meant to catch each mutation
fails (a test that cannot fail is a defect).

    python tools/q_mutants.py            # every mutation; exit 1 if a test survives its mutation

Each mutation replaces one exact piece of a file's source in a copy of the repository in a temporary folder
(the repository itself is not touched) and runs the named tests there with pytest. A mutation whose source piece
is not found is reported as an error, so the list cannot silently go stale.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "1_Q_Learning/Q_Learning.py"
TOOL = "tools/q_stationary_optimum.py"
MAP_TOOL = "tools/q_map.py"
TESTS = "tests/test_q_learning.py"

# (what breaks, source piece, its replacement, the tests that must fail)
MUTANTS = [
    (
        "value iteration forgets the discount",
        "q = model.reward + gamma * model.p_cont @ v  # (S, A)",
        "q = model.reward + model.p_cont @ v  # (S, A)",
        ["test_grid_reference_matches_hand_computation"],
    ),
    (
        "the TD target bootstraps through a terminal state",
        "gamma * float(next_q_row.max()) * (1.0 - float(terminated))",
        "gamma * float(next_q_row.max())",
        ["test_no_bootstrap_from_a_terminal_state"],
    ),
    (
        "a time-limit cut is treated as terminal",
        "q_update(q, s, a, r, s2, terminated, alpha, gamma)",
        "q_update(q, s, a, r, s2, terminated or truncated, alpha, gamma)",
        ["test_a_time_limit_cut_still_bootstraps"],
    ),
    (
        "the update moves Q away from the target",
        "q[s, a] += alpha * td_error",
        "q[s, a] -= alpha * td_error",
        ["test_seed_0_on_the_grid_is_optimal_after_its_documented_20_episodes"],
    ),
    (
        "α stays constant (no decay)",
        "return args.alpha + (args.alpha_end - args.alpha) * episode / n_episodes(args)",
        "return args.alpha",
        ["test_seed_0_on_the_grid_is_optimal_after_its_documented_20_episodes"],
    ),
    (
        "every evaluation calls the greedy policy optimal",
        "exact_return, success, *is_optimal(model, policy, reference.v_star, args.gamma))",
        "exact_return, success, True, 0.0)",
        ["test_seed_0_on_the_grid_is_optimal_after_its_documented_20_episodes"],
    ),
    (
        "ε stays at its start value (no decay)",
        "return args.eps_start + frac * (args.eps_end - args.eps_start)",
        "return args.eps_start",
        ["test_seed_0_on_the_grid_is_optimal_after_its_documented_20_episodes"],
    ),
    (
        "the loop does not count an episode's last step",
        "ret, steps = ret + r, steps + 1",
        "ret, steps = ret + r, steps + (not (terminated or truncated))",
        ["test_env_steps_count_every_step_of_every_episode"],
    ),
    (
        "no evaluation after the last episode: the final numbers score an older table",
        "if (episode + 1) % eval_every == 0 or episode + 1 == episodes:",
        "if (episode + 1) % eval_every == 0:",
        ["test_env_steps_count_every_step_of_every_episode"],
    ),
    (
        "the reference is the time-dependent optimum again",
        "optimal_return, optimal_success = (x[model.start] for x in horizon_values(model, args.max_steps, policy))",
        "optimal_return, optimal_success = (x[model.start] for x in horizon_values(model, args.max_steps))",
        ["test_stationary_optimum_is_below_the_time_dependent_one"],
    ),
    (
        "no local search: value iteration's policies as they are",
        "        improved = True\n        while improved:",
        "        improved = False\n        while improved:",
        ["test_best_stationary_policy_improves_on_value_iteration_where_it_can"],
    ),
    (
        "only the γ = 1 start (ties may bump into a wall forever)",
        "for gamma in (1.0, 0.99):",
        "for gamma in (1.0,):",
        ["test_best_stationary_policy_improves_on_value_iteration_where_it_can"],
    ),
    (
        "a rollout counts a hole as a success",
        "wins += bool(terminated and r > 0)",
        "wins += bool(terminated)",
        ["test_sampled_success_lies_within_3_standard_errors_of_the_exact_one"],
    ),
    (
        "the gap is taken from the sampled success",
        '"success_gap": reference.optimal_success - final.success,',
        '"success_gap": reference.optimal_success - rollouts[1],',
        ["test_success_gap_uses_the_exact_success_and_is_never_negative"],
    ),
    (
        "the gap is taken from the time-dependent optimum",
        '"success_gap": reference.optimal_success - final.success,',
        '"success_gap": reference.time_dependent_success - final.success,',
        ["test_success_gap_uses_the_exact_success_and_is_never_negative"],
    ),
    (
        "the reference is searched for a shorter step limit than the run's",
        "policy = best_stationary_policy(model, args.max_steps)",
        "policy = best_stationary_policy(model, 30)",
        ["test_the_slippery_reference_is_the_best_of_all_4_to_the_11_table_policies"],
    ),
    (
        "episodes_to_optimal names the first optimal evaluation, even one the policy did not stay at",
        "if all(later.optimal for later in log.evals[k:])",
        "if e.optimal",
        ["test_episodes_to_optimal_is_the_start_of_the_last_optimal_stretch"],
    ),
    (
        "the learning curve leaves out the optimum of a policy that reads the clock",
        '        ax2.axhline(high, **clock, label=f"best if the policy reads the clock {high:.4f}")',
        "        pass",
        ["test_learning_curve_marks_both_optima_where_they_differ"],
    ),
]

# in the tool that draws a run's table: it must train the table the run trained
MAP_MUTANTS = [
    (
        "the table is trained again with another seed",
        "np.random.default_rng(args.seed))",
        "np.random.default_rng(args.seed + 1))",
        ["test_q_map_trains_the_run_again_and_draws_it"],
    ),
]

# the same, in the tool that scores every policy a table can hold
TOOL_MUTANTS = [
    (
        "the enumeration leaves out a quarter of the policies",
        "total = n_a**n",
        "total = n_a ** (n - 1)",
        ["test_every_stationary_policy_is_scored_like_horizon_values"],
    ),
    (
        "the enumeration scores one step fewer than the limit",
        "        for _ in range(horizon):\n            g = goal_pi",
        "        for _ in range(horizon - 1):\n            g = goal_pi",
        ["test_every_stationary_policy_is_scored_like_horizon_values"],
    ),
    (
        "policies are numbered with the last square first",
        "return (indices[:, None] // 4 ** np.arange(n)[None, :]) % 4",
        "return (indices[:, None] // 4 ** np.arange(n)[::-1][None, :]) % 4",
        ["test_every_stationary_policy_is_scored_like_horizon_values"],
    ),
    (
        "the enumeration keeps only the first batch",
        "out = np.empty(total)",
        "out = np.zeros(total)\n    total = min(total, batch)",
        ["test_the_local_search_is_a_lower_bound_that_the_enumeration_checks"],
    ),
]


def run_mutant(root: Path, path: str, original: str, piece: str, replacement: str, tests: list[str]) -> str:
    """'caught', 'SURVIVED' or 'not found' for one mutation of the file at `path`, tested in the copy at root."""
    if original.count(piece) != 1:
        return "not found"
    (root / path).write_text(original.replace(piece, replacement))
    select = " or ".join(tests)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "", TESTS, "-k", select],
        cwd=root,
        capture_output=True,
        text=True,
    )
    (root / path).write_text(original)
    return "caught" if proc.returncode == 1 else "SURVIVED" if proc.returncode == 0 else f"error {proc.returncode}"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for part in ("1_Q_Learning", "tests", "tools", "benchmarks/results"):
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "assets"))
        shutil.copy(REPO / "pytest.ini", root / "pytest.ini")
        bad, total = 0, 0
        for path, mutants in ((SCRIPT, MUTANTS), (TOOL, TOOL_MUTANTS), (MAP_TOOL, MAP_MUTANTS)):
            original = (REPO / path).read_text()
            for what, piece, replacement, tests in mutants:
                verdict = run_mutant(root, path, original, piece, replacement, tests)
                bad, total = bad + (verdict != "caught"), total + 1
                print(f"{verdict:9s} {what}  ({', '.join(tests)})", flush=True)
    print(f"{total - bad} of {total} mutations caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
