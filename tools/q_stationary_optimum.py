"""Is `best_stationary_policy` really the best a Q-table can do? Check it against every policy a table can hold.

A greedy Q-table holds a deterministic stationary policy: one action per square, whatever the step. On a 4x4
FrozenLake map the holes and the goal end the episode, so only the other squares have an action that matters:

    n free squares, 4 actions  ->  4^n policies   (slippery 4x4 map: 11 free squares, 4^11 = 4,194,304)

This tool evaluates every one of them exactly: the probability of reaching the goal from the start within
--max-steps steps, by backward induction on the known model (the recursion of `horizon_values` in
1_Q_Learning/Q_Learning.py, G_k(s) = P(goal | s, π(s)) + Σ_s' P(s' | s, π(s)) · G_{k−1}(s')), vectorised over
batches of policies:

    G (B, n)  <-  P(goal | s, π(s)) (B, n)  +  P_π (B, n, n) · G (B, n)      for B policies at once

and compares the best with the policy the script's local search finds (`solve_reference`, which every run prints as
`optimal_success`). It prints the best success, how many policies reach it (an action in a square the policy never
visits does not matter, so the best is shared), the next best values, and whether the local search's policy is
among the best.

    python tools/q_stationary_optimum.py                 # slippery 4x4 FrozenLake, 100 steps: minutes
    python tools/q_stationary_optimum.py --max-steps 30  # a shorter limit, where the local search has to work

The course script is imported by its path; the script itself imports nothing from here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import load_script  # noqa: E402

SCRIPT = "1_Q_Learning/Q_Learning.py"
TIE = 1e-12  # successes closer than this are the same number (float64 round-off of a 100-step recursion)


def free_states(model) -> np.ndarray:
    """The squares where the action matters: some action leads somewhere (holes and the goal lead nowhere)."""
    return np.flatnonzero((model.p_cont.sum(axis=2) + model.p_goal).sum(axis=1) > 0)


def policy_actions(indices: np.ndarray, n: int) -> np.ndarray:
    """Policy number k -> its actions on the n free squares: the base-4 digits of k, first square first. (B, n)."""
    return (indices[:, None] // 4 ** np.arange(n)[None, :]) % 4


def stationary_successes(model, horizon: int, batch: int = 1 << 16) -> np.ndarray:
    """P(reach the goal from the start within `horizon` steps) of every deterministic stationary policy, indexed as
    policy_actions numbers them: an array of 4^n floats. Each batch of B policies gets its own transition matrix
    P_π (B, n, n) and goal probability (B, n) once, then `horizon` steps of G ← P(goal | s, π(s)) + P_π · G."""
    free = free_states(model)
    n, n_a = len(free), model.p_cont.shape[1]
    assert n_a == 4 and model.start in free
    p_cont = model.p_cont[free][:, :, free]  # (n, A, n): the continuing moves, all among free squares
    assert np.allclose(p_cont.sum(axis=2), model.p_cont[free].sum(axis=2)), "a non-terminal move leaves the free set"
    p_goal = model.p_goal[free]  # (n, A)
    start = int(np.flatnonzero(free == model.start)[0])
    squares = np.arange(n)[None, :]
    total = n_a**n
    out = np.empty(total)
    for first in range(0, total, batch):
        actions = policy_actions(np.arange(first, min(first + batch, total)), n)  # (B, n)
        p_pi, goal_pi = p_cont[squares, actions], p_goal[squares, actions]  # (B, n, n), (B, n)
        g = np.zeros(actions.shape)
        for _ in range(horizon):
            g = goal_pi + np.einsum("bij,bj->bi", p_pi, g)
        out[first : first + len(actions)] = g[:, start]
    return out


def policy_number(policy: np.ndarray, free: np.ndarray) -> int:
    """The index of a full policy (one action per square of the map) among the 4^n that stationary_successes scores."""
    return int(sum(int(policy[s]) * 4**i for i, s in enumerate(free)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-steps", type=int, default=100, help="the episode step limit (the script's --max-steps)")
    p.add_argument("--batch", type=int, default=1 << 16, help="policies evaluated at once")
    p.add_argument(
        "--top", type=int, default=3, help="how many distinct best success values, and best policies, to list"
    )
    args = p.parse_args(argv)
    if args.max_steps < 1 or args.batch < 1 or args.top < 1:
        sys.exit("error: --max-steps, --batch and --top must be >= 1")

    ql = load_script(SCRIPT)
    run = ql.Args(env="frozenlake", slippery=True, max_steps=args.max_steps)
    model = ql.env_model(ql.make_env(run))
    reference = ql.solve_reference(model, run)
    free = free_states(model)
    print(
        f"slippery FrozenLake 4x4, {args.max_steps} steps: {len(free)} free squares {free.tolist()}, "
        f"{4 ** len(free):,} deterministic stationary policies",
        flush=True,
    )

    t0 = time.perf_counter()
    success = stationary_successes(model, args.max_steps, args.batch)
    seconds = time.perf_counter() - t0
    best = float(success.max())
    n_best = int((success >= best - TIE).sum())
    values, counts = [], []
    for v in np.sort(success)[::-1]:  # distinct values, best first
        if not values or values[-1] - v > TIE:
            if len(values) == args.top:
                break
            values.append(float(v))
            counts.append(0)
        counts[-1] += 1
    found = float(success[policy_number(reference.optimal_policy, free)])
    print(f"evaluated in {seconds:.0f} s (a busy machine takes longer: the header records the load)")
    print(f"best success over all of them: {best:.10f}, reached by {n_best:,} policies")
    for rank, (v, c) in enumerate(zip(values, counts), 1):
        print(f"  #{rank} success={v:.10f} policies={c:,}")
    tiles = ql.make_env(run).unwrapped.desc.astype(str).flatten()  # the map row by row: 'H' hole, 'G' goal
    for k in np.flatnonzero(success >= best - TIE)[: args.top]:
        policy = np.zeros(len(tiles), dtype=int)
        policy[free] = policy_actions(np.array([k]), len(free))[0]
        rows = [
            "".join(t if t in "HG" else ql.ARROWS[a] for t, a in zip(tiles[r : r + 4], policy[r : r + 4]))
            for r in range(0, 16, 4)
        ]
        print(f"  a best policy, row by row: {' '.join(rows)}")
    print(
        f"local search (best_stationary_policy): success={found:.10f}, "
        f"the script's optimal_success={reference.optimal_success:.10f}"
    )
    print(f"time-dependent optimum (a policy that reads the clock): {reference.time_dependent_success:.10f}")
    same = abs(found - best) <= TIE
    print(f"local_search_is_the_best_stationary_policy={same} gap={best - found:.3g}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
