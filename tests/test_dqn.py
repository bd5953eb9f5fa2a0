"""Tests for 2_Cart_Pole_DQN/cart_pole_dqn.py: the math (unit), the CLI (smoke) and a short real run (learning)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import load_script, run_script

SCRIPT = "2_Cart_Pole_DQN/cart_pole_dqn.py"
dqn = load_script(SCRIPT)

# Seeds outside the README's three sweeps (0–19, 20–39, 40–59) for the learning test of the default configuration.
HELD_OUT_SEEDS = [60, 61, 62]

# Tiny settings: a few hundred env steps and a 16-unit network, seconds end to end.
TINY = [
    "--total-timesteps",
    "600",
    "--learning-starts",
    "200",
    "--train-frequency",
    "50",
    "--gradient-steps",
    "4",
    "--target-network-frequency",
    "100",
    "--eval-frequency",
    "300",
    "--periodic-eval-episodes",
    "2",
    "--eval-episodes",
    "3",
    "--hidden-size",
    "16",
    "--batch-size",
    "32",
]


def _agent(hidden_size=16, seed=0, **kw):
    args = dqn.Args(hidden_size=hidden_size, seed=seed, **kw)
    q_network, optimizer = dqn.create_agent(args, obs_dim=4, n_actions=2)
    graphdef, params = dqn.nnx.split(q_network)
    opt_graphdef, opt_state = dqn.nnx.split(optimizer)
    return args, graphdef, params, opt_graphdef, opt_state


def _fixed_batch(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return dqn.Batch(
        obs=rng.normal(size=(n, 4)).astype(np.float32),
        actions=rng.integers(0, 2, n).astype(np.int32),
        rewards=np.ones(n, np.float32),
        next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        terminated=(rng.random(n) < 0.2).astype(np.float32),
        truncated=(rng.random(n) < 0.1).astype(np.float32),
    )


def _stacked(*batches):
    """Minibatches for one train_block call: each field gets a leading axis, one entry per gradient step."""
    return jax.tree.map(lambda *fields: np.stack(fields), *batches)


def _leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


# ----------------------------------------------------------------------------- unit


def _add(buf, values, terminated, truncated):
    """Add one transition per value v (s = v, a = v % 2, r = v, s' = v + 0.5) in a single batched call."""
    v = np.asarray(values, dtype=np.float32)
    buf.add(
        np.repeat(v[:, None], 4, axis=1),
        v.astype(np.int32) % 2,
        v,
        np.repeat(v[:, None] + 0.5, 4, axis=1),
        np.asarray(terminated, np.float32),
        np.asarray(truncated, np.float32),
    )


@pytest.mark.unit
def test_dueling_head_is_value_plus_centred_advantage():
    net = dqn.QNetwork(4, 3, 8, dueling=True, rngs=dqn.nnx.Rngs(0))
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), jnp.float32)
    x = dqn.nnx.relu(net.hidden2(dqn.nnx.relu(net.hidden1(obs))))
    v, adv = net.value(x), net.head(x)  # (5, 1), (5, 3)
    np.testing.assert_allclose(net(obs), v + adv - adv.mean(axis=-1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(net(obs).mean(axis=-1), v[:, 0], rtol=1e-5, atol=1e-6)  # mean_a Q(s, a) = V(s)
    plain = dqn.QNetwork(4, 3, 8, rngs=dqn.nnx.Rngs(0))
    assert plain.value is None and not np.allclose(plain(obs), net(obs))


@pytest.mark.unit
def test_layer_norm_normalises_each_hidden_layer():
    net = dqn.QNetwork(4, 2, 8, layer_norm=True, rngs=dqn.nnx.Rngs(0))
    obs = jnp.asarray(np.random.default_rng(1).normal(size=(6, 4)) * 50, jnp.float32)  # large inputs
    h = net.norm1(net.hidden1(obs))  # scale 1, bias 0 at init: zero mean, unit variance per row
    np.testing.assert_allclose(h.mean(axis=-1), 0, atol=1e-5)
    np.testing.assert_allclose(h.std(axis=-1), 1, atol=1e-2)
    x = dqn.nnx.relu(net.norm2(net.hidden2(dqn.nnx.relu(h))))
    np.testing.assert_allclose(net(obs), net.head(x), rtol=1e-6)


@pytest.mark.unit
def test_evaluation_tells_how_episodes_ended():
    always_right = lambda params, obs: np.ones(len(obs), np.int32)  # noqa: E731  (push right every step)
    returns, ends = dqn.evaluate(always_right, None, n_episodes=8, seed=0)
    # pushing one way tips the pole over within a few dozen steps, long before the cart reaches 2.4
    assert ends == {"time_limit": 0, "cart_left_track": 0, "pole_fell": 8}
    assert (returns < 100).all()

    def lean(offset):  # a PD balance of the pole around θ = −offset: the larger the lean, the faster the drift
        return lambda params, obs: ((obs[:, 2] + 0.5 * obs[:, 3] + offset) > 0).astype(np.int32)

    returns, ends = dqn.evaluate(lean(0.01), None, n_episodes=8, seed=0)  # upright enough: all reach the limit
    assert ends == {"time_limit": 8, "cart_left_track": 0, "pole_fell": 0} and (returns == 500).all()
    returns, ends = dqn.evaluate(lean(0.05), None, n_episodes=8, seed=0)  # the cart slides off the track
    assert ends == {"time_limit": 1, "cart_left_track": 7, "pole_fell": 0}, ends
    assert ((returns == 500) == (np.arange(8) == 0)).all()


@pytest.mark.unit
def test_replay_buffer_wraps_around_and_samples_shapes():
    buf = dqn.ReplayBuffer(capacity=5, obs_dim=4)
    _add(buf, [0, 1, 2], [0, 0, 0], [0, 0, 1])  # one call, three envs
    assert (buf.pos, buf.size) == (3, 3)
    batch = buf.sample(np.random.default_rng(0), batch_size=8, n_batches=6)
    assert isinstance(batch, dqn.Batch) and batch._fields == (
        "obs",
        "actions",
        "rewards",
        "next_obs",
        "terminated",
        "truncated",
    )
    assert batch.obs.shape == (6, 8, 4) and batch.next_obs.shape == (6, 8, 4)
    for field in (batch.actions, batch.rewards, batch.terminated, batch.truncated):
        assert field.shape == (6, 8)
    assert set(np.unique(batch.obs[..., 0])) <= {0.0, 1.0, 2.0}  # only filled rows are drawn

    _add(buf, [3, 4, 5, 6], [0, 0, 0, 1], [0, 0, 0, 0])  # 7 transitions into 5 slots: 5 and 6 overwrite rows 0, 1
    assert (buf.pos, buf.size) == (2, 5)
    np.testing.assert_array_equal(buf.obs[:, 0], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.rewards, [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.next_obs[:, 0], [5.5, 6.5, 2.5, 3.5, 4.5])
    np.testing.assert_array_equal(buf.terminated, [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(buf.truncated, [0, 0, 1, 0, 0])
    _add(buf, [], [], [])  # an iteration where every env was only resetting adds nothing
    assert (buf.pos, buf.size) == (2, 5)
    batch = buf.sample(np.random.default_rng(1), batch_size=200, n_batches=1)
    assert set(np.unique(batch.obs[..., 0])) == {2.0, 3.0, 4.0, 5.0, 6.0}
    # every sampled row stays a consistent transition: reward i goes with s = i and s' = i + 0.5
    np.testing.assert_array_equal(batch.rewards, batch.obs[..., 0])
    np.testing.assert_array_equal(batch.next_obs[..., 0], batch.obs[..., 0] + 0.5)


@pytest.mark.unit
def test_td_target_matches_hand_computed_numbers():
    r = jnp.array([1.0, 1.0, 1.0, 0.5])
    next_q_target = jnp.array([[1.0, 2.0], [3.0, 0.5], [4.0, 5.0], [-1.0, -2.0]])
    next_q_online = jnp.array([[5.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    terminated = jnp.array([0.0, 1.0, 0.0, 0.0])
    truncated = jnp.array([0.0, 0.0, 1.0, 0.0])  # row 2 hit the time limit: it still bootstraps
    y = dqn.td_target(r, next_q_target, next_q_online, terminated, truncated, gamma=0.9)
    # y = r + γ·(1 − terminated)·max_a' Q⁻(s', a')
    np.testing.assert_allclose(y, [1 + 0.9 * 2, 1.0, 1 + 0.9 * 5, 0.5 + 0.9 * -1], rtol=1e-6)
    # the spec's merged flag (done = terminated or truncated) cuts the bootstrap of row 2
    y = dqn.td_target(r, next_q_target, next_q_online, terminated, truncated, gamma=0.9, bootstrap_truncated=False)
    np.testing.assert_allclose(y, [2.8, 1.0, 1.0, 0.5 - 0.9], rtol=1e-6)
    # Double DQN: a* = argmax_a' Q(s', a') = [0, 1, 0, 1], scored by Q⁻: [1, 0.5, 4, -2]
    y = dqn.td_target(r, next_q_target, next_q_online, terminated, truncated, gamma=0.9, double_dqn=True)
    np.testing.assert_allclose(y, [1 + 0.9 * 1, 1.0, 1 + 0.9 * 4, 0.5 + 0.9 * -2], rtol=1e-6)


@pytest.mark.unit
def test_loss_fn_huber_and_mse_match_hand_computed_numbers():
    _, graphdef, params, _, _ = _agent()
    q_network = dqn.nnx.merge(graphdef, params)
    batch = jax.tree.map(jnp.asarray, _fixed_batch(8))
    q = np.asarray(q_network(batch.obs))[np.arange(8), np.asarray(batch.actions)]
    next_max = np.asarray(q_network(batch.next_obs)).max(-1)
    y = np.asarray(batch.rewards) + 0.99 * (1 - np.asarray(batch.terminated)) * next_max
    err = y - q
    mse = dqn.loss_fn(q_network, q_network, batch, dqn.TrainConfig(0.99, loss="mse", double_dqn=False))
    huber = dqn.loss_fn(q_network, q_network, batch, dqn.TrainConfig(0.99, loss="huber", double_dqn=False))
    np.testing.assert_allclose(mse, np.mean(0.5 * err**2), rtol=1e-5)
    h = np.where(np.abs(err) <= 1, 0.5 * err**2, np.abs(err) - 0.5)
    np.testing.assert_allclose(huber, np.mean(h), rtol=1e-5)


@pytest.mark.unit
def test_polyak_sync_averages_and_hard_sync_is_the_online_network():
    args, graphdef, params, opt_graphdef, opt_state = _agent()
    target = params
    _, train = dqn.make_step_fns(args, graphdef, opt_graphdef)
    params, opt_state, _ = train(params, opt_state, target, _stacked(*[_fixed_batch()] * 3))
    assert not _leaves_equal(params, target)  # training moved the online network
    # Polyak: θ⁻ ← τ·θ + (1 − τ)·θ⁻
    soft = dqn.sync_target(params, target, tau=0.25)
    for s, p, t in zip(jax.tree.leaves(soft), jax.tree.leaves(params), jax.tree.leaves(target)):
        np.testing.assert_allclose(s, 0.25 * np.asarray(p) + 0.75 * np.asarray(t), rtol=1e-6, atol=1e-7)
    # the module-level way, nnx.update, gives the same values as the hard copy
    target_network = dqn.nnx.merge(graphdef, target)
    dqn.nnx.update(target_network, dqn.sync_target(params, target, tau=1.0))
    assert _leaves_equal(dqn.nnx.state(target_network), params)


def _perturbed(params, scale=0.5, seed=7):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@pytest.mark.unit
@pytest.mark.parametrize("double", [False, True])
def test_train_block_really_uses_the_target_network(double):
    # A broken train_block that bootstrapped from the online network would ignore target_params entirely.
    args, graphdef, params, opt_graphdef, opt_state = _agent(double_dqn=double)
    _, train = dqn.make_step_fns(args, graphdef, opt_graphdef)
    batches = _stacked(_fixed_batch())
    other_target = _perturbed(params)
    a, _, loss_a = train(params, opt_state, params, batches)
    b, _, loss_b = train(params, opt_state, other_target, batches)
    assert float(loss_a) != pytest.approx(float(loss_b), rel=1e-3)  # other TD targets, other loss
    assert not _leaves_equal(a, b)  # and other gradients, so other updated parameters
    # The TD targets themselves: y = r + γ(1 − terminated)·Q⁻(s', a*) moves with the target network.
    batch = jax.tree.map(jnp.asarray, _fixed_batch())
    config = dqn.TrainConfig(0.99, double_dqn=double)

    def grads(target):
        return jax.grad(
            lambda p: dqn.loss_fn(dqn.nnx.merge(graphdef, p), dqn.nnx.merge(graphdef, target), batch, config)
        )(params)

    assert not _leaves_equal(grads(params), grads(other_target))


@pytest.mark.unit
def test_scan_over_two_batches_equals_two_single_steps():
    # A scan that reused batch 0 for every step would pass a test with one batch stacked many times; not this one.
    args, graphdef, params, opt_graphdef, opt_state = _agent()
    _, train = dqn.make_step_fns(args, graphdef, opt_graphdef)
    b1, b2 = _fixed_batch(seed=1), _fixed_batch(seed=2)
    target = _perturbed(params, scale=0.1)
    both, opt_both, loss_both = train(params, opt_state, target, _stacked(b1, b2))
    p1, o1, l1 = train(params, opt_state, target, _stacked(b1))
    p2, o2, l2 = train(p1, o1, target, _stacked(b2))
    for x, y in zip(jax.tree.leaves(both), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss_both, (l1 + l2) / 2, rtol=1e-5)
    swapped, _, _ = train(params, opt_state, target, _stacked(b2, b1))
    assert not all(
        np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(jax.tree.leaves(swapped), jax.tree.leaves(both))
    )


@pytest.mark.unit
@pytest.mark.parametrize("double", [False, True])
def test_loss_fn_with_two_different_networks(double):
    # Online and target networks differ, so swapping their roles inside loss_fn changes the number.
    _, graphdef, params, _, _ = _agent(seed=0)
    _, _, target_params, _, _ = _agent(seed=1)
    online, target = dqn.nnx.merge(graphdef, params), dqn.nnx.merge(graphdef, target_params)
    batch = jax.tree.map(jnp.asarray, _fixed_batch(8))
    a = np.asarray(batch.actions)
    q = np.asarray(online(batch.obs))[np.arange(8), a]  # Q_θ(s, a)
    next_target = np.asarray(target(batch.next_obs))  # Q⁻(s', ·)
    if double:
        a_star = np.asarray(online(batch.next_obs)).argmax(-1)  # argmax_a' Q_θ(s', a')
        next_v = next_target[np.arange(8), a_star]
    else:
        next_v = next_target.max(-1)
    y = np.asarray(batch.rewards) + 0.99 * (1 - np.asarray(batch.terminated)) * next_v
    expected = np.mean(0.5 * (y - q) ** 2)
    config = dqn.TrainConfig(0.99, loss="mse", double_dqn=double)
    got = dqn.loss_fn(online, target, batch, config)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    swapped = dqn.loss_fn(target, online, batch, config)
    assert not np.isclose(float(swapped), expected, rtol=1e-3)


@pytest.mark.unit
def test_learning_rate_schedule_spans_exactly_the_gradient_steps_made():
    # Default flags: training calls at every multiple of 256 from 1,024 to 49,920, i.e. 195 − 3 = 192 calls.
    args = dqn.Args()
    d = dqn.derived(args)
    assert d["n_train_calls"] == 192 and d["total_gradient_steps"] == 192 * args.gradient_steps
    lr = optax.linear_schedule(args.learning_rate, 0.0, d["total_gradient_steps"])
    assert float(lr(d["total_gradient_steps"] - 1)) > 0  # the last step still learns
    assert dqn.derived(dqn.Args(total_timesteps=1000, learning_starts=100, train_frequency=300))["n_train_calls"] == 3


@pytest.mark.unit
@pytest.mark.parametrize("loss,double", [("huber", False), ("mse", True)])
def test_a_few_updates_on_a_fixed_batch_lower_the_loss(loss, double):
    args, graphdef, params, opt_graphdef, opt_state = _agent(learning_rate=3e-3, loss=loss, double_dqn=double)
    _, train = dqn.make_step_fns(args, graphdef, opt_graphdef)
    batch = _fixed_batch()
    target = params

    def current_loss(p):
        return float(
            dqn.loss_fn(
                dqn.nnx.merge(graphdef, p),
                dqn.nnx.merge(graphdef, target),
                jax.tree.map(jnp.asarray, batch),
                dqn.TrainConfig(args.gamma, loss, double),
            )
        )

    before = current_loss(params)
    params, opt_state, _ = train(params, opt_state, target, _stacked(*[batch] * 20))
    after = current_loss(params)
    assert after < 0.7 * before, (before, after)


@pytest.mark.unit
def test_linear_epsilon_schedule():
    assert dqn.linear_schedule(1.0, 0.04, 100, 0) == 1.0
    assert dqn.linear_schedule(1.0, 0.04, 100, 50) == pytest.approx(0.52)
    assert dqn.linear_schedule(1.0, 0.04, 100, 100) == pytest.approx(0.04)
    assert dqn.linear_schedule(1.0, 0.04, 100, 10_000) == pytest.approx(0.04)


@pytest.mark.unit
def test_checkpoint_round_trip_is_exact(tmp_path):
    _, graphdef, params, _, _ = _agent(seed=3)
    path = tmp_path / "q.npz"
    dqn.save_checkpoint(str(path), {"q_network": dqn.nnx.merge(graphdef, params), "step": np.array(7)})
    _, _, fresh_params, _, _ = _agent(seed=4)
    fresh = dqn.nnx.merge(graphdef, fresh_params)
    assert not _leaves_equal(dqn.nnx.state(fresh), params)
    others = dqn.load_checkpoint(str(path), {"q_network": fresh, "step": np.array(0)})  # fills `fresh` in place
    assert _leaves_equal(dqn.nnx.state(fresh), params) and list(others) == ["step"] and int(others["step"]) == 7
    with np.load(path, allow_pickle=False) as f:  # plain arrays, no pickle
        assert sorted(f.files) == sorted(
            [
                "q_network/hidden1/kernel",
                "q_network/hidden1/bias",
                "q_network/hidden2/kernel",
                "q_network/hidden2/bias",
                "q_network/head/kernel",
                "q_network/head/bias",
                "step",
            ]
        )


@pytest.mark.unit
def test_validate_raises_input_error(tmp_path):
    with pytest.raises(dqn.InputError, match="--tau"):
        dqn.validate(dqn.Args(tau=0.0, out=str(tmp_path)))
    with pytest.raises(dqn.InputError, match="--eps-end"):
        dqn.validate(dqn.Args(eps_start=0.1, eps_end=0.5, out=str(tmp_path)))
    dqn.validate(dqn.Args(out=str(tmp_path)))  # the defaults pass


@pytest.mark.unit
@pytest.mark.parametrize(
    "flags,message",
    [
        (["--total-timesteps", "0"], "--total-timesteps"),
        (["--batch-size", "200", "--buffer-size", "100"], "--batch-size"),
        (["--learning-rate", "-0.001"], "--learning-rate"),
        (["--tau", "0"], "--tau"),
        (["--eps-start", "0.1", "--eps-end", "0.5"], "--eps-end"),
        (["--load", "/nonexistent/q_network.npz"], "--load"),
    ],
)
def test_bad_flag_values_exit_with_one_line(flags, message, tmp_path):
    with pytest.raises(SystemExit) as e:
        dqn.main(dqn.parse_args(flags + ["--out", str(tmp_path)]))
    assert str(e.value).startswith("error: ") and message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.unit
def test_load_rejects_a_corrupt_or_mismatched_checkpoint(tmp_path):
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"this is not a zip file")
    _, graphdef, params, _, _ = _agent()
    parts = {"q_network": dqn.nnx.merge(graphdef, params)}
    with pytest.raises(dqn.InputError, match="not a readable .npz"):
        dqn.load_checkpoint(str(corrupt), parts)
    other = tmp_path / "other.npz"
    _, small_graphdef, small, _, _ = _agent(hidden_size=8)
    dqn.save_checkpoint(str(other), {"q_network": dqn.nnx.merge(small_graphdef, small)})
    with pytest.raises(dqn.InputError, match="--hidden-size"):
        dqn.load_checkpoint(str(other), parts)
    old_format = tmp_path / "old.npz"  # keys without the part's name, as written before save_checkpoint
    np.savez(old_format, **{"hidden1/kernel": np.zeros((4, 16), np.float32)})
    with pytest.raises(dqn.InputError, match="missing"):
        dqn.load_checkpoint(str(old_format), parts)
    assert _leaves_equal(dqn.nnx.state(parts["q_network"]), params)  # a refused file changes nothing


# ----------------------------------------------------------------------------- smoke


@pytest.mark.smoke
def test_cli_trains_saves_and_load_round_trip(tmp_path):
    out = tmp_path / "run"
    proc = run_script(SCRIPT, *TINY, "--out", str(out), "--video", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    progress = [line for line in proc.stdout.splitlines() if line.startswith("step=")]
    assert len(progress) == 2 and all(k in progress[0] for k in ("return=", "eval_return=", "loss=", "eps=", "sps="))
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("eval_return_mean", "eval_return_std", "eval_episodes", "env_steps", "train_seconds", "video_return"):
        assert key in metrics
    assert metrics["eval_episodes"] == 3 and metrics["env_steps"] == 600
    assert sum(metrics["eval_ends"].values()) == 3 and "episodes ended: time_limit=" in proc.stdout
    # exactly the gradient steps the learning-rate schedule was built for
    scheduled = dqn.derived(dqn.parse_args(TINY))["total_gradient_steps"]
    assert metrics["gradient_steps_total"] == scheduled == 8 * 4  # 8 calls (250, 300, …, 600) of 4 steps
    assert (out / "learning_curve.png").stat().st_size > 0
    assert (out / "episode.gif").read_bytes()[:6] == b"GIF89a"  # the video goes under --out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # and nothing lands in the working folder

    # --load evaluates the saved agent without training, on the same fixed evaluation seeds, into <out>/eval/
    before = (out / "metrics.json").read_bytes()
    proc = run_script(
        SCRIPT,
        "--load",
        str(out / "q_network.npz"),
        "--eval-episodes",
        "3",
        "--hidden-size",
        "16",
        "--out",
        str(out),
        "--video",
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "metrics.json").read_bytes() == before  # the training run's files are untouched
    loaded = json.loads((out / "eval" / "metrics.json").read_text())
    assert loaded["env_steps"] == 0 and (out / "eval" / "episode.gif").exists()
    assert loaded["eval_return_mean"] == metrics["eval_return_mean"] and loaded["eval_ends"] == metrics["eval_ends"]


@pytest.mark.smoke
@pytest.mark.parametrize("case", ["zero_steps", "corrupt_load"])
def test_cli_bad_input_one_line_error(case, tmp_path):
    if case == "zero_steps":
        flags = ["--total-timesteps", "0"]
    else:
        (tmp_path / "bad.npz").write_bytes(b"\x00" * 64)
        flags = ["--load", str(tmp_path / "bad.npz")]
    proc = run_script(SCRIPT, *flags, "--out", str(tmp_path / "out"), cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


@pytest.mark.smoke
def test_same_seed_same_run(tmp_path):
    args = dqn.parse_args(TINY + ["--out", str(tmp_path / "a")])
    a = dqn.main(args)
    b = dqn.main(dqn.parse_args(TINY + ["--out", str(tmp_path / "b")]))
    assert [c["eval_return"] for c in a["curve"]] == [c["eval_return"] for c in b["curve"]]
    assert a["eval_return_mean"] == b["eval_return_mean"]


# ----------------------------------------------------------------------------- learning


@pytest.mark.learning
def test_short_run_clearly_beats_a_random_policy(tmp_path):
    # A random policy averages about 22. Measured: this 10k-step run of the default configuration scores
    # well above 100 over 20 greedy episodes; 100 leaves a wide margin on both sides.
    args = dqn.parse_args(["--total-timesteps", "10000", "--eval-episodes", "20", "--out", str(tmp_path)])
    metrics = dqn.main(args)
    assert metrics["eval_return_mean"] >= 100, metrics["curve"]


@pytest.mark.learning
@pytest.mark.parametrize("seed", HELD_OUT_SEEDS)
def test_default_configuration_learns_on_held_out_seeds(seed, tmp_path):
    # The default, 50k steps, final parameters, 100 greedy episodes, on seeds outside the README's tables.
    # Measured: 500.0 on each of seeds 60, 61 and 62. Over the README's seeds 0–39 the default solves 37 of 40,
    # so a change that makes it less robust is likely to fail here; a random policy scores about 22.
    metrics = dqn.main(dqn.parse_args(["--seed", str(seed), "--out", str(tmp_path)]))
    assert metrics["eval_return_mean"] >= 475, [c["eval_return"] for c in metrics["curve"]]


@pytest.mark.smoke
def test_compile_cache_is_written_then_reused_without_changing_the_run(tmp_path):
    cache = tmp_path / "cache"
    runs = []
    for name in ("cold", "warm"):
        proc = run_script(
            SCRIPT, *TINY, "--compile-cache", str(cache), "--out", str(tmp_path / name), cwd=tmp_path, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads((tmp_path / name / "metrics.json").read_text()))
        if name == "cold":
            entries = sorted(p.name for p in cache.iterdir())
            assert entries, "the first run stores its compiled programs"
    assert sorted(p.name for p in cache.iterdir()) == entries  # the second run found them all: nothing new
    assert [c["eval_return"] for c in runs[0]["curve"]] == [c["eval_return"] for c in runs[1]["curve"]]
    assert runs[0]["eval_return_mean"] == runs[1]["eval_return_mean"]


@pytest.mark.unit
def test_sequential_xla_scheduler_is_set_by_the_command_line_and_a_users_setting_wins(monkeypatch):
    import ast

    flag = "--xla_cpu_enable_concurrency_optimized_scheduler"
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    dqn.use_sequential_xla_scheduler()
    assert os.environ["XLA_FLAGS"] == f"{flag}=false"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    dqn.use_sequential_xla_scheduler()  # appended to the user's other flags
    assert os.environ["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {flag}=false"
    monkeypatch.setenv("XLA_FLAGS", f"{flag}=true")
    dqn.use_sequential_xla_scheduler()  # the user's own choice is kept
    assert os.environ["XLA_FLAGS"] == f"{flag}=true"
    # the command line sets it before main(), i.e. before JAX starts its backend
    tree = ast.parse(open(dqn.__file__).read())
    guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)][0]
    calls = [ast.unparse(stmt) for stmt in guard.body]
    assert calls == ["use_sequential_xla_scheduler()", "main(parse_args())"]
