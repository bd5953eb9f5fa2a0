"""Break 2_Cart_Pole_DQN/cart_pole_dqn.py on purpose, one mutation at a time: check that the test meant to catch
each mutation fails, and, with --seeds, train the broken script to see what the bug costs.

    python tools/dqn_mutants.py                                         # every mutation; exit 1 if one survives
    python tools/dqn_mutants.py --only target_is_online --seeds 0-4     # that mutation, then 5 training runs

Each mutation replaces one exact piece of the script's source in a copy of the module folder, tests/ and tools/ in a
temporary folder (the repository itself is not touched) and runs the named tests there with pytest; first the same
tests must pass on the unmutated copy. A mutation whose source piece is not found is reported as an error, so the
list cannot silently go stale. With --seeds, the mutated copy is also run as `python cart_pole_dqn.py --seed S`
(default flags) for each seed, one after another, into --out/NAME/seed_S (the run: seed_S/latest/); one line per
seed gives its test score, the loss at the end, the largest loss of the run and its validation returns.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import REPO, load_script, unwritable  # noqa: E402

SCRIPT = "2_Cart_Pole_DQN/cart_pole_dqn.py"
TESTS = "tests/test_dqn.py"

# name -> (what breaks, source piece, its replacement, the tests that must fail)
MUTANTS = {
    "target_is_online": (
        "the online network scores s' too: no target network",
        "next_q_target = target_network(batch.next_obs)",
        "next_q_target = q_network(batch.next_obs)",
        ["test_update_regresses_the_online_network_onto_the_target_networks_td_target"],
    ),
    "truncation_is_failure": (
        "the TD target cuts the bootstrap at the time limit too",
        "done = terminated if args.bootstrap_truncated else jnp.maximum(terminated, truncated)",
        "done = jnp.maximum(terminated, truncated)",
        ["test_td_target_matches_hand_computed_numbers"],
    ),
    "double_dqn_picks_with_the_target": (
        "Double DQN picks a* with the target network",
        "a_star = jnp.argmax(next_q_online, axis=-1)",
        "a_star = jnp.argmax(next_q_target, axis=-1)",
        ["test_td_target_matches_hand_computed_numbers"],
    ),
}


def copy_of_the_module(root: Path) -> None:
    for part in (Path(SCRIPT).parent.name, "tests", "tools"):  # the tests load scripts through tools/course.py
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    shutil.copy(REPO / "pytest.ini", root / "pytest.ini")


def run_tests(root: Path, tests: list[str]) -> str:
    """'caught', 'SURVIVED' or 'error N': the named tests, run on the (mutated) copy at root."""
    select = " or ".join(tests)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "", TESTS, "-k", select],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return "caught" if proc.returncode == 1 else "SURVIVED" if proc.returncode == 0 else f"error {proc.returncode}"


def train_seeds(root: Path, seeds: list[int], out: Path) -> list[dict]:
    """The mutated script at its defaults, one process per seed; each run's metrics.json."""
    runs = []
    for seed in seeds:
        folder = out / f"seed_{seed}"
        cmd = [sys.executable, str(root / SCRIPT), "--seed", str(seed), "--out", str(folder)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: seed {seed} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        m = json.loads((folder / "latest" / "metrics.json").read_text())
        losses = [row["loss"] for row in m["curve"] if row["loss"] == row["loss"]]  # NaN before the first update
        print(
            f"seed={seed} eval_return_mean={m['eval_return_mean']:.1f} last_eval_return_mean="
            f"{m['last_eval_return_mean']:.1f} best_step={m['best_step']} loss at the end={losses[-1]:.4g} "
            f"largest loss={max(losses):.4g} validation returns: "
            + " ".join(f"{row['eval_return']:.0f}" for row in m["curve"]),
            flush=True,
        )
        runs.append(m)
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=sorted(MUTANTS), default=None, help="one mutation (default: every one)")
    p.add_argument("--seeds", default="", help="with --only: also train the mutant over these seeds, e.g. 0-4")
    p.add_argument("--out", default="runs/dqn_mutants", help="folder of the training runs (under the repository)")
    args = p.parse_args(argv)
    if args.seeds and not args.only:
        p.error("--seeds needs --only NAME")
    out = REPO / args.out / (args.only or "")
    if args.seeds and (why := unwritable(str(out))):
        p.error(f"cannot write into {out}: {why}")
    seeds = load_script("tools/seeds.py").parse_seeds(args.seeds) if args.seeds else []

    original = (REPO / SCRIPT).read_text()
    names = [args.only] if args.only else list(MUTANTS)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        copy_of_the_module(root)
        every_test = sorted({test for name in names for test in MUTANTS[name][3]})
        if run_tests(root, every_test) != "SURVIVED":  # the tests must pass before any mutation
            raise SystemExit(f"error: {', '.join(every_test)} fail on the unmutated script; fix that first")
        for name in names:
            what, piece, replacement, tests = MUTANTS[name]
            if original.count(piece) != 1:
                verdict = "not found"
            else:
                (root / SCRIPT).write_text(original.replace(piece, replacement))
                verdict = run_tests(root, tests)
            bad += verdict != "caught"
            print(f"{verdict:9s} {name}: {what}  ({', '.join(tests)})", flush=True)
            if seeds and verdict != "not found":
                runs = train_seeds(root, seeds, out)
                solved = sum(m["eval_return_mean"] >= 475.0 for m in runs)
                print(f"{name} over {len(seeds)} seeds: solved(>=475)={solved}/{len(runs)}")
            (root / SCRIPT).write_text(original)
    if not args.only:
        print(f"{len(names) - bad} of {len(names)} mutations caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
