"""Measure the "change this line" answers of 4_GRPO_MNIST's exercises: make the change on a copy, run the tests.

    python tools/grpo_answers.py no-min    # exercise 2: clipped_surrogate without the min, the clipped term alone

The change is made on a copy of the repository in a temporary folder, never in the repository itself. The tool
prints the change as a diff, then, for each test named for it, whether that test fails on the copy (it must).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course import changed_source as course_changed_source  # noqa: E402
from course import pytest_on_a_changed_copy  # noqa: E402

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"

# (source piece, its replacement): each piece occurs exactly once in the script (tests/test_grpo.py).
CHANGES = {
    "no-min": (
        "objective = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)",
        "objective = jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv",
    ),
}
# The tests of tests/test_grpo.py meant to catch each change.
CATCHING_TESTS = {
    "no-min": (
        "test_clipped_surrogate_per_token_objective_binds_outside_and_gradient",
        "test_the_tunix_table_holds_for_the_script_as_it_is",
    ),
}


def changed_source(change: str) -> str:
    return course_changed_source(SCRIPT, change, *CHANGES[change])


def verdicts(change: str) -> list[str]:
    """Run each test named for `change` on a copy of the repository with the change made: 'fails' or 'PASSES'."""
    parts, source = ("4_GRPO_MNIST", "tests", "tools", "benchmarks"), changed_source(change)
    return [
        f"tests/test_grpo.py::{test} on a copy with this change: "
        + pytest_on_a_changed_copy(SCRIPT, source, parts, [f"tests/test_grpo.py::{test}"])
        for test in CATCHING_TESTS[change]
    ]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("change", choices=sorted(CHANGES), help="the change to make and test")
    change = p.parse_args(argv).change
    piece, replacement = CHANGES[change]
    print(f"change in {SCRIPT}:\n-    {piece}\n+    {replacement}")
    for line in verdicts(change):
        print(line)


if __name__ == "__main__":
    main()
