"""Module 4's run keys stay independent whatever JAX's `jax_threefry_partitionable` setting.

`run_keys(seed)` splits `key(seed)` into the keys of the initial weights, training, validation and the test, and the
weights come from `nnx.Rngs(keys.init)`, which draws `fold_in(init, n)`. With the setting on (the default in jax
0.12), `split(k, 4)[i]` is the very key `fold_in(k, i)`; with it off, the two differ. Neither function's
documentation promises either, so the keys must not depend on it: under both settings every run key differs from
the others and from every key the initializers draw.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import load_script
from flax import nnx

pytestmark = pytest.mark.unit

g = load_script("4_GRPO_MNIST/grpo_mnist.py")


def key_data(key: jax.Array) -> tuple[int, ...]:
    return tuple(np.asarray(jax.random.key_data(key)).ravel().tolist())


def collisions(seed: int) -> list[str]:
    """What repeats among run_keys(seed), the first training blocks' keys and the initializers' keys."""
    keys = g.run_keys(seed)
    rngs = nnx.Rngs(keys.init)
    g.Policy(4, 8, 16, rngs=rngs)
    drawn = int(rngs.default.count[...])
    again = nnx.Rngs(keys.init)
    init_keys = {key_data(again()) for _ in range(2 * drawn)}  # all the Policy's draws, and as many again
    named = {"init": keys.init, "train": keys.train, "val": keys.val, "test": keys.test}
    block_key = keys.train
    for i in range(4):  # train(): key, block_key = split(key) before every block
        block_key, named[f"block {i}"] = jax.random.split(block_key)
    problems = [f"{a} == {b}" for a in named for b in named if a < b and key_data(named[a]) == key_data(named[b])]
    problems += [
        f"{a} is a key the weights init from" for a, k in named.items() if a != "init" and key_data(k) in init_keys
    ]
    return problems


@pytest.mark.parametrize("partitionable", [True, False], ids=["partitionable", "not-partitionable"])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_run_keys_are_independent_under_both_settings(seed, partitionable):
    """Catches (tried): run_keys taking the init key as key(seed) and the others from split(key(seed)) (the training
    key is then the encoder kernel's under the default setting), or as fold_in(key(seed), i) (the same under
    both settings)."""
    with jax.threefry_partitionable(partitionable):
        assert jax.config.jax_threefry_partitionable is partitionable
        assert collisions(seed) == []


def test_the_setting_decides_whether_split_is_fold_in():
    """The claim the primer states: split(k, 4)[i] == fold_in(k, i) with the setting on, not with it off."""
    k = jax.random.key(0)
    for setting, expected in [(True, True), (False, False)]:
        with jax.threefry_partitionable(setting):
            same = [key_data(jax.random.split(k, 4)[i]) == key_data(jax.random.fold_in(k, i)) for i in range(4)]
        assert same == [expected] * 4
