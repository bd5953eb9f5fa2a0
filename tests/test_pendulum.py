"""Tests for 3_Pendulum/pendulum.py: PPO on Pendulum-v1.

unit: GAE with a termination and a truncation, the true final observation at an autoreset, the
clipped loss and its zero gradient, the Normal log-probability of the unclipped sample, the value-loss
shapes, the preset and the input checks. smoke: the CLI with tiny flags, a --load round trip, a GIF,
and bad input. learning: a short fixed-seed run beats a random policy by a wide margin.
"""
from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_script, run_script

SCRIPT = "3_Pendulum/pendulum.py"
RANDOM_RETURN = -1182.0  # uniform-random actions on the 20 evaluation seeds, measured (README)
TINY = ["--total-timesteps", "512", "--num-envs", "4", "--num-steps", "64", "--minibatch-size", "64",
        "--update-epochs", "2", "--eval-episodes", "2"]


@pytest.fixture(scope="module")
def pen():
    return load_script(SCRIPT)


# ---------------------------------------------------------------------------------------------- unit
@pytest.mark.unit
def test_gae_hand_computed_with_termination_and_truncation(pen):
    # env 0: episode A = t0..t1 (terminates at t1), B = t2..t3 (truncated at t3), C = t4 (rollout ends).
    # env 1: no episode boundary.
    gamma, lam = 0.9, 0.5  # γλ = 0.45
    rewards = np.array([[1, 1], [2, 1], [3, 1], [4, 1], [5, 1]], np.float32)
    values = np.array([[0.5, 0], [1.0, 0], [1.5, 0], [2.0, 0], [2.5, 0]], np.float32)
    # V(s_{t+1}) of the TRUE next state: t1's is ignored (termination); t3's is V(final obs) = 3.0,
    # not V(s4) = 2.5 of the next episode; t4's bootstraps the cut-off rollout.
    next_values = np.array([[1.0, 0], [7.0, 0], [2.0, 0], [3.0, 0], [4.0, 0]], np.float32)
    terminated = np.array([[0, 0], [1, 0], [0, 0], [0, 0], [0, 0]], np.float32)
    truncated = np.array([[0, 0], [0, 0], [0, 0], [1, 0], [0, 0]], np.float32)
    adv, ret = pen.compute_gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    # δ = [1 + .9·1 − .5, 2 − 1, 3 + .9·2 − 1.5, 4 + .9·3 − 2, 5 + .9·4 − 2.5] = [1.4, 1.0, 3.3, 4.7, 6.1]
    # A4 = 6.1; A3 = 4.7 (boundary); A2 = 3.3 + .45·4.7; A1 = 1.0 (boundary); A0 = 1.4 + .45·1.0
    expected0 = [1.85, 1.0, 5.415, 4.7, 6.1]
    # env 1: δ = 1 everywhere, A_t = 1 + 0.45·A_{t+1}
    a, expected1 = 0.0, []
    for _ in range(5):
        a = 1.0 + 0.45 * a
        expected1.insert(0, a)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], expected0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(adv)[:, 1], expected1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv) + values, rtol=1e-6)
    assert adv.shape == (5, 2)
    # Treating the truncation as a termination (the spec's version) changes A3 to 4 − 2 = 2.0.
    adv_cut, _ = pen.compute_gae(rewards, values, next_values, np.maximum(terminated, truncated),
                                 np.zeros_like(truncated), gamma, lam)
    assert float(adv_cut[3, 0]) == pytest.approx(2.0)


@pytest.mark.unit
def test_true_next_obs_is_the_final_obs_not_the_reset(pen):
    """With SAME_STEP autoreset the returned obs at a truncation is the NEXT episode's first obs;
    the real s_{t+1} must follow Pendulum's dynamics from s_t."""
    envs = pen.make_envs(2)
    obs, _ = envs.reset(seed=[3, 4])
    zero = np.zeros((2, 1), np.float32)
    for t in range(200):
        prev = obs
        obs, r, term, trunc, info = envs.step(zero)
        done = term | trunc
        if t < 199:
            assert not done.any()
    envs.close()
    assert trunc.all() and not term.any()  # Pendulum only truncates, at step 200
    nxt = pen.true_next_obs(obs, done, info)
    # Pendulum-v1 with u = 0: θ̇' = clip(θ̇ + 3g/(2l)·sin θ·dt, −8, 8), g = 10, l = 1, dt = 0.05
    thdot = np.clip(prev[:, 2] + 15.0 * prev[:, 1] * 0.05, -8, 8)
    np.testing.assert_allclose(nxt[:, 2], thdot, atol=1e-4)
    assert not np.allclose(obs[:, 2], thdot, atol=1e-2)  # the reset obs would be wrong


@pytest.mark.unit
def test_clipped_loss_value_and_zero_gradient_outside_the_clip_range(pen):
    ratio = jnp.array([1.5, 0.5, 0.5, 1.5, 1.1])
    adv = jnp.array([1.0, 1.0, -1.0, -1.0, 1.0])
    logp_old = jnp.zeros(5)
    loss, grad = jax.value_and_grad(pen.ppo_clip_loss)(jnp.log(ratio), logp_old, adv, 0.2)
    # per-sample min(ρA, clip(ρ, .8, 1.2)A) = [1.2 (clipped), 0.5, −0.8 (clipped), −1.5, 1.1]
    assert float(loss) == pytest.approx(-(1.2 + 0.5 - 0.8 - 1.5 + 1.1) / 5, abs=1e-6)
    # d loss / d log π_new = −ρA/5 where unclipped, exactly 0 where the clip is active
    np.testing.assert_allclose(np.asarray(grad), [0.0, -0.1, 0.0, 0.3, -0.22], atol=1e-6)
    assert float(grad[0]) == 0.0 and float(grad[2]) == 0.0


@pytest.mark.unit
def test_normal_log_prob_of_the_unclipped_sample_matches_closed_form(pen):
    from flax import nnx

    actor = pen.Actor(3, 1, 16, "param", "tanh", 2.0, rngs=nnx.Rngs(0))  # σ = e² ≈ 7.4: samples leave [−2, 2]
    obs = jnp.asarray(np.random.default_rng(0).normal(size=(256, 3)), jnp.float32)
    graphdef, state = nnx.split(actor)
    action, logp, _ = pen.act(graphdef, state, obs, jax.random.key(1))
    action, logp = np.asarray(action)[:, 0], np.asarray(logp)
    assert (np.abs(action) > 2).mean() > 0.5  # most samples would have been clipped for the env
    dist = actor(obs)
    mu, sigma = np.asarray(dist.mean())[:, 0], np.asarray(dist.stddev())[:, 0]
    np.testing.assert_allclose(sigma, math.exp(2.0), rtol=1e-6)
    assert np.all(np.abs(mu) <= 2.0)
    closed = -0.5 * ((action - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(logp, closed, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_value_loss_shapes(pen):
    from flax import nnx

    critic = pen.Critic(3, 16, "tanh", rngs=nnx.Rngs(0))
    obs = jnp.asarray(np.random.default_rng(1).normal(size=(8, 3)), jnp.float32)
    returns = jnp.arange(8, dtype=jnp.float32)
    v = critic(obs)
    assert v.shape == (8,)
    loss = pen.value_loss_fn(critic, obs, returns)
    assert loss.shape == ()
    assert float(loss) == pytest.approx(float(np.mean((np.asarray(v) - np.asarray(returns)) ** 2)), rel=1e-6)
    # the spec's broadcast: (8, 1) − (8,) is an 8×8 matrix, whose mean is a different number
    broadcast = float(np.mean((np.asarray(returns) - np.asarray(v)[:, None]) ** 2))
    assert abs(broadcast - float(loss)) > 1e-3
    with pytest.raises(ValueError, match="shape"):
        pen.value_loss_fn(critic, obs, returns[:, None])


@pytest.mark.unit
def test_spec_preset_sets_defaults_and_explicit_flags_win(pen, tmp_path):
    a = pen.parse_args(["--preset", "spec"])
    assert (a.gamma, a.num_envs, a.num_steps, a.minibatch_size, a.actor_lr, a.critic_lr, a.sigma) == \
        (0.99, 1, 2048, 64, 3e-4, 1e-3, "state")
    b = pen.parse_args(["--preset", "spec", "--gamma", "0.9"])
    assert b.gamma == 0.9 and b.num_steps == 2048
    c = pen.parse_args([])
    assert c.gamma == 0.99 and c.sigma == "param" and c.total_timesteps == 100_000
    pen.validate(dataclasses.replace(a, out=str(tmp_path)))  # the parsed preset is valid ...
    pen.validate(pen.Args(preset="spec", out=str(tmp_path), **pen.SPEC_PRESET))  # ... and so is the same in Python
    with pytest.raises(SystemExit, match="applied by parse_args"):  # but not a preset that was never applied
        pen.validate(pen.Args(preset="spec"))


@pytest.mark.unit
@pytest.mark.parametrize("argv, msg", [
    (["--total-timesteps", "0"], "--total-timesteps must be positive"),
    (["--num-steps", "-5"], "--num-steps must be positive"),
    (["--minibatch-size", "5000"], "larger than the rollout"),
    (["--actor-lr", "nan"], "--actor-lr"),
    (["--critic-lr", "-0.001"], "--critic-lr"),
    (["--ent-coef", "-1"], "--ent-coef"),
    (["--gamma", "nan"], "--gamma"),
    (["--load", "/nonexistent/params.npz"], "no such file"),
])
def test_validate_rejects_bad_input(pen, argv, msg, tmp_path):
    with pytest.raises(SystemExit) as e:
        pen.main(pen.parse_args(argv + ["--out", str(tmp_path)]))
    assert str(e.value).startswith("error: ") and msg in str(e.value)


@pytest.mark.unit
def test_load_rejects_a_corrupt_file(pen, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz at all")
    with pytest.raises(SystemExit, match="error: --load"):
        pen.main(pen.parse_args(["--load", str(bad), "--out", str(tmp_path)]))


# ---------------------------------------------------------------------------------------------- smoke
@pytest.mark.smoke
def test_cli_tiny_run_then_load_round_trip_and_video(tmp_path):
    out = tmp_path / "run"
    p = run_script(SCRIPT, *TINY, "--out", str(out), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("update=")]
    assert len(lines) == 2  # 512 // (4 × 64)
    for key in ("step=", "return=", "loss=", "sps="):
        assert key in lines[-1]
    m = json.loads((out / "metrics.json").read_text())
    for key in ("eval_return_mean", "eval_return_std", "eval_episodes", "env_steps", "train_seconds"):
        assert key in m
    assert m["env_steps"] == 512 and m["eval_episodes"] == 2
    assert (out / "learning_curve.png").stat().st_size > 0
    params = out / "params.npz"
    assert "actor/log_std" in np.load(params, allow_pickle=False).files

    gif = tmp_path / "ep.gif"
    q = run_script(SCRIPT, "--load", str(params), "--eval-episodes", "2", "--video", str(gif),
                   "--out", str(tmp_path / "eval"), cwd=tmp_path, timeout=120)
    assert q.returncode == 0, q.stderr
    m2 = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert m2["env_steps"] == 0
    assert m2["eval_return_mean"] == pytest.approx(m["eval_return_mean"], abs=1e-3)  # same params, same seeds
    assert 0 < gif.stat().st_size < 1_500_000


@pytest.mark.smoke
@pytest.mark.parametrize("argv", [["--minibatch-size", "99999"], ["--load", "missing.npz"]])
def test_cli_bad_input_is_one_line_error(tmp_path, argv):
    p = run_script(SCRIPT, *argv, "--out", str(tmp_path), cwd=tmp_path, timeout=60)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: ")


@pytest.mark.unit
def test_load_with_other_architecture_is_one_line_error(pen, tmp_path):
    from flax import nnx

    path = str(tmp_path / "params.npz")
    pen.save_params(path, pen.Actor(3, 1, 64, "param", "tanh", 0.0, rngs=nnx.Rngs(0)),
                    pen.Critic(3, 64, "tanh", rngs=nnx.Rngs(1)), None)
    with pytest.raises(SystemExit, match="error: --load .*missing 'actor/sigma_head"):
        pen.main(pen.parse_args(["--load", path, "--sigma", "state", "--out", str(tmp_path / "e")]))
    with pytest.raises(SystemExit, match="error: --load .*shape"):
        pen.main(pen.parse_args(["--load", path, "--hidden", "32", "--out", str(tmp_path / "e")]))


@pytest.mark.smoke
def test_same_seed_same_run(pen, tmp_path):
    a = pen.main(pen.parse_args(TINY + ["--seed", "7", "--out", str(tmp_path / "a")]))
    b = pen.main(pen.parse_args(TINY + ["--seed", "7", "--out", str(tmp_path / "b")]))
    assert a["eval_returns"] == b["eval_returns"]
    assert a["last_update"] == b["last_update"] and a["last_update"]["v_loss"] > 0


# ---------------------------------------------------------------------------------------------- learning
@pytest.mark.learning
def test_short_run_beats_random_by_far(pen, tmp_path):
    m = pen.main(pen.parse_args(["--seed", "0", "--total-timesteps", "80000", "--out", str(tmp_path)]))
    assert m["env_steps"] == 80_000
    # at most half of a random policy's cost (−1182 / 2 ≈ −591); measured for this run: −151
    assert m["eval_return_mean"] > RANDOM_RETURN / 2, m["eval_return_mean"]
