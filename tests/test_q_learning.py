"""Module 1: tabular Q-learning (1_Q_Learning/Q_Learning.py).

unit:     the TD update, the ε schedule, value iteration and finite-horizon evaluation against hand-computed
          numbers; the best stationary policy against the time-dependent optimum; seed 0 on the grid optimal after
          the 20 episodes its README shows; sampled success within 3 standard errors of the exact one; the learning
          curve's lines for the two optima; the enumeration of every policy a table can hold
          (tools/q_stationary_optimum.py) against horizon_values, the local search as its lower bound, and the 4^11
          check's results file against the script's reference; bad settings raise RunError, and main turns it into
          one line.
smoke:    the CLI in a subprocess, on the grid and on FrozenLake, writes metrics.json and the learning curve into a
          run folder of its own, which <out>/latest points at; tools/q_map.py trains a run's table again, refuses a
          run whose metrics it does not reproduce, and draws the map.
learning: the default grid run is optimal on seeds 0–4; slippery FrozenLake reaches the best stationary
          policy's exact success within 100 steps (gap 0, never negative).
integration: the 4^11 check again, in full.
"""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, load_script, run_script

SCRIPT = "1_Q_Learning/Q_Learning.py"
ql = load_script(SCRIPT)
qso = load_script("tools/q_stationary_optimum.py")  # every policy a table can hold, scored exactly
qmap = load_script("tools/q_map.py")  # a run's table, trained again and drawn as a map


# ------------------------------------------------------------------------------------------------
# unit


def three_state_mdp():
    """States 0, 1 and the terminal goal 2. Actions: 0 = forward, 1 = the other choice.

    0 --forward--> 1 (r 0);               0 --cash out--> 2 (r 0.5, terminal)
    1 --forward--> 2 (r 1, terminal) w.p. 0.8, back to 0 (r 0) w.p. 0.2;   1 --back--> 0 (r 0)
    """
    P = {
        0: {0: [(1.0, 1, 0.0, False)], 1: [(1.0, 2, 0.5, True)]},
        1: {0: [(0.8, 2, 1.0, True), (0.2, 0, 0.0, False)], 1: [(1.0, 0, 0.0, False)]},
        2: {0: [(1.0, 2, 0.0, True)], 1: [(1.0, 2, 0.0, True)]},
    }
    env = SimpleNamespace(unwrapped=SimpleNamespace(P=P, desc=np.array(["SFG"], dtype="c")))  # as env_model reads
    return ql.env_model(env)


@pytest.mark.unit
def test_one_q_update_matches_hand_computation():
    q = np.zeros((2, 4))
    q[0, 2] = 3.0
    q[1] = [2.0, 5.0, 1.0, 0.0]
    # y = r + γ·max_a' Q(1, a') = −1 + 0.9·5 = 3.5;  δ = 3.5 − 3 = 0.5;  Q(0, 2) ← 3 + 0.5·0.5 = 3.25
    td_error = ql.q_update(q, s=0, a=2, reward=-1.0, s2=1, terminated=False, alpha=0.5, gamma=0.9)
    assert td_error == pytest.approx(0.5)
    assert q[0, 2] == pytest.approx(3.25)
    assert q[1].tolist() == [2.0, 5.0, 1.0, 0.0] and q[0, [0, 1, 3]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.unit
def test_no_bootstrap_from_a_terminal_state():
    q = np.zeros((2, 4))
    q[0, 1] = 3.0
    q[1] = 50.0  # must be ignored: the episode ended
    # y = r = 100;  δ = 97;  Q ← 3 + 0.5·97 = 51.5
    assert ql.q_update(q, 0, 1, 100.0, 1, True, alpha=0.5, gamma=0.9) == pytest.approx(97.0)
    assert q[0, 1] == pytest.approx(51.5)


@pytest.mark.unit
def test_a_time_limit_cut_still_bootstraps():
    env = ql.GridWorld(max_steps=1)  # every episode is cut after one step
    q = np.full((16, 4), 10.0)
    ret, steps = ql.run_episode(env, q, eps=1.0, alpha=1.0, gamma=0.5, rng=np.random.default_rng(0))
    assert (ret, steps) == (-1.0, 1)
    # truncated, not terminated: Q(0, a) ← −1 + 0.5·10 = 4 (it would be −1 if the cut were treated as terminal)
    changed = q != 10.0
    assert changed.sum() == 1 and changed[0].any()
    assert q[changed][0] == pytest.approx(4.0)


@pytest.mark.unit
def test_epsilon_decays_linearly_then_stays():
    args = ql.Args(episodes=100, eps_start=1.0, eps_end=0.05, eps_decay=0.5)
    assert ql.epsilon_at(0, args) == pytest.approx(1.0)
    assert ql.epsilon_at(25, args) == pytest.approx(0.525)
    assert ql.epsilon_at(50, args) == pytest.approx(0.05)
    assert ql.epsilon_at(99, args) == pytest.approx(0.05)


@pytest.mark.unit
def test_episodes_default_per_environment():
    assert ql.n_episodes(ql.Args()) == 100
    assert ql.n_episodes(ql.Args(env="frozenlake", slippery=True)) == 10_000
    assert ql.n_episodes(ql.Args(env="frozenlake", episodes=7)) == 7
    # the ε and α schedules run over the effective number of episodes
    assert ql.epsilon_at(5_000, ql.Args(env="frozenlake", eps_decay=0.5)) == pytest.approx(0.05)
    assert ql.alpha_at(5_000, ql.Args(env="frozenlake", alpha=0.1, alpha_end=0.0)) == pytest.approx(0.05)


@pytest.mark.unit
def test_alpha_decays_linearly_to_alpha_end():
    args = ql.Args(episodes=100, alpha=0.1, alpha_end=0.0)
    assert [ql.alpha_at(e, args) for e in (0, 50, 99)] == pytest.approx([0.1, 0.05, 0.001])
    assert ql.alpha_at(99, ql.Args(episodes=100, alpha=0.1, alpha_end=0.1)) == 0.1  # constant rate


@pytest.mark.unit
def test_value_iteration_on_a_three_state_mdp():
    model = three_state_mdp()
    # γ = 0.9, walking on is best: V1 = 0.8 + 0.2·γ·V0 and V0 = γ·V1  =>  V1 = 0.8 / (1 − 0.2·0.81)
    v, q = ql.value_iteration(model, gamma=0.9)
    v1 = 0.8 / (1 - 0.2 * 0.81)
    assert v == pytest.approx([0.9 * v1, v1, 0.0], abs=1e-8)
    assert q[0] == pytest.approx([0.9 * v1, 0.5], abs=1e-8)
    assert q[1] == pytest.approx([v1, 0.81 * v1], abs=1e-8)
    # γ = 0.4: the sure 0.5 now beats walking on (V0 = 0.5, V1 = 0.8 + 0.2·0.4·0.5 = 0.84)
    v, q = ql.value_iteration(model, gamma=0.4)
    assert v == pytest.approx([0.5, 0.84, 0.0], abs=1e-8)
    assert ql.greedy_policy(q)[:2].tolist() == [1, 0]


@pytest.mark.unit
def test_policy_value_and_optimality_check():
    model = three_state_mdp()
    v_star, _ = ql.value_iteration(model, gamma=0.9)
    cash_out = np.array([1, 0, 0])
    assert ql.policy_value(model, cash_out, 0.9)[0] == pytest.approx(0.5)
    optimal, gap = ql.is_optimal(model, cash_out, v_star, 0.9)
    assert not optimal and gap == pytest.approx(v_star[0] - 0.5)
    optimal, gap = ql.is_optimal(model, np.array([0, 0, 0]), v_star, 0.9)
    assert optimal and abs(gap) < 1e-9
    # γ = 1: a policy that walks back and forth forever earns 0, not V* — the check must catch it
    v1_star, _ = ql.value_iteration(model, gamma=1.0)
    assert v1_star[0] == pytest.approx(1.0, abs=1e-6)
    assert not ql.is_optimal(model, np.array([0, 1, 0]), v1_star, 1.0)[0]


@pytest.mark.unit
def test_grid_model_and_horizon_optimum():
    model = ql.env_model(ql.GridWorld(max_steps=100))
    expected = np.ones((16, 4))
    expected[11, 1] = expected[14, 2] = 0.0  # down from 11 and right from 14 enter the goal: terminal
    expected[15] = 0.0  # the goal itself: the episode is over
    assert model.p_cont.sum(axis=2).tolist() == expected.tolist()
    assert model.reward[14, 2] == 100.0 and model.reward[0, 0] == -1.0
    # the shortest path is 6 steps: 5·(−1) + 100 = 95; within 5 steps the goal is out of reach (−5, success 0)
    ret, success = ql.horizon_values(model, 6)
    assert (ret[0], success[0]) == (95.0, 1.0)
    ret, success = ql.horizon_values(model, 5)
    assert (ret[0], success[0]) == (-5.0, 0.0)
    # a policy that only goes right hits the wall and never arrives: 100 steps of −1
    ret, success = ql.horizon_values(model, 100, policy=np.full(16, 2))
    assert (ret[0], success[0]) == (-100.0, 0.0)


@pytest.mark.unit
def test_frozenlake_horizon_optimum():
    env = ql.make_env(ql.Args(env="frozenlake", slippery=True))
    model = ql.env_model(env)
    _, success = ql.horizon_values(model, 100)
    # the best success rate within 100 steps, from gymnasium's own model; the infinite-horizon optimum is 14/17
    assert 0.74 < success[0] < 0.75
    v_star, _ = ql.value_iteration(model, gamma=1.0)
    assert v_star[0] == pytest.approx(14 / 17, abs=1e-6)


def episodes_to_optimal(evals) -> int | None:
    """collect_metrics' episodes_to_optimal for these evaluations (the rest of its metrics do not matter here)."""
    reference = ql.Reference(None, None, None, 0.0, 0.0, 0.0)
    return ql.collect_metrics(ql.Args(), reference, ql.TrainLog([], evals, 0, 0.0), (0.0, 0.0, 1))[
        "episodes_to_optimal"
    ]


@pytest.mark.unit
def test_episodes_to_optimal_is_the_start_of_the_last_optimal_stretch():
    def E(episode, success, optimal):  # an evaluation with the fields collect_metrics reads
        return ql.Evaluation(episode, None, 0.0, success, optimal, 0.0)

    evals = [E(10, 0.0, False), E(20, 1.0, True), E(30, 0.5, False), E(40, 1.0, True), E(50, 1.0, True)]
    assert episodes_to_optimal(evals) == 40  # optimal at 20 too, but it did not stay optimal
    assert episodes_to_optimal(evals[:2]) == 20
    assert episodes_to_optimal(evals[:3]) is None  # the last evaluation is not optimal
    assert episodes_to_optimal([E(5, 1.0, True), E(10, 1.0, True)]) == 5
    assert episodes_to_optimal([E(5, 0.0, False)]) is None


def grid_run(episodes: int, evals: int, seed: int = 0):
    """Train on the grid with the other flags at their defaults; returns (args, env, model, reference, q, log)."""
    args = ql.Args(episodes=episodes, evals=evals, seed=seed)
    env = ql.make_env(args)
    model = ql.env_model(env)
    reference = ql.solve_reference(model, args)
    q, log = ql.train(env, model, reference, args, np.random.default_rng(seed))
    return args, env, model, reference, q, log


@pytest.mark.unit
def test_grid_reference_matches_hand_computation():
    """Catches a wrong discount or a bootstrap through the goal in value iteration, and a reference policy that does
    not reach the goal: V*(start) = −(1 + γ + … + γ⁴) + 100·γ⁵ at γ = 0.99, the stationary optimum returns 95."""
    args, env, model, reference, _, _ = grid_run(episodes=1, evals=1)
    assert reference.v_star[0] == pytest.approx(100 * 0.99**5 - sum(0.99**k for k in range(5)), abs=1e-8)
    assert (reference.optimal_return, reference.optimal_success, reference.time_dependent_success) == (95.0, 1.0, 1.0)


@pytest.mark.unit
def test_seed_0_on_the_grid_is_optimal_after_its_documented_20_episodes(capsys):
    """The README's default run: seed 0 turns optimal at the evaluation after episode 20 and stays optimal with
    exact success 1.0 and return 95 through episode 100. Catches an update with the wrong sign, an ε or α that does
    not decay, and an evaluation that calls every policy optimal (episode 15's greedy policy is not). The terminal
    and time-limit rules have their own tests above: on this grid neither changes seed 0's run."""
    args, env, model, reference, q, log = grid_run(episodes=100, evals=20)
    assert [e.episode for e in log.evals] == list(range(5, 101, 5))
    assert capsys.readouterr().out.count("episode=") == 20  # one progress line per evaluation
    assert episodes_to_optimal(log.evals) == 20
    assert [e.optimal for e in log.evals[2:4]] == [False, True]
    assert all(e.success == 1.0 for e in log.evals[3:])
    final = log.evals[-1]  # the last evaluation scores the final table
    assert final.policy.tolist() == ql.greedy_policy(q).tolist()
    assert final.optimal and final.value_gap == 0.0
    assert (final.exact_return, final.success) == (95.0, 1.0)
    # the model (backward induction) and the real env (one rollout) agree on the deterministic grid
    assert ql.evaluate_final(env, final.policy, args) == (95.0, 1.0, 1)


@pytest.mark.unit
def test_env_steps_count_every_step_of_every_episode():
    """On the grid an episode's return fixes its length: 101 − return steps if it reached the goal, 100 if cut.
    Catches a loop that loses or double-counts steps (for example the last step of an episode). 40 episodes do not
    divide into 3 evaluations: one every 13 episodes, and one more after the last, which scores the final table
    (the summary's exact numbers). Catches a final evaluation of the table 1 episode before the end."""
    _, _, _, _, q, log = grid_run(episodes=40, evals=3)
    assert len(log.returns) == 40 and log.train_seconds > 0
    assert [e.episode for e in log.evals] == [13, 26, 39, 40]
    assert log.evals[-1].policy.tolist() == ql.greedy_policy(q).tolist()
    lengths = [100 if r == -100.0 else 101 - r for r in log.returns]
    assert log.env_steps == sum(lengths)


def slippery_reference():
    args = ql.Args(env="frozenlake", slippery=True)
    env = ql.make_env(args)
    model = ql.env_model(env)
    return args, env, model, ql.solve_reference(model, args)


@pytest.mark.unit
def test_stationary_optimum_is_below_the_time_dependent_one():
    """A Q-table's greedy policy depends on the state alone. Its best success within 100 steps on the slippery map
    (value iteration's γ = 1 policy, about 0.7402) is below the best of a policy that also reads the steps left
    (about 0.7442). Catches a reference that is the time-dependent optimum again (the two would be equal)."""
    _, _, model, reference = slippery_reference()
    gamma_1_policy = ql.greedy_policy(ql.value_iteration(model, gamma=1.0)[1])
    assert reference.optimal_policy.tolist() == gamma_1_policy.tolist()
    assert reference.optimal_success == ql.horizon_values(model, 100, gamma_1_policy)[1][model.start]
    assert 0.7401 < reference.optimal_success < 0.7402 < 0.7441 < reference.time_dependent_success < 0.7443
    # no single-state change of the reference raises its 100-step success (it is a local optimum)
    for s, a in np.ndindex(model.reward.shape):
        trial = reference.optimal_policy.copy()
        trial[s] = a
        assert ql.horizon_values(model, 100, trial)[1][model.start] <= reference.optimal_success + 1e-12


@pytest.mark.unit
def test_best_stationary_policy_improves_on_value_iteration_where_it_can():
    """Catches a best_stationary_policy without its local search or without its γ = 0.99 start. Within 30 slippery
    steps a faster stationary policy beats the γ = 1 one; on the non-slippery lake the γ = 1 policy may bump into a
    wall forever (ties at γ = 1), while the γ = 0.99 start reaches the goal every time."""
    model = ql.env_model(ql.make_env(ql.Args(env="frozenlake", slippery=True)))
    gamma_1_policy = ql.greedy_policy(ql.value_iteration(model, gamma=1.0)[1])
    found = ql.best_stationary_policy(model, 30)
    success = [ql.horizon_values(model, 30, p)[1][model.start] for p in (gamma_1_policy, found)]
    assert success[1] > success[0] + 1e-3
    assert success[1] < ql.horizon_values(model, 30)[1][model.start]  # still below the time-dependent optimum
    model = ql.env_model(ql.make_env(ql.Args(env="frozenlake")))
    assert ql.horizon_values(model, 100, ql.best_stationary_policy(model, 100))[1][model.start] == 1.0


SMALL_LAKE = ["SFFF", "FHFH", "FFFG"]  # 3x4, slippery: 9 squares neither hole nor goal, 4^9 table policies


def small_lake_model():
    import gymnasium as gym

    return ql.env_model(gym.make("FrozenLake-v1", desc=SMALL_LAKE, is_slippery=True))


@pytest.mark.unit
def test_every_stationary_policy_is_scored_like_horizon_values():
    """tools/q_stationary_optimum.py scores all 4^n policies a table can hold, in batches (its own recursion, numbered
    by base-4 digits). Catches a wrong numbering, a wrong batch edge or a different recursion: spot checks against
    the script's horizon_values, one policy at each edge of a batch."""
    model = small_lake_model()
    free = qso.free_states(model)
    assert len(free) == 9
    success = qso.stationary_successes(model, 12, batch=10_000)  # 4^9 = 262,144: the last batch is a short one
    assert success.shape == (4**9,)
    for k in (0, 9_999, 10_000, 4**9 - 1, 12_345, 254_321):
        policy = np.zeros(model.reward.shape[0], dtype=int)
        policy[free] = qso.policy_actions(np.array([k]), len(free))[0]
        assert qso.policy_number(policy, free) == k
        assert success[k] == pytest.approx(ql.horizon_values(model, 12, policy)[1][model.start], abs=1e-14)


@pytest.mark.unit
def test_the_local_search_is_a_lower_bound_that_the_enumeration_checks():
    """best_stationary_policy is a local search: never above the best of all table policies, and on this small lake
    with a 5-step limit it stops short of it (no single change helps), which only the enumeration can see. With 20
    steps it finds the best. Catches an enumeration that misses policies (its best would fall below the search's) and
    a check that cannot fail (the 5-step case must differ)."""
    model = small_lake_model()
    free = qso.free_states(model)
    gaps = {}
    for horizon in (5, 20):
        success = qso.stationary_successes(model, horizon)
        found = success[qso.policy_number(ql.best_stationary_policy(model, horizon), free)]
        gaps[horizon] = success.max() - found
    assert gaps[5] > 1e-3 and abs(gaps[20]) < 1e-12


@pytest.mark.unit
def test_the_slippery_reference_is_the_best_of_all_4_to_the_11_table_policies():
    """The README quotes benchmarks/results/q_stationary_optimum.txt: every policy a table can hold on the slippery
    4x4 map, scored within 100 steps, and the script's reference among the best. Catches a reference that changes
    (a different local search, start or step limit) without the check being run again:
    `python tools/capture.py q_stationary_optimum -- python tools/q_stationary_optimum.py`."""
    text = (REPO / "benchmarks" / "results" / "q_stationary_optimum.txt").read_text(encoding="utf-8")
    assert json.loads(text.split("\n", 1)[0].removeprefix("# "))["command"] == "python tools/q_stationary_optimum.py"
    assert "100 steps: 11 free squares" in text and "4,194,304 deterministic stationary policies" in text
    best = float(re.search(r"best success over all of them: ([0-9.]+)", text)[1])
    _, _, model, reference = slippery_reference()
    assert reference.optimal_success == pytest.approx(best, abs=1e-10)
    tiles = ql.make_env(ql.Args(env="frozenlake", slippery=True)).unwrapped.desc.astype(str).flatten()
    arrows = "".join(t if t in "HG" else ql.ARROWS[a] for t, a in zip(tiles, reference.optimal_policy))
    shown = [row.replace(" ", "") for row in re.findall(r"a best policy, row by row: (.+)", text)]
    assert arrows in shown
    assert "local_search_is_the_best_stationary_policy=True gap=0" in text


@pytest.mark.integration
def test_no_table_policy_beats_the_slippery_reference():
    """The check itself, run again: all 4^11 policies within 100 steps (minutes; see its results file)."""
    _, _, model, reference = slippery_reference()
    success = qso.stationary_successes(model, 100)
    assert success.max() == pytest.approx(reference.optimal_success, abs=1e-12)


def slippery_final(eval_episodes: int):
    """The reference policy itself as a learned table: its exact evaluation, and evaluate_final's seeded rollouts."""
    args, env, model, reference = slippery_reference()
    args.eval_episodes = eval_episodes
    env.reset(seed=0)
    q = np.eye(4)[reference.optimal_policy]  # greedy_policy(q) is the reference policy
    final = ql.evaluate_greedy(model, q, reference, 0, args)
    return args, reference, final, ql.evaluate_final(env, final.policy, args)


@pytest.mark.unit
def test_sampled_success_lies_within_3_standard_errors_of_the_exact_one():
    """Rollouts in gymnasium's env and backward induction on its model measure the same probability. Catches a
    rollout that counts a hole as a success or ignores the step limit, and a model built from the wrong transitions."""
    _, _, final, (rollout_return, rollout_success, rollouts) = slippery_final(eval_episodes=1000)
    p = final.success
    standard_error = (p * (1 - p) / rollouts) ** 0.5
    assert rollouts == 1000
    assert abs(rollout_success - p) <= 3 * standard_error
    assert rollout_return == rollout_success  # reward 1 at the goal, 0 otherwise


@pytest.mark.unit
def test_success_gap_uses_the_exact_success_and_is_never_negative():
    """The gap is the best stationary success minus the learned policy's exact success: 0 here, although these
    rollouts (seed 0) happen to succeed more often than the exact probability. Catches a gap taken from the sampled
    success (negative here) or from the time-dependent optimum (0.004 here)."""
    args, reference, final, rollouts = slippery_final(eval_episodes=2000)
    assert rollouts[1] > final.success  # the sampled value overshoots on this seed
    metrics = ql.collect_metrics(args, reference, ql.TrainLog([], [final], 0, 0.0), rollouts)
    assert metrics["success_gap"] == 0.0 and metrics["greedy_success_rate"] == rollouts[1]
    assert metrics["optimal_success_rate"] < metrics["time_dependent_success_rate"]


@pytest.mark.unit
def test_learning_curve_marks_both_optima_where_they_differ(tmp_path, monkeypatch):
    """On the slippery map the success panel draws the best stationary policy's success (about 0.7402) and, above it,
    the best of a policy that reads the clock (about 0.7442), each named with its value in the legend; on the grid,
    where they are equal, only the first. Mutations caught: no line for the clock-reading optimum, a line at the wrong
    height or with another value in its label, and a second line where the two optima are one."""
    from matplotlib.figure import Figure

    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k))[1])
    args, _, _, reference = slippery_reference()
    policy = reference.optimal_policy
    evals = [ql.Evaluation(500, policy, 0.3, 0.3, False, 0.1), ql.Evaluation(1000, policy, 0.74, 0.74, True, 0.0)]
    log = ql.TrainLog([0.0, 1.0] * 500, evals, 1000, 0.0)
    grid = reference._replace(time_dependent_success=reference.optimal_success)
    for name, ref in (("slippery.png", reference), ("grid.png", grid)):
        ql.plot_curve(str(tmp_path / name), log, ref, args)
        assert (tmp_path / name).stat().st_size > 10_000
    optima = []
    for fig in drawn:
        _, success = fig.axes
        lines = [(float(line.get_ydata()[0]), line.get_label()) for line in success.get_lines()[1:]]  # after the curve
        assert all(label.endswith(f"{y:.4f}") for y, label in lines)
        optima.append([y for y, _ in lines])
    assert optima == [[reference.optimal_success, reference.time_dependent_success], [reference.optimal_success]]


BAD_SETTINGS = [  # (flags that validate must refuse, a word its one-line message must contain; argparse checks --env)
    ({"episodes": -5}, "--episodes"),
    ({"alpha": 0.0}, "--alpha"),
    ({"alpha": 1.5}, "--alpha"),
    ({"gamma": -0.1}, "--gamma"),
    ({"gamma": 1.01}, "--gamma"),
    ({"slippery": True}, "--slippery"),
    ({"evals": 0}, "--evals"),
    ({"seed": -1}, "--seed"),
    ({"max_steps": 0}, "--max-steps"),
    ({"eps_decay": 1.5}, "--eps-decay"),
]


@pytest.mark.unit
@pytest.mark.parametrize("bad, message", BAD_SETTINGS)
def test_validate_raises_run_error(bad, message, tmp_path):
    with pytest.raises(ql.RunError) as exc:
        ql.validate(ql.Args(out=str(tmp_path), **bad))
    text = str(exc.value)
    assert message in text and not text.startswith("error:") and "\n" not in text


@pytest.mark.unit
def test_an_unwritable_output_folder_is_refused_before_any_work(tmp_path, capsys):
    """Run, which main creates right after checking the flags, makes the run's own folder or refuses: one line on
    stderr, exit status 1, no training. Catches a traceback, and a run that trains before it finds out."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as exc:
        ql.main(ql.Args(out=str(blocker / "runs")))
    out, err = capsys.readouterr()
    assert exc.value.code == 1 and out == ""
    assert re.fullmatch(r"error: --out '.*/file/runs' is not a writable folder \(.*\); nothing written\n", err), err


@pytest.mark.unit
@pytest.mark.parametrize("bad, message", BAD_SETTINGS)
def test_bad_settings_exit_with_one_line(bad, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ql.main(ql.Args(out=str(tmp_path / "runs"), **bad))
    out, err = capsys.readouterr()
    assert exc.value.code == 1 and out == ""  # refused before any work
    assert err.startswith("error: ") and message in err and err.endswith("; nothing written\n") and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------
# smoke


@pytest.mark.smoke
def test_cli_grid_writes_metrics_and_curve(tmp_path, capsys, recwarn):
    """A run writes metrics.json and its learning curve into a folder of its own, <out>/<date>-<time>-seed<seed>,
    names it in its last line, and points <out>/latest at it. Catches files written straight into --out, a `latest`
    that is missing or points elsewhere, and an `outputs:` line that names another folder. The command line's code,
    parse_args then main, in this process (the CLI as a subprocess: test_cli.py, test_interrupt.py, test_seeds.py);
    nothing on stderr and no warning that a plain `python` would print (its default filters hide deprecations)."""
    out = tmp_path / "run"
    ql.main(ql.parse_args(["--episodes", "40", "--evals", "4", "--out", str(out)]))
    stdout, stderr = capsys.readouterr()
    assert stderr == "", stderr
    hidden = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)
    shown = [w for w in recwarn if not issubclass(w.category, hidden) or w.filename == str(REPO / SCRIPT)]
    assert not shown, [str(w.message) for w in shown]  # recwarn records all: a deprecation in the script fails too
    assert stdout.count("episode=") == 4 and "summary:" in stdout
    folder = re.fullmatch(r"outputs: (.+) \(metrics.json, learning_curve.png\)", stdout.splitlines()[-1])
    assert re.fullmatch(r"\d{8}-\d{6}-seed0", os.path.basename(folder[1])) and os.path.dirname(folder[1]) == str(out)
    assert sorted(os.listdir(out)) == sorted(["latest", os.path.basename(folder[1])])
    assert os.readlink(out / "latest") == os.path.basename(folder[1])
    out = out / "latest"
    assert sorted(os.listdir(out)) == ["learning_curve.png", "metrics.json"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "greedy_return",
        "optimal_return",
        "greedy_success_rate",
        "optimal_success_rate",
        "policy_is_optimal",
        "episodes_to_optimal",
        "train_seconds",
    ):
        assert key in metrics
    assert metrics["optimal_return"] == 95.0 and metrics["args"]["episodes"] == 40
    assert (out / "learning_curve.png").stat().st_size > 10_000


@pytest.mark.smoke
def test_cli_frozenlake_runs(tmp_path):
    """The command line's flags through parse_args and main, in this process: the slippery map's run and its gap."""
    argv = ["--env", "frozenlake", "--slippery", "--episodes", "50", "--eval-episodes", "200", "--out", str(tmp_path)]
    returned = ql.main(ql.parse_args(argv))
    metrics = json.loads((tmp_path / "latest" / "metrics.json").read_text())
    assert metrics["env"] == "frozenlake-slippery" and metrics["eval_episodes"] == 200
    # 50 episodes learn little; the gap to the best stationary policy is measured from the exact success
    assert 0.7401 < metrics["optimal_success_rate"] < 0.7402 < metrics["time_dependent_success_rate"] < 0.75
    assert metrics["success_gap"] == metrics["optimal_success_rate"] - metrics["greedy_success_rate_exact"] > 0
    assert returned["success_gap"] == metrics["success_gap"]  # main returns what it wrote


@pytest.mark.smoke
def test_q_map_trains_the_run_again_and_draws_it(tmp_path, capsys):
    """tools/q_map.py trains a run's table again from the flags in its metrics.json and draws it next to value
    iteration's; it lists the states whose learned greedy action is not π*'s (seed 0 on the grid, the README's map:
    1, 8 and 9, each as good as π*'s action). A run whose metrics it does not reproduce is refused in one line.
    Catches a table trained with other flags or another seed, and a list that compares other policies."""
    out = tmp_path / "run"
    ql.main(ql.Args(out=str(out)))
    assert qmap.main([str(out), "--out", str(tmp_path / "map")]) == [1, 8, 9]
    printed = capsys.readouterr().out.splitlines()
    assert "trained again: the same metrics (greedy_success_rate_exact=1.0000 value_gap=0" in printed[-6]
    assert printed[-4:] == [
        "  state 1: → (π* ↓)  0.0000",
        "  state 8: → (π* ↓)  0.0000",
        "  state 9: → (π* ↓)  0.0000",
        f"wrote {tmp_path / 'map' / 'q_map.png'}",
    ]
    assert (tmp_path / "map" / "q_map.png").stat().st_size > 10_000
    metrics = out / "latest" / "metrics.json"
    metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "env_steps": 1}))  # not what these flags give
    with pytest.raises(SystemExit) as exc:
        qmap.main([str(out), "--out", str(tmp_path / "map")])
    assert str(exc.value).startswith("error: trained again") and "other metrics (env_steps)" in str(exc.value)


@pytest.mark.smoke
@pytest.mark.parametrize("argv", [["--alpha", "2"], ["--env", "cliff"], ["--episodes", "ten"]])  # bound, choice, type
def test_cli_bad_input_is_one_line(argv, tmp_path):
    """The command line refuses a bad flag in one line on stderr that names it, exit status 1, before any work and
    before any folder (every flag's bounds are checked in process above, through the same main)."""
    proc = run_script(SCRIPT, *argv, "--out", str(tmp_path / "runs"), cwd=tmp_path, timeout=60)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and argv[0] in proc.stderr
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------------
# learning


@pytest.mark.learning
def test_default_grid_is_optimal_on_seeds_0_to_4(tmp_path):
    for seed in range(5):
        m = ql.main(ql.Args(seed=seed, out=str(tmp_path / str(seed))))
        assert m["policy_is_optimal"], seed
        assert m["greedy_return"] == m["optimal_return"] == 95.0
        assert m["greedy_success_rate"] == 1.0
        assert m["episodes_to_optimal"] is not None and m["episodes_to_optimal"] <= m["episodes"] == 100


@pytest.mark.learning
def test_same_seed_same_run(tmp_path):
    a = ql.main(ql.Args(env="frozenlake", slippery=True, episodes=300, eval_episodes=300, out=str(tmp_path / "a")))
    b = ql.main(ql.Args(env="frozenlake", slippery=True, episodes=300, eval_episodes=300, out=str(tmp_path / "b")))
    assert {**a, "train_seconds": 0} == {**b, "train_seconds": 0}


@pytest.mark.learning
def test_slippery_frozenlake_reaches_the_best_stationary_policy(tmp_path):
    """Catches a learner that stops short of what a Q-table can reach (for example a constant α, or too few
    episodes) and a gap measured from the sampled success (negative on this seed: 0.7445 sampled, 0.7402 exact)."""
    m = ql.main(ql.Args(env="frozenlake", slippery=True, out=str(tmp_path)))  # the defaults: 10,000 episodes
    assert m["episodes"] == 10_000 and m["policy_is_optimal"]
    assert m["greedy_success_rate_exact"] == m["optimal_success_rate"] and m["success_gap"] == 0.0
    assert m["optimal_success_rate"] < m["time_dependent_success_rate"]
    standard_error = (m["optimal_success_rate"] * (1 - m["optimal_success_rate"]) / 10_000) ** 0.5
    assert abs(m["greedy_success_rate"] - m["greedy_success_rate_exact"]) <= 3 * standard_error
