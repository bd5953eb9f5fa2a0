"""Tests for 4_GRPO_MNIST/grpo_mnist.py, token-level GRPO: the LLM pieces against hand-computed cases (unit), the
causal model and its sampler, the data, the CLI (smoke) and short real runs (learning).

Every test's docstring names broken code it catches ("Catches: …"). The main ones were run as mutations of a
copy of the script (never of the script itself), and each made its test fail.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import importlib.util
import io
import json
import math
import re
import shutil
import struct
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, load_script, run_script
from flax import nnx

SCRIPT = "4_GRPO_MNIST/grpo_mnist.py"
g = load_script(SCRIPT)
# The script's own compilation cache (outside the repository): a second `pytest` reuses the compiled programs.
g.use_compile_cache(g.Args().compile_cache)
# Real digits: the official MNIST test set that ships with the module (4_GRPO_MNIST/data/, see its README.md).
REAL_MNIST = Path(g.BUNDLED_DIR)
EOS = g.EOS
LN2 = math.log(2)


# ------------------------------------------------------------------ helpers
def idx_bytes(array: np.ndarray) -> bytes:
    """Encode a uint8 array in the IDX format by hand: 0 0 0x08 ndim, big-endian sizes, the bytes."""
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_gz(path, payload: bytes) -> None:
    with gzip.open(path, "wb") as f:
        f.write(payload)


def synthetic_digits(folder, n_train=2000, n_test=500, seed=0, splits=("train", "t10k")):
    """Ten random 28×28 prototypes plus pixel noise, written as the four standard IDX .gz files."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(10, 28, 28))
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        if split not in splits:
            continue
        labels = rng.integers(0, 10, size=n).astype(np.uint8)
        noise = rng.normal(0, 60, size=(n, 28, 28))
        images = np.clip(prototypes[labels] + noise, 0, 255).astype(np.uint8)
        write_gz(folder / f"{split}-images-idx3-ubyte.gz", idx_bytes(images))
        write_gz(folder / f"{split}-labels-idx1-ubyte.gz", idx_bytes(labels))
    return folder


def grpo_config(**changes) -> g.Args:
    """Args for the unit tests: B = 4 prompts, G = 4, μ = 1, β = 0; the keyword arguments change them."""
    base = dict(
        objective="grpo",
        group_mode="prompt",
        group_size=4,
        batch_size=4,
        inner_steps=1,
        clip_eps=0.2,
        beta=0.0,
        kl="k3",
        loss_agg="seq-mean-token-mean",
        drop_zero_var=False,
        ref_refresh=0,
        reward="exact",
        adv_norm="std",
        adv_eps=1e-4,
    )
    return g.Args(**{**base, **changes})


def params(state_or_module) -> list[np.ndarray]:
    """The nnx.Param leaves of a module or of its state, as NumPy arrays."""
    if isinstance(state_or_module, nnx.Module):
        state_or_module = nnx.state(state_or_module, nnx.Param)
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state_or_module)]


def same_params(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(params(a), params(b), strict=True))


def constant_policy(n_slots: int, logits) -> g.Policy:
    """A Policy whose logits are `logits` at every position, whatever the prompt and the tokens: the decoder's
    weights and bias are 0, so its ReLU layer outputs 0 and the head returns its bias."""
    policy = g.Policy(n_slots, 4, 8, rngs=nnx.Rngs(0))
    policy.decoder.kernel[...] = jnp.zeros_like(policy.decoder.kernel[...])
    policy.decoder.bias[...] = jnp.zeros_like(policy.decoder.bias[...])
    policy.head.bias[...] = jnp.asarray(logits, jnp.float32)
    return policy


def one_image_strips(labels) -> g.Strips:
    """Prompts of one blank image each (N = 1) whose targets are `labels`."""
    y = jnp.asarray(labels, jnp.int32)
    return g.make_strips(jnp.zeros((len(labels), 784)), y, jnp.arange(len(labels))[:, None], jnp.ones(len(labels), int))


@functools.cache
def bundled_data():
    """The default split of the bundled digits (7,200 train / 800 validation / 2,000 test), read once."""
    return g.load_data(g.Args())


# The command line's tiny runs (smoke), per task; tests that run train() or main() in this process use the same
# flags where they can, so that each set of compiled programs is built once and then read from the cache.
SMOKE_FLAGS = dict(
    digit=["--task", "digit", "--beta", "0"],  # β = 0: no reference logits in the rollout
    number=["--task", "number", "--max-digits", "3", "--sft-steps", "2", "--beta", "0.1", "--learning-rate", "0.01"],
)
TINY_FLAGS = [
    *("--iterations", "4", "--eval-every", "2", "--eval-samples", "4", "--pass-k", "2"),
    *("--batch-size", "8", "--group-size", "4", "--hidden-size", "16", "--decoder-size", "32"),
]


# ------------------------------------------------------------------ unit: per-token ratio and clip
@pytest.mark.unit
def test_clipped_surrogate_per_token_objective_binds_outside_and_gradient():
    """Two answers of three tokens, ε = 0.2; answer 0 has A = +1, answer 1 has A = −1 (broadcast from (S, 1)).
    ratios [[1.5, 0.5, 1.1], [1.1, 0.7, 1.3]]. min(ρA, clip(ρ, 0.8, 1.2)A):
      A = +1: min(1.5, 1.2) = 1.2 (binds), min(0.5, 0.8) = 0.5 (outside, not binding), 1.1 (inside);
      A = −1: −1.1 (inside), min(−0.7, −0.8) = −0.8 (binds), min(−1.3, −1.2) = −1.3 (outside, not binding).
    ∂/∂log π of ρA is ρA where the unclipped term is the minimum, 0 where the clipped constant is.
    Catches: binds = outside (|ρ − 1| > ε whatever A's sign), binds on one side only, max instead of min, no clip,
    the ratio the wrong way round (π_old / π)."""
    ratio = jnp.array([[1.5, 0.5, 1.1], [1.1, 0.7, 1.3]])
    adv = jnp.array([[1.0], [-1.0]])
    logp_old = jnp.array([[-1.0, -2.0, -0.5], [-3.0, -0.2, -1.5]])
    logp = logp_old + jnp.log(ratio)
    objective, binds, outside = g.clipped_surrogate(logp, logp_old, adv, 0.2)
    np.testing.assert_allclose(objective, [[1.2, 0.5, 1.1], [-1.1, -0.8, -1.3]], rtol=1e-6)
    np.testing.assert_array_equal(binds, [[True, False, False], [False, True, False]])
    np.testing.assert_array_equal(outside, [[True, True, False], [False, True, True]])
    grad = jax.grad(lambda lp: g.clipped_surrogate(lp, logp_old, adv, 0.2)[0].sum())(logp)
    np.testing.assert_allclose(grad, [[0.0, 0.5, 1.1], [-1.1, 0.0, -1.3]], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(grad) == 0, binds)  # binding ⇔ the clip zeroes the gradient


# ------------------------------------------------------------------ unit: loss aggregation
@pytest.mark.unit
def test_aggregate_three_modes_on_a_ragged_mask_with_a_dropped_answer():
    """Three answers of N = 3 tokens: lengths 2 and 3, and one dropped answer (mask all 0, values that must not
    count). seq-mean-token-mean: ((1 + 2)/2 + (4 + 5 + 6)/3) / 2 = (1.5 + 5) / 2 = 3.25; token-mean:
    (1 + 2 + 4 + 5 + 6) / 5 = 3.6; dr-grpo: 18 / (2 answers × N = 3) = 3.0. Catches: the dropped answer counted
    among the answers (seq-mean 6.5/3, dr-grpo 18/9), the mask not applied (values 3, 7, 8, 9 summed), modes
    swapped, dr-grpo normalised by the tokens present."""
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert float(g.aggregate(per_token, mask, "seq-mean-token-mean")) == pytest.approx(3.25, rel=1e-6)
    assert float(g.aggregate(per_token, mask, "token-mean")) == pytest.approx(3.6, rel=1e-6)
    assert float(g.aggregate(per_token, mask, "dr-grpo")) == pytest.approx(3.0, rel=1e-6)
    for how in ("seq-mean-token-mean", "token-mean", "dr-grpo"):  # every answer dropped: 0, not NaN
        assert float(g.aggregate(per_token, jnp.zeros_like(mask), how)) == 0.0


_jit_grad = nnx.jit(lambda policy, *a: nnx.grad(lambda p: g.grpo_loss(p, *a)[0])(policy), static_argnums=3)


@pytest.mark.unit
def test_loss_agg_changes_the_gradient_only_on_ragged_answers():
    """grpo_loss's gradient under --loss-agg. On answers of lengths 2, 3, 3 and 1, seq-mean-token-mean and
    token-mean weigh tokens differently, so their gradients differ; when every answer has 2 tokens they are
    equal, and dr-grpo's (sum / (S · N = 3)) is token-mean's × 2/3. Catches: grpo_loss ignoring config.loss_agg
    (one fixed mode), or a mode that is not what its name says."""
    policy = g.Policy(3, 8, 16, rngs=nnx.Rngs(0))
    x = jax.random.uniform(jax.random.key(0), (4, 784))
    strips = g.make_strips(x, jnp.array([3, 1, 4, 1]), jnp.array([[0, 1, 2], [3, 0, 1]]), jnp.array([3, 2]))
    adv = jnp.array([[1.0], [-1.0], [0.5], [-0.3]])  # G = 2 answers for each of the 2 prompts

    @nnx.jit  # one compiled program, not one per operation
    def rollout_of(policy, tokens):
        prompt = jnp.repeat(policy.encode(strips.images, strips.slots), 2, axis=0)
        logp_old = g.token_logp(policy(prompt, tokens), tokens)
        return g.Rollout(tokens, g.completion_mask(tokens), logp_old, adv, None)

    def grads(tokens, loss_agg):
        rollout = rollout_of(policy, jnp.asarray(tokens))
        config = grpo_config(group_size=2, batch_size=2, loss_agg=loss_agg)
        return params(_jit_grad(policy, strips, rollout, config))

    ragged = [[3, EOS, 0], [3, 7, EOS], [1, 2, 3], [EOS, 0, 0]]  # mask lengths 2, 3, 3, 1
    seq, tok = grads(ragged, "seq-mean-token-mean"), grads(ragged, "token-mean")
    assert max(np.abs(a - b).max() for a, b in zip(seq, tok)) > 1e-3
    even = [[3, EOS, 1], [5, EOS, 2], [7, EOS, 0], [9, EOS, EOS]]  # every mask length 2
    seq, tok, dr = (grads(even, how) for how in ("seq-mean-token-mean", "token-mean", "dr-grpo"))
    for a, b, c in zip(seq, tok, dr):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(c, b * 2 / 3, rtol=1e-5, atol=1e-8)
    assert max(np.abs(a).max() for a in tok) > 1e-3  # the gradients are not all zero


# ------------------------------------------------------------------ unit: the per-token KL estimators
@pytest.mark.unit
def test_token_kl_values_on_a_hand_case():
    """Vocabulary of 3, two positions. Position 0: π = (1/2, 1/4, 1/4), π_ref = (1/4, 1/4, 1/2); position 1:
    π = π_ref. exact = Σ_v π(v) log(π(v)/π_ref(v)) = ½ ln 2 + 0 + ¼ ln ½ = ¼ ln 2 at position 0, 0 at position 1,
    whatever the token. On the sampled token, log_r = log π_ref − log π:
      token 0: log_r = −ln 2, k1 = ln 2, k3 = ½ + ln 2 − 1;   token 2: log_r = ln 2, k1 = −ln 2, k3 = 2 − ln 2 − 1.
    Catches: k1 with the wrong sign, k3 on the reversed ratio (π/π_ref), exact not summed over the vocabulary (or
    weighted by π_ref), an estimator read at another token than the sampled one."""
    p = jnp.log(jnp.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]))
    q = jnp.log(jnp.array([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]]))
    logits, ref_logits = jnp.stack([p, p]), jnp.stack([q, q])  # (S = 2, N = 2, V = 3)
    tokens = jnp.array([[0, 2], [2, 1]])
    np.testing.assert_allclose(g.token_kl(logits, ref_logits, tokens, "exact"), [[LN2 / 4, 0], [LN2 / 4, 0]], atol=1e-6)
    np.testing.assert_allclose(g.token_kl(logits, ref_logits, tokens, "k1"), [[LN2, 0], [-LN2, 0]], atol=1e-6)
    np.testing.assert_allclose(
        g.token_kl(logits, ref_logits, tokens, "k3"), [[0.5 + LN2 - 1, 0], [2 - LN2 - 1, 0]], atol=1e-6
    )


@pytest.mark.unit
def test_token_kl_exact_is_the_vocabulary_sum_and_k3_is_nonnegative():
    """Random logits over the real vocabulary (S = 64, N = 4): exact equals Σ_v π(v)(log π(v) − log π_ref(v))
    computed here with NumPy; k3 ≥ 0 everywhere, and k1 = k3 = exact = 0 when π_ref = π. Catches: a k3 that can go
    negative (e.g. k3 = log_r − e^log_r + 1, or k1 returned for k3), exact as a single-token estimate."""
    rng = np.random.default_rng(0)
    logits, ref_logits = rng.normal(size=(2, 64, 4, g.VOCAB)) * 3
    tokens = jnp.asarray(rng.integers(0, g.VOCAB, (64, 4)))
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    q = np.exp(ref_logits) / np.exp(ref_logits).sum(-1, keepdims=True)
    exact = g.token_kl(jnp.asarray(logits), jnp.asarray(ref_logits), tokens, "exact")
    np.testing.assert_allclose(exact, np.sum(p * np.log(p / q), axis=-1), rtol=1e-4, atol=1e-6)
    k3 = np.asarray(g.token_kl(jnp.asarray(logits), jnp.asarray(ref_logits), tokens, "k3"))
    assert (k3 >= 0).all() and k3.max() > 1.0  # far-apart policies: large, never negative
    same = jnp.asarray(logits)
    for how in ("exact", "k1", "k3"):
        np.testing.assert_allclose(g.token_kl(same, same, tokens, how), 0.0, atol=1e-6)


@pytest.mark.unit
def test_categorical_log_prob_entropy_and_kl_match_the_hand_formula():
    """token_logp and token_kl (tfd.Categorical, tfd.kl_divergence) against the formulas written out in NumPy
    (float64) on random logits z, mild (scale 1) and peaked (scale 20): log π(v) = z_v − log Σ_u e^{z_u} at the given
    token; exact KL(π ‖ π_ref) = Σ_v π(v)(log π(v) − log π_ref(v)), which is not KL(π_ref ‖ π); and the entropy
    H(π) = −Σ_v π(v) log π(v), read through the KL to the uniform π_ref: KL(π ‖ uniform) = log V − H(π).
    Catches: an unnormalised log-prob (z_v alone), the log-prob of another token, the KL's arguments swapped,
    a KL weighted by π_ref."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, g.VOCAB, (32, 4))
    for scale in (1.0, 20.0):
        z, z_ref = rng.normal(size=(2, 32, 4, g.VOCAB)) * scale
        log_p, log_q = (v - v.max(-1, keepdims=True) for v in (z, z_ref))  # shifted for exp, then normalised:
        log_p, log_q = (v - np.log(np.sum(np.exp(v), -1, keepdims=True)) for v in (log_p, log_q))
        p, q = np.exp(log_p), np.exp(log_q)
        logits, ref_logits = jnp.asarray(z, jnp.float32), jnp.asarray(z_ref, jnp.float32)
        hand_logp = np.take_along_axis(log_p, tokens[..., None], axis=-1)[..., 0]
        np.testing.assert_allclose(g.token_logp(logits, jnp.asarray(tokens)), hand_logp, rtol=1e-5, atol=1e-5)
        exact = g.token_kl(logits, ref_logits, jnp.asarray(tokens), "exact")
        hand_kl, reverse_kl = np.sum(p * (log_p - log_q), -1), np.sum(q * (log_q - log_p), -1)
        np.testing.assert_allclose(exact, hand_kl, rtol=1e-5, atol=1e-5)
        assert np.abs(hand_kl - reverse_kl).max() > 0.1  # the two directions differ: a swap cannot pass
        hand_entropy = -np.sum(p * log_p, -1)
        to_uniform = g.token_kl(logits, jnp.zeros_like(logits), jnp.asarray(tokens), "exact")
        np.testing.assert_allclose(math.log(g.VOCAB) - np.asarray(to_uniform), hand_entropy, rtol=1e-5, atol=1e-5)


def _one_position(seed=0):
    """Logits θ and reference logits over the vocabulary at one position, and their probabilities."""
    rng = np.random.default_rng(seed)
    theta, ref = jnp.asarray(rng.normal(size=g.VOCAB)), jnp.asarray(rng.normal(size=g.VOCAB))
    return theta, ref, jax.nn.softmax(theta), jax.nn.softmax(ref)


def _expected_estimate(theta, ref, how):
    """E_{y ~ π_old}[estimate(y)] at one position with π_old = π_θ held fixed (the samples do not move with θ),
    computed exactly: each of the V tokens is one answer (S = V, N = 1), weighted by its probability."""
    weights = jax.lax.stop_gradient(jax.nn.softmax(theta))
    v = g.VOCAB
    per_token = g.token_kl(
        jnp.broadcast_to(theta, (v, 1, v)), jnp.broadcast_to(ref, (v, 1, v)), jnp.arange(v)[:, None], how
    )
    return jnp.sum(weights * per_token[:, 0])


@pytest.mark.unit
def test_token_kl_gradients_exact_k1_and_k3():
    """At one position, with softmax logits θ, KL = KL(π ‖ π_ref):
      exact: ∇_θ KL(π ‖ π_ref) = π (log π − log π_ref − KL), whichever token is given;
      k1 on on-policy samples: E[∇ k1] = Σ_y π(y) ∇ log π(y) = ∇ Σ_y π(y) = 0 (its value is unbiased, its gradient
      pushes nothing in expectation);
      k3 on on-policy samples: E[∇ k3] = −Σ_y π_ref(y) ∇ log π(y) = π − π_ref = ∇ KL(π_ref ‖ π), the other KL;
      both estimators' expected VALUES equal KL(π ‖ π_ref).
    Catches: an exact KL with the wrong direction (KL(π_ref ‖ π)), a k1 that is not log π − log π_ref (its expected
    value moves), a k3 with the ratio reversed (its expected gradient is no longer π − π_ref)."""
    theta, ref, p, q = _one_position()
    kl = float(jnp.sum(p * jnp.log(p / q)))
    # compiled as the training step compiles them (one program each, instead of one per operation)
    exact = jax.jit(lambda t, token: g.token_kl(t[None, None], ref[None, None], jnp.array([[token]]), "exact")[0, 0])
    np.testing.assert_allclose(exact(theta, 0), kl, rtol=1e-5)
    np.testing.assert_allclose(exact(theta, 7), kl, rtol=1e-5)
    exact_grad = jax.jit(jax.grad(exact))(theta, 3)
    np.testing.assert_allclose(exact_grad, p * (jnp.log(p) - jnp.log(q) - kl), rtol=1e-4, atol=1e-7)

    expected, expected_grad = (jax.jit(f, static_argnums=2) for f in (_expected_estimate, jax.grad(_expected_estimate)))
    np.testing.assert_allclose(expected(theta, ref, "k1"), kl, rtol=1e-5)
    np.testing.assert_allclose(expected_grad(theta, ref, "k1"), 0.0, atol=1e-6)

    np.testing.assert_allclose(expected(theta, ref, "k3"), kl, rtol=1e-5)
    k3_grad = expected_grad(theta, ref, "k3")
    np.testing.assert_allclose(k3_grad, p - q, rtol=1e-4, atol=1e-7)
    assert float(jnp.abs(k3_grad - exact_grad).max()) > 0.05  # a different vector from the exact KL's gradient


# ------------------------------------------------------------------ unit: masks and the verifier
@pytest.mark.unit
def test_completion_mask_answer_length_and_verifier_on_hand_cases():
    """Target "37" EOS EOS (N = 4). Answers, with the completion mask (up to and including the first EOS), the
    answer length, the exact reward and the partial one (digits right in place / the longer length):
      "37" EOS 5   → 1110, 2, 1, 1       (tokens after the first EOS are ignored)
      "3" EOS 7 EOS→ 1100, 1, 0, 1/2
      "378" EOS    → 1111, 3, 0, 2/3
      "38" EOS EOS → 1110, 2, 0, 1/2
      EOS "37" EOS → 1000, 0, 0, 0
      "3777"       → 1111, 4, 0, 2/4     (no EOS: all N tokens)
      "73" EOS EOS → 1110, 2, 0, 0
    Catches: a mask without the EOS token (or past it), tokens after EOS compared (first answer scored 0), partial
    credit divided by the target's length only ("378" → 1), digits compared out of place, an answer that never
    stops counted as right."""
    target = jnp.array([[3, 7, EOS, EOS]] * 7)
    tokens = jnp.array(
        [
            [3, 7, EOS, 5],
            [3, EOS, 7, EOS],
            [3, 7, 8, EOS],
            [3, 8, EOS, EOS],
            [EOS, 3, 7, EOS],
            [3, 7, 7, 7],
            [7, 3, EOS, EOS],
        ]
    )
    mask = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    np.testing.assert_array_equal(g.completion_mask(tokens), mask)
    np.testing.assert_array_equal(g.answer_length(tokens), [2, 1, 3, 2, 0, 4, 2])
    np.testing.assert_array_equal(g.verify(tokens, target), [1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(g.verify(tokens, target, partial=True), [1, 1 / 2, 2 / 3, 1 / 2, 0, 2 / 4, 0], rtol=1e-6)
    # a full-length target (no EOS): the right answer fills all N slots
    assert float(g.verify(jnp.array([[1, 2, 3, 4]]), jnp.array([[1, 2, 3, 4]]))[0]) == 1.0


# ------------------------------------------------------------------ unit: group advantages and zero-signal groups
@pytest.mark.unit
def test_group_advantages_hand_computed_g4():
    """A_bg = (r_bg − mean_b) / (std_b + ε) per row; all-equal rows give exactly 0. Catches: the sample std (ddof 1),
    the mean or std taken over the batch or over the wrong axis, ε added to the wrong place."""
    rewards = jnp.array(
        [
            [1.0, 0, 0, 0],  # mean 1/4, std √3/4
            [1.0, 1, 0, 0],  # mean 1/2, std 1/2
            [1.0, 1, 1, 1],  # all right: no signal
            [0.0, 0, 0, 0],  # all wrong: no signal
        ]
    )
    eps = 1e-4
    s = np.sqrt(3) / 4
    expected = np.array(
        [
            [0.75 / (s + eps), -0.25 / (s + eps), -0.25 / (s + eps), -0.25 / (s + eps)],
            [0.5 / (0.5 + eps), 0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps)],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
        ]
    )
    adv = np.asarray(g.group_advantages(rewards, eps))
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=0)
    assert (adv[2:] == 0).all()  # exactly zero, not just small


@pytest.mark.unit
def test_batch_advantages_use_one_baseline_for_all_answers():
    """--group-mode batch: one mean and std over every answer. Catches: a per-row baseline in batch mode."""
    rewards = jnp.array([[1.0], [0.0], [0.0], [1.0]])  # batch mean 1/2, std 1/2
    adv = np.asarray(g.batch_advantages(rewards, 1e-4))
    np.testing.assert_allclose(adv[:, 0], np.array([1, -1, -1, 1]) * 0.5 / (0.5 + 1e-4), rtol=1e-6)
    assert (np.asarray(g.group_advantages(rewards, 1e-4)) == 0).all()  # one-answer groups: no signal at all


_jit_rollout = nnx.jit(g.rollout_groups, static_argnums=4)  # as train_block runs it: compiled, config static


@pytest.mark.unit
def test_equal_partial_rewards_carry_no_signal_though_their_float_std_is_not_0():
    """Eight answers that each get 1 of 3 digits right, as verify scores them: 1/3 in float32, whose std over
    G = 8 is about 3e-8, not 0 (with G = 4 it happens to be 0). Equality is decided exactly: the group has no
    signal, every advantage is exactly 0 (both norms), and batch mode agrees. Catches: deciding "no signal" by
    std > 0, which gives each answer a tiny ±3e-4 advantage."""
    tokens = jnp.array([[1, 9, 9, g.EOS]] * 8)
    rewards = g.verify(tokens, jnp.array([[1, 2, 3, g.EOS]] * 8), partial=True).reshape(1, 8)
    assert (np.asarray(rewards) == np.float32(1) / 3).all()
    assert float(rewards.std()) > 0  # the float error the test is about
    assert not bool(g.has_signal(rewards)[0])
    for norm in ("std", "none"):
        assert (np.asarray(g.group_advantages(rewards, 1e-4, norm)) == 0).all()
        assert (np.asarray(g.batch_advantages(rewards.reshape(8, 1), 1e-4, norm)) == 0).all()


@pytest.mark.unit
@pytest.mark.parametrize("drop", [False, True])
def test_rollout_counts_a_group_of_equal_partial_rewards_as_zero_signal(drop):
    """--reward partial, one 3-image prompt with digits 3 1 1 and a policy that always writes 3 (no EOS in 3
    tokens): each of the G = 8 answers scores 1/3. The rollout must count the group in zero_signal, give it A = 0
    and, with --drop-zero-var, an all-0 mask. Catches: rollout_groups deciding the signal with std > 0."""
    policy = constant_policy(3, jnp.full(g.VOCAB, -30.0).at[3].set(0.0))
    strips = g.make_strips(jnp.zeros((3, 784)), jnp.array([3, 1, 1]), jnp.array([[0, 1, 2]]), jnp.array([3]))
    config = grpo_config(group_size=8, batch_size=1, reward="partial", drop_zero_var=drop)
    rollout, metrics = _jit_rollout(policy, policy, strips, jax.random.key(0), config)
    assert float(metrics["reward"]) == pytest.approx(1 / 3) and float(metrics["zero_signal"]) == 1.0
    assert (np.asarray(rollout.adv) == 0).all()
    assert (np.asarray(rollout.mask) == 0).all() == drop


@pytest.mark.unit
def test_dr_grpo_advantage_is_the_centred_reward_without_the_std():
    """--adv-norm none: A = r − mean(r) per group, no division (Dr. GRPO); all-equal groups still get 0; batch mode
    centres on the batch mean. Catches: dividing anyway, centring on the wrong axis, the flag ignored."""
    rewards = jnp.array([[1.0, 0, 0, 0], [1.0, 1, 1, 1]])
    np.testing.assert_array_equal(
        np.asarray(g.group_advantages(rewards, 1e-4, "none")), [[0.75, -0.25, -0.25, -0.25], [0, 0, 0, 0]]
    )
    flat = rewards.reshape(8, 1)  # batch mean 5/8
    np.testing.assert_allclose(np.asarray(g.batch_advantages(flat, 1e-4, "none")), np.asarray(flat) - 0.625)


def global_norm(arrays) -> float:
    return float(np.sqrt(sum(np.sum(np.square(a)) for a in arrays)))


@pytest.mark.unit
def test_without_the_std_the_kl_term_weighs_more_and_the_loss_scale_does_not_move_adam():
    """What --adv-norm none (Dr. GRPO's advantage) changes, on fixed tensors: two groups of G = 4 with one right
    answer each (std √3/4), ratios away from 1, π_ref another policy, β = 0.1, k3. Without the division every
    advantage is (std + ε) times smaller, so the surrogate's gradient is (std + ε) times smaller while the β·KL
    term's is the same: the KL term's share ‖∇ β·KL‖ / ‖∇ surrogate‖ grows by 1/(std + ε), more than 2 for 0/1
    rewards. That alone would not move the policy less: Adam takes the same steps when the loss is rescaled. And
    groups are weighed differently: a group with 1 of 8 right carries less of Σ|A| against a half-right one.
    Catches: --adv-norm none still dividing by the std; a β·KL term scaled with the advantages."""
    policy, reference = g.Policy(3, 8, 16, rngs=nnx.Rngs(0)), g.Policy(3, 8, 16, rngs=nnx.Rngs(1))
    x = jax.random.uniform(jax.random.key(0), (4, 784))
    strips = g.make_strips(x, jnp.array([3, 1, 4, 1]), jnp.array([[0, 1, 2], [3, 0, 1]]), jnp.array([3, 2]))
    tokens = jnp.array(
        [[3, EOS, 0], [3, 7, EOS], [1, 2, 3], [EOS, 0, 0], [4, 1, EOS], [1, EOS, 0], [2, 2, 2], [9, 9, 9]]
    )
    rewards = jnp.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    std, eps = np.sqrt(3) / 4, 1e-4

    @nnx.jit
    def rollout_of(policy, reference, adv):
        prompt = jnp.repeat(policy.encode(strips.images, strips.slots), 4, axis=0)
        shift = jax.random.uniform(jax.random.key(1), tokens.shape, minval=-0.5, maxval=0.5)  # ratios ≠ 1
        logp_old = g.token_logp(policy(prompt, tokens), tokens) + shift
        ref_prompt = jnp.repeat(reference.encode(strips.images, strips.slots), 4, axis=0)
        return g.Rollout(tokens, g.completion_mask(tokens), logp_old, adv, reference(ref_prompt, tokens))

    def parts(norm):
        """(∇ surrogate, ∇ β·KL) under the advantage `norm`: grpo_loss at β = 0, and the rest at β = 0.1."""
        rollout = rollout_of(policy, reference, g.group_advantages(rewards, eps, norm).reshape(-1, 1))
        surrogate = params(_jit_grad(policy, strips, rollout, grpo_config(batch_size=2, beta=0.0)))
        total = params(_jit_grad(policy, strips, rollout, grpo_config(batch_size=2, beta=0.1, kl="k3")))
        return surrogate, [t - s for t, s in zip(total, surrogate)]

    (s_std, kl_std), (s_none, kl_none) = parts("std"), parts("none")
    assert global_norm(kl_std) > 1e-4
    np.testing.assert_allclose(global_norm(kl_none), global_norm(kl_std), rtol=1e-4)  # the KL term is untouched
    np.testing.assert_allclose(global_norm(s_none) / global_norm(s_std), std + eps, rtol=1e-4)
    share = {n: global_norm(kl) / global_norm(s) for n, s, kl in (("std", s_std, kl_std), ("none", s_none, kl_none))}
    np.testing.assert_allclose(share["none"] / share["std"], 1 / (std + eps), rtol=1e-4)
    assert share["none"] > 2 * share["std"]

    # Adam: the same three steps whether the gradients are scaled by std + ε or not
    def adam_steps(scale):
        tx, out = optax.adam(1e-3), []
        state = tx.init(s_std)
        for step in range(3):
            updates, state = tx.update([scale * (step + 1) * a for a in s_std], state)
            out.append(updates)
        return out

    for a, b in zip(adam_steps(1.0), adam_steps(std + eps)):
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, atol=1e-5)  # 1 % of a step of 1e-3: Adam's ε 1e-8 shows on tiny entries

    # the groups' weights: Σ|A| of a group with 1 of 8 right against a half-right group
    eight = jnp.array([[1.0, 0, 0, 0, 0, 0, 0, 0], [1.0, 1, 1, 1, 0, 0, 0, 0]])
    weight = {n: np.abs(np.asarray(g.group_advantages(eight, eps, n))).sum(axis=1) for n in ("std", "none")}
    np.testing.assert_allclose(weight["none"][0] / weight["none"][1], 1.75 / 4, rtol=1e-6)
    np.testing.assert_allclose(weight["std"][0] / weight["std"][1], (1.75 / np.sqrt(7 / 64)) / 8, rtol=1e-3)


@pytest.mark.unit
@pytest.mark.parametrize("drop", [False, True])
def test_rollout_drops_zero_variance_groups_and_always_reports_their_share(drop):
    """A policy that answers 3 or 5 with probability ½ each (every other token e^−30 as likely), G = 8, four
    one-image prompts with targets 3, 5, 1, 3: the prompt with target 1 is always all wrong (a zero-variance
    group); the others are mixed unless the 8 draws happen to agree. The zero-variance groups are found here from
    the sampled tokens. With --drop-zero-var every answer of those groups gets an all-0 mask and the others keep
    their completion mask; without it every mask stays; zero_signal is their share either way, and their
    advantages are 0. Catches: dropping nothing, dropping the wrong rows (groups not adjacent rows), zero_signal
    reported only when dropping, or counted over answers instead of groups."""
    logits = jnp.full(g.VOCAB, -30.0).at[3].set(0.0).at[5].set(0.0)
    policy, targets, G = constant_policy(1, logits), [3, 5, 1, 3], 8
    config = grpo_config(group_size=G, batch_size=4, drop_zero_var=drop)
    rollout, metrics = _jit_rollout(policy, policy, one_image_strips(targets), jax.random.key(1), config)
    answers = np.asarray(rollout.tokens[:, 0]).reshape(4, G)
    assert set(answers.ravel()) == {3, 5}
    rewards = answers == np.array(targets)[:, None]
    zero_var = rewards.all(axis=1) | ~rewards.any(axis=1)  # (B,)
    assert zero_var[2] and not zero_var.all()  # this key gives both kinds of groups
    expected_mask = np.repeat(~zero_var if drop else np.ones(4, bool), G)[:, None].astype(np.float32)
    np.testing.assert_array_equal(rollout.mask, expected_mask)
    assert float(metrics["zero_signal"]) == pytest.approx(zero_var.mean())
    assert float(metrics["reward"]) == pytest.approx(rewards.mean())
    assert (np.asarray(rollout.adv).reshape(4, G)[zero_var] == 0).all()


@pytest.mark.unit
def test_clip_and_outside_fractions_count_every_answer_token_dropped_or_not():
    """The rollout of the drop test (targets 3, 5, 1, 3; G = 8; one token per answer), with log π_old moved by 1 on
    the zero-variance groups' tokens only: there ρ = e^±1 is outside [1 − ε, 1 + ε], elsewhere ρ = 1. outside_frac
    is the share of ALL answer tokens outside, with --drop-zero-var or without: the same denominator in both
    modes. Catches: counting over the loss mask, which loses the dropped groups' tokens."""
    logits = jnp.full(g.VOCAB, -30.0).at[3].set(0.0).at[5].set(0.0)
    policy, targets, G = constant_policy(1, logits), [3, 5, 1, 3], 8
    for drop in (False, True):
        config = grpo_config(group_size=G, batch_size=4, drop_zero_var=drop)
        strips = one_image_strips(targets)
        rollout, metrics = _jit_rollout(policy, policy, strips, jax.random.key(1), config)
        zero_var = np.repeat(np.asarray(rollout.adv).reshape(4, G).std(axis=1) == 0, G)[:, None]
        assert 0 < zero_var.mean() < 1
        moved = rollout._replace(logp_old=rollout.logp_old + jnp.where(zero_var, 1.0, 0.0))
        _, aux = g.grpo_loss(policy, strips, moved, config)
        assert float(aux["outside_frac"]) == pytest.approx(zero_var.mean())
        assert float(aux["clip_frac"]) == 0.0  # A = 0 on those tokens: nothing binds


# ------------------------------------------------------------------ unit: μ, the clip and the reference
def _after_one_update(inner_steps: int, clip_eps: float):
    """A fresh --task digit policy after one grpo_update (Adam, learning rate 3e-2, B = 16, G = 8) on bundled
    training digits; returns its parameters and the update's metrics."""
    data = bundled_data()
    policy = g.Policy(1, 16, 32, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(policy, optax.adam(3e-2), wrt=nnx.Param)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    strips = g.make_strips(x, y, *g.draw_prompts(jax.random.key(0), len(y), 16, 1))
    config = grpo_config(group_size=8, batch_size=16, inner_steps=inner_steps)
    reference = g.Policy(1, 16, 32, rngs=nnx.Rngs(1))  # another policy (β = 0: it enters no loss)
    key, eps = jax.random.key(1), jnp.float32(clip_eps)
    metrics = _jit_grpo_update_eps(policy, optimizer, reference, strips, key, config, eps)
    return params(policy), {k: float(v) for k, v in metrics.items()}


@partial(nnx.jit, static_argnums=5)
def _jit_grpo_update_eps(policy, optimizer, reference, strips, key, config, clip_eps):
    """grpo_update with ε given as an array, not in the static config: updates that differ only in ε are one
    compiled program (ε enters only the arithmetic of clipped_surrogate)."""
    return g.grpo_update(policy, optimizer, reference, strips, key, replace(config, clip_eps=clip_eps))


@pytest.mark.unit
def test_clip_frac_at_mu_2_is_the_share_of_the_second_step():
    """μ = 2: step 1 has ρ = 1 exactly, so only step 2 can bind. grpo_update's clip_frac and outside_frac must be
    step 2's own shares, computed here by hand (one update on grpo_loss's gradient, then grpo_loss again on the
    same rollout), not the mean with step 1's zeros. Catches: averaging the fractions over all μ steps."""
    data = bundled_data()
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    strips = g.make_strips(x, y, *g.draw_prompts(jax.random.key(0), len(y), 16, 1))
    config = grpo_config(group_size=8, batch_size=16, inner_steps=2, clip_eps=0.05)

    def fresh():
        policy = g.Policy(1, 16, 32, rngs=nnx.Rngs(0))
        return policy, nnx.Optimizer(policy, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def by_hand(policy, optimizer):
        rollout, _ = g.rollout_groups(policy, policy, strips, jax.random.key(1), config)
        (_, first), grads = nnx.value_and_grad(g.grpo_loss, has_aux=True)(policy, strips, rollout, config)
        optimizer.update(policy, grads)
        return first, g.grpo_loss(policy, strips, rollout, config)[1]

    first, second = by_hand(*fresh())
    policy, optimizer = fresh()
    reported = nnx.jit(g.grpo_update, static_argnums=5)(policy, optimizer, policy, strips, jax.random.key(1), config)
    assert float(first["outside_frac"]) == 0.0 and float(second["outside_frac"]) > 0
    for name in ("clip_frac", "outside_frac"):
        assert float(reported[name]) == pytest.approx(float(second[name]), abs=1e-6)


@pytest.mark.unit
def test_mu_1_keeps_the_ratio_at_1_and_the_clip_acts_from_the_second_step():
    """μ = 1: every ratio is 1, so clip_frac = outside_frac = 0 even with ε = 1e-3 (the clip cannot act: the
    update is a plain policy gradient). μ = 3: the later steps see ratios outside [1 − ε, 1 + ε] (ε = 0.05), the clip
    binds for some tokens and the parameters differ from the unclipped update's, and from μ = 1's. Catches: a
    ratio taken against anything but the rollout policy's own log-probabilities (for instance π_ref's), a
    surrogate without the clip, clip_frac or outside_frac not measured on the steps that ran."""
    one_clip, one_metrics = _after_one_update(1, 1e-3)
    assert one_metrics["clip_frac"] == 0.0 and one_metrics["outside_frac"] == 0.0
    assert 0 < one_metrics["zero_signal"] < 1  # some groups carry signal: the update does move the policy
    three_clip, three_metrics = _after_one_update(3, 0.05)
    three_free, free_metrics = _after_one_update(3, 1e6)
    assert three_metrics["clip_frac"] > 0 and three_metrics["outside_frac"] >= three_metrics["clip_frac"]
    assert free_metrics["clip_frac"] == 0.0 and free_metrics["outside_frac"] == 0.0
    assert max(np.abs(a - b).max() for a, b in zip(three_clip, three_free)) > 1e-4
    assert max(np.abs(a - b).max() for a, b in zip(three_clip, one_clip)) > 1e-4


@pytest.mark.unit
def test_train_block_refreshes_the_reference_after_every_multiple_of_r_only():
    """train_block with --ref-refresh 4 over 6 iterations, as three blocks of 2 (step0 = 0, 2, 4; one compiled
    program): π_ref ends as the policy after iteration 4, the state the second block returned, and not the policy
    after 2 or 6. The same blocks with --ref-refresh 0 leave π_ref the initial policy, exactly. Catches: refreshing
    after every iteration (π_ref = the policy after 6), never refreshing, an off-by-one (after iterations 1 and 5),
    a refresh count that restarts in every block (a block of 2 never reaches 4: no refresh), a frozen reference
    that moves."""
    data = bundled_data()
    x, y = jnp.asarray(data.x_train[:512]), jnp.asarray(data.y_train[:512])
    policy = g.Policy(1, 8, 16, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(policy, optax.adam(1e-2), wrt=nnx.Param)
    graphdef, state = nnx.split(g.TrainState(policy, optimizer))
    policy_def, initial = nnx.graphdef(policy), state["policy"]
    keys = jax.random.split(jax.random.key(0), 6)
    config = grpo_config(batch_size=8, group_size=4, ref_refresh=4)
    draw_keys, keys = jax.vmap(jax.random.split, out_axes=1)(keys)  # as train() splits a block's keys
    prompts = jax.vmap(partial(g.draw_prompts, n_images=512, n_prompts=8, n_slots=1))(draw_keys)
    inputs = [(keys[i : i + 2], jax.tree.map(lambda a, i=i: a[i : i + 2], prompts)) for i in (0, 2, 4)]
    run = jax.jit(partial(g.train_block, graphdef, policy_def, config))
    after2, ref2, _ = run(state, initial, 0, x, y, *inputs[0])
    after4, ref4, _ = run(after2, ref2, 2, x, y, *inputs[1])
    after6, ref, _ = run(after4, ref4, 4, x, y, *inputs[2])
    frozen = jax.jit(partial(g.train_block, graphdef, policy_def, replace(config, ref_refresh=0)))
    frozen_state, frozen_ref = state, initial
    for step0, block in zip((0, 2, 4), inputs):
        frozen_state, frozen_ref, _ = frozen(frozen_state, frozen_ref, step0, x, y, *block)
    assert same_params(frozen_ref, initial)  # --ref-refresh 0: π_ref never moves
    assert same_params(ref2, initial)  # --ref-refresh 4: no refresh in iterations 1-2 ...
    assert same_params(ref, after4["policy"])  # ... π_ref is the policy after iteration 4 ...
    assert not same_params(ref, after6["policy"]) and not same_params(ref, after2["policy"])  # ... not after 6, nor 2
    assert not same_params(after4["policy"], initial) and not same_params(after6["policy"], after4["policy"])


@pytest.fixture(scope="module")
def digit_main(tmp_path_factory):
    """main() in this process on the --task digit smoke flags (seed 0), made once for the tests that read it:
    (its args, its metrics, what train() returned to it: policy, π_ref, history, timings)."""
    out = tmp_path_factory.mktemp("digit_main") / "out"
    args = g.parse_args([*SMOKE_FLAGS["digit"], *TINY_FLAGS, "--out", str(out)])
    returned = []

    def recorded_train(args, data):
        returned.append(real_train(args, data))
        return returned[-1]

    real_train = g.train
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "train", recorded_train)
        metrics = g.main(args)
    assert len(returned) == 1
    return args, metrics, returned[0]


@pytest.mark.unit
def test_the_reference_stays_the_initial_policy_by_default(digit_main):
    """--task digit (no SFT, --ref-refresh 0 by default) at β = 0 with the smoke run's tiny flags: after
    train() (as main() called it, in the shared digit_main run), the returned π_ref holds the initial weights
    exactly, while the policy moved; kl_ref is 0 in the first row and > 0 at the end (measured 0.007). With β > 0
    π_ref must stay too: the post-SFT test below. Catches: refreshing π_ref during RL (always, or every block), a
    reference built with its own weights."""
    args, _, (policy, reference, history, _) = digit_main
    assert (args.sft_steps, args.beta, args.ref_refresh) == (-1, 0.0, 0) and g.sft_steps_for(args) == 0
    initial = g.Policy(1, args.hidden_size, args.decoder_size, rngs=nnx.Rngs(g.run_keys(args.seed).init))
    assert same_params(reference, initial)
    assert not same_params(policy, initial)
    assert history[0]["phase"] == "start" and history[0]["val_kl_ref"] == 0.0
    assert history[-1]["val_kl_ref"] > 1e-4


@pytest.mark.unit
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_run_keys_differ_from_every_key_of_the_initial_weights(seed):
    """The training, validation and test keys of run_keys(seed) differ from each other and from every key that
    nnx.Rngs(init) hands the initializers (all the Policy's draws, and as many again), and from the first blocks'
    keys derived from the training key. nnx.Rngs draws fold_in(init, n), and split(k)[i] == fold_in(k, i) with
    jax_threefry_partitionable on (the default), so keys split from key(seed) while the weights come from
    nnx.Rngs(seed) repeat them: the training key would be the
    encoder kernel's. Catches (tried): init = key(seed) with the other three split from it (train() then samples
    with the encoder's key), the test key fold_in(key(seed), 2) beside nnx.Rngs(seed), init equal to the train key."""
    keys = g.run_keys(seed)
    rngs = nnx.Rngs(keys.init)
    g.Policy(4, 8, 16, rngs=rngs)
    drawn = int(rngs.default.count[...])
    assert drawn >= 2  # the initializers drew keys from it
    again = nnx.Rngs(keys.init)
    init_keys = [again() for _ in range(2 * drawn)]  # nnx.Rngs(init) hands out the same keys in the same order
    block_key = keys.train
    run = [keys.train, keys.val, keys.test]
    for _ in range(4):  # train(): key, block_key = split(key) before every block
        block_key, one_block = jax.random.split(block_key)
        run.append(one_block)
    data = {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in run}
    assert len(data) == len(run)
    assert not data & {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in init_keys}


@pytest.mark.unit
def test_the_reference_is_the_policy_after_sft(cli_run):
    """--task number with 2 SFT steps then RL: π_ref is the post-SFT policy. The last SFT row of the history was
    scored (on the fixed validation prompts, with train()'s evaluation key) for the post-SFT policy against the
    initial one; scoring the returned π_ref against the initial policy the same way must give that row exactly.
    kl_ref is 0 in the first row. Catches: π_ref left at the initial policy (no copy when RL starts; the KL of
    the two would be 0), refreshed during RL (the final policy), or copied before the SFT steps. The flags are the
    --task number smoke run's (β = 0.1), and train() is the one main() called in that run (cli_run, shared)."""
    cli_run("number")
    args, (_, reference, history, _) = cli_run.trained["number"]
    assert (args.sft_steps, args.beta, args.learning_rate) == (2, 0.1, 1e-2)
    data, n_slots = bundled_data(), g.slots_for(args)
    assert history[0]["val_kl_ref"] == 0.0
    last_sft = [row for row in history if row["phase"] == "sft"][-1]
    assert last_sft["val_kl_ref"] > 1e-3  # SFT moved the policy away from the initial one
    initial = g.Policy(n_slots, args.hidden_size, args.decoder_size, rngs=nnx.Rngs(g.run_keys(args.seed).init))
    eval_key = g.run_keys(args.seed).val  # train(): the same validation key at every score
    score = jax.jit(partial(g.evaluate, nnx.graphdef(initial)), static_argnums=4)
    val = g.fixed_strips(data.x_val, data.y_val, n_slots)
    with jax.set_mesh(g.make_mesh(args, jax.devices())):  # scored as train() scores, on the mesh
        raw = score(nnx.state(reference), g.place(nnx.state(initial), args.rules), val, eval_key, args.eval_samples)
    again = g.scores(raw, args.eval_samples, args.pass_k, "val_")
    assert again == {key: last_sft[key] for key in again}


# ------------------------------------------------------------------ unit: the causal model and its sampler
@pytest.mark.unit
def test_policy_is_causal():
    """Logits at position t depend on the prompt and tokens[:, :t] only. Changing tokens 1 and 2 leaves
    positions 0 and 1 unchanged; changing token 0 changes positions 1 and 2, not 0. Catches: a mask that lets
    position t see its own token (tril with k = 0) or later ones, or one that hides the earlier tokens."""
    policy = g.Policy(3, 8, 16, rngs=nnx.Rngs(0))
    prompt = jax.random.normal(jax.random.key(0), (2, 16))  # the prompt's share W_x·x, (S, decoder_size)
    tokens = jnp.array([[1, 2, 3], [4, EOS, 5]])
    base = np.asarray(policy(prompt, tokens))
    later = np.asarray(policy(prompt, tokens.at[:, 1:].set(jnp.array([[9, 9], [0, 7]]))))
    np.testing.assert_array_equal(later[:, :2], base[:, :2])
    assert np.abs(later[:, 2] - base[:, 2]).max() > 1e-4  # position 2 sees token 1
    first = np.asarray(policy(prompt, tokens.at[:, 0].set(jnp.array([8, 0]))))
    np.testing.assert_array_equal(first[:, 0], base[:, 0])
    assert np.abs(first[:, 1] - base[:, 1]).min(axis=-1).max() > 0 and np.abs(first[:, 1:] - base[:, 1:]).max() > 1e-4


@pytest.mark.unit
def test_the_prompt_share_is_the_first_layer_on_the_whole_input():
    """encode gives W_x·x once per prompt; __call__ adds W_y·y_<t + W_t·t + b at each position. Together they equal
    one Linear layer on the concatenated input [x, the one-hot tokens before t, a one-hot of t], the decoder's
    kernel as it is stored; and the logits at positions `at` are those rows of the logits at every position.
    Catches: W_x taken from the wrong rows of the kernel (the answer's rows, or an offset), the bias added twice
    or not at all, a position one-hot that is not t's, rows of `at` that are not the positions asked for."""
    policy = g.Policy(3, 8, 16, rngs=nnx.Rngs(4))
    policy.decoder.bias[...] = jax.random.normal(jax.random.key(5), (16,))
    images = jax.random.uniform(jax.random.key(6), (2, 3, 784))
    slots = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    tokens = jnp.array([[1, 2, EOS], [4, EOS, 5]])
    features = (nnx.relu(policy.encoder(images)) * slots[..., None]).reshape(2, -1)  # x, (2, 3 · 8)
    before = np.tril(np.ones((3, 3)), k=-1)
    seen = before[None, :, :, None] * np.asarray(jax.nn.one_hot(tokens, g.VOCAB))[:, None]  # (2, 3, 3, 11)
    whole = np.concatenate(
        [
            np.broadcast_to(np.asarray(features)[:, None], (2, 3, 24)),
            seen.reshape(2, 3, -1),
            np.broadcast_to(np.eye(3), (2, 3, 3)),
        ],
        axis=-1,
    )  # (2, 3, 24 + 33 + 3): the decoder's 60 inputs at each position
    hidden = np.maximum(whole @ np.asarray(policy.decoder.kernel[...]) + np.asarray(policy.decoder.bias[...]), 0)
    expected = hidden @ np.asarray(policy.head.kernel[...]) + np.asarray(policy.head.bias[...])
    prompt = policy.encode(images, slots)
    assert prompt.shape == (2, 16)
    logits = np.asarray(policy(prompt, tokens))
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    for at in ([2], [1, 0]):
        np.testing.assert_allclose(np.asarray(policy(prompt, tokens, at=jnp.array(at))), logits[:, at], atol=1e-6)


@pytest.mark.unit
def test_greedy_generation_is_the_argmax_of_teacher_forced_logits():
    """generate(greedy=True) fills token t with the argmax of the logits at position t given the tokens it chose
    before; teacher-forcing its own answer must reproduce every choice. Catches: reading the logits of another
    position in the scan, writing the token to the wrong slot, sampling when greedy is asked."""
    policy = g.Policy(4, 8, 16, rngs=nnx.Rngs(1))
    policy.head.kernel[...] = 5 * policy.head.kernel[...]  # peaked logits: the argmax depends on the context
    prompt = jax.random.normal(jax.random.key(0), (64, 16))
    tokens = g.generate(policy, prompt, jax.random.key(1), greedy=True)
    np.testing.assert_array_equal(jnp.argmax(policy(prompt, tokens), -1), tokens)
    assert len(np.unique(np.asarray(tokens)[:, 1:])) > 2  # not one constant answer


@pytest.mark.unit
def test_sampled_first_tokens_follow_the_softmax():
    """20,000 answers to one prompt (fixed key): the frequency of each first token is within 4 standard errors
    (√(p(1 − p)/n) ≤ 0.0036) of softmax(logits at position 0), and later tokens are sampled too (not all EOS).
    Catches: greedy decoding in place of sampling, a temperature other than 1, logits of the wrong position."""
    policy = g.Policy(2, 8, 16, rngs=nnx.Rngs(2))
    policy.head.bias[...] = jnp.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0, 0.3, 1.2])
    n = 20_000
    prompt = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (1, 16)), (n, 16))
    tokens = np.asarray(g.generate(policy, prompt, jax.random.key(3)))
    p = np.asarray(jax.nn.softmax(policy(prompt[:1], jnp.asarray(tokens[:1]))[0, 0]))
    freq = np.bincount(tokens[:, 0], minlength=g.VOCAB) / n
    np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(p * (1 - p) / n).max())
    assert p.max() > 0.25 and len(np.unique(tokens[:, 1])) == g.VOCAB


# ------------------------------------------------------------------ unit: pass@k
@pytest.mark.unit
def test_pass_at_k_hand_values():
    """n = 4 samples per prompt, c = 0, 1, 4 right. pass@k = 1 − C(n − c, k) / C(n, k):
      k = 1: c/n = 0, 1/4, 1 (mean 5/12);  k = 2: C(4, 2) = 6: 1 − 6/6 = 0, 1 − 3/6 = 1/2, 1 − 0/6 = 1 (mean 1/2);
      k = 4: 0, 1, 1.
    Catches: the biased 1 − (1 − c/n)^k (k = 2, c = 1 gives 7/16), C(n − c, k) / C(n, k) without the 1 −, k and n
    swapped."""
    assert g.pass_at_k(4, [0], 1) == 0.0 and g.pass_at_k(4, [1], 1) == 0.25 and g.pass_at_k(4, [4], 1) == 1.0
    assert g.pass_at_k(4, [0, 1, 4], 1) == pytest.approx(5 / 12)
    assert g.pass_at_k(4, [0], 2) == 0.0 and g.pass_at_k(4, [1], 2) == pytest.approx(0.5)
    assert g.pass_at_k(4, [4], 2) == 1.0 and g.pass_at_k(4, [0, 1, 4], 2) == pytest.approx(0.5)
    assert g.pass_at_k(4, [1], 4) == 1.0 and g.pass_at_k(4, np.array([0, 1]), 4) == 0.5


@pytest.mark.unit
def test_progress_line_with_pass_k_1(capsys):
    """--pass-k 1 is a valid flag (pass@1 twice); the progress line must still print. Catches: a progress line
    that assumes k ≠ 1."""
    raw = {"correct": np.array([1, 3]), "greedy": 0.5, "length": 1.0, "wrong_length": 1.0, "kl_ref": 0.0}
    row = {"phase": "start", "iteration": 0, **g.scores(raw, 4, 1, "val_")}
    assert row["val_pass1"] == 0.5
    g.print_progress(row)
    assert "val_pass1=0.5000" in capsys.readouterr().out


# ------------------------------------------------------------------ unit: prompts
@pytest.mark.unit
def test_fixed_strips_are_fixed_use_their_split_and_are_the_images_with_n_1():
    """The validation / test prompts: the same on every call (they take no seed; --seed 0 and 5 load the same
    validation images), each strip opens with image i, its other images and the targets come from the split given
    (a split of 100 distinct images: every filled slot is one of them, with its label), lengths 1..N, empty slots
    zero with EOS in the target. With N = 1 they are the images, in order. Catches: an unseeded shuffle,
    slots drawn from another array, a target not in step with its images, empty slots left with pixels."""
    x = np.random.default_rng(0).random((100, 784)).astype(np.float32)
    y = np.arange(100) % 10
    a, b = g.fixed_strips(x, y, 4), g.fixed_strips(x, y, 4)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    images, slots, target = (np.asarray(t) for t in a)
    lengths = slots.sum(axis=1).astype(int)
    assert lengths.min() == 1 and lengths.max() == 4 and len(set(lengths)) == 4
    np.testing.assert_array_equal(images[:, 0], x)  # strip i opens with image i
    rows = {r.tobytes(): i for i, r in enumerate(x)}
    for strip, n, digits in zip(images, lengths, target):
        used = [rows[img.tobytes()] for img in strip[:n]]  # KeyError: an image from elsewhere
        np.testing.assert_array_equal(digits[:n], y[used])
        assert (strip[n:] == 0).all() and (digits[n:] == EOS).all()
    one = g.fixed_strips(x, y, 1)
    np.testing.assert_array_equal(one.images[:, 0], x)
    np.testing.assert_array_equal(one.target[:, 0], y)
    assert (np.asarray(one.slots) == 1).all()
    data0, data5 = g.load_data(g.Args(seed=0)), g.load_data(g.Args(seed=5))
    np.testing.assert_array_equal(data0.x_val, data5.x_val)


@pytest.mark.unit
def test_training_strips_have_lengths_1_to_n_and_eos_after_the_digits():
    """draw_prompts + make_strips: 2,000 strips of N = 3 slots from 50 labelled images. Every length 1..3 occurs,
    each about a third; filled slots hold images of the pool with their labels as the target digits; empty slots are
    zero images, 0 in `slots` and EOS in the target. Catches: lengths 0..N − 1 or always N, EOS before the end of the
    digits, targets out of step with the images."""
    x = jnp.asarray(np.random.default_rng(1).random((50, 784)).astype(np.float32))
    y = jnp.arange(50) % 10
    idx, lengths = jax.jit(g.draw_prompts, static_argnums=(1, 2, 3))(jax.random.key(0), 50, 2000, 3)
    strips = jax.jit(g.make_strips)(x, y, idx, lengths)  # as train_block looks the prompts' images up
    images, slots, target = (np.asarray(t) for t in strips)
    lengths = slots.sum(axis=1).astype(int)
    np.testing.assert_allclose(np.bincount(lengths, minlength=4)[1:] / 2000, 1 / 3, atol=0.05)
    assert lengths.min() == 1
    np.testing.assert_array_equal(slots, np.arange(3)[None, :] < lengths[:, None])  # filled slots first
    np.testing.assert_array_equal(g.answer_length(strips.target), lengths)
    rows = {r.tobytes(): i for i, r in enumerate(np.asarray(x))}
    for strip, n, digits in zip(images[:200], lengths, target):
        np.testing.assert_array_equal(digits[:n], np.asarray(y)[[rows[img.tobytes()] for img in strip[:n]]])
        assert (strip[n:] == 0).all() and (digits[n:] == EOS).all()


# ------------------------------------------------------------------ unit: data
@pytest.mark.unit
def test_idx_reader_on_bytes_written_here(tmp_path):
    """load_idx_split on a t10k pair written by hand: the pixels / 255 and the labels, and its one-line errors.
    Catches: a wrong header size or byte order, truncation accepted, another element type or image size accepted,
    labels out of step with the images or outside 0-9, a broken gzip stream or a missing file raising a traceback."""
    image_file, label_file = (tmp_path / name for name in g.IDX_FILES["test"])
    images = np.arange(3 * 28 * 28, dtype=np.uint32).astype(np.uint8).reshape(3, 28, 28)
    labels = np.array([7, 2, 1], dtype=np.uint8)

    def read(image_bytes: bytes, label_bytes: bytes = idx_bytes(labels)):
        write_gz(image_file, image_bytes)
        write_gz(label_file, label_bytes)
        return g.load_idx_split(str(tmp_path), "test")

    x, y = read(idx_bytes(images))
    np.testing.assert_array_equal(x, images.reshape(3, 784).astype(np.float32) / 255.0)
    np.testing.assert_array_equal(y, labels)
    assert x.dtype == np.float32 and y.dtype == np.int32
    bad = {
        "payload truncated": (idx_bytes(images)[:-10], idx_bytes(labels)),
        "float type code": (b"\x00\x00\x0d\x03" + idx_bytes(images)[4:], idx_bytes(labels)),
        "27 × 27 images": (idx_bytes(images[:, :27, :27]), idx_bytes(labels)),
        "two labels for three images": (idx_bytes(images), idx_bytes(labels[:2])),
    }
    for what, (image_bytes, label_bytes) in bad.items():
        with pytest.raises(g.RunError, match="is truncated or corrupt: not an IDX file of unsigned bytes"):
            read(image_bytes, label_bytes)
            raise AssertionError(f"{what}: accepted")
    with pytest.raises(g.RunError, match=r"labels must be digits 0-9, found 10"):
        read(idx_bytes(images), idx_bytes(np.array([7, 10, 1], dtype=np.uint8)))
    read(idx_bytes(images))
    whole = image_file.read_bytes()
    image_file.write_bytes(whole[: len(whole) // 2])  # the gzip stream itself cut short
    with pytest.raises(g.RunError, match="t10k-images-idx3-ubyte.gz is not a complete gzip file"):
        g.load_idx_split(str(tmp_path), "test")
    image_file.unlink()
    with pytest.raises(g.RunError, match="t10k-images-idx3-ubyte.gz not found"):
        g.load_idx_split(str(tmp_path), "test")


@pytest.mark.unit
def test_bundled_digits_are_the_official_mnist_test_set():
    """The two bundled files are the official t10k pair (MD5, the class counts); the default split is
    7,200 train / 800 validation / 2,000 test. Catches: a re-encoded or partial copy, a changed default split."""
    md5 = {
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }
    for name, digest in md5.items():
        assert hashlib.md5((REAL_MNIST / name).read_bytes()).hexdigest() == digest
    x, y = g.load_idx_split(str(REAL_MNIST), "test")
    assert x.shape == (10_000, 784) and x.dtype == np.float32 and 0 <= x.min() and x.max() == 1.0
    assert np.bincount(y).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    data = bundled_data()
    assert (len(data.y_train), len(data.y_val), len(data.y_test)) == (7200, 800, 2000)


FULL = load_script("tools/grpo_full_mnist.py")


@pytest.mark.unit
def test_the_full_mnist_tool_writes_what_data_dir_reads_under_tfds_mock_data(tmp_path):
    """tools/grpo_full_mnist.py under tfds.testing.mock_data (no files, no network) writes the four IDX files, and
    --data-dir reads them as the official splits: exactly the pixels / 255 and the labels tfds holds, in its order,
    the test split whole, validation carved from train. Catches: a wrong scale (/ 256, no scaling), transposed or
    flipped images, a shuffled order, labels out of step with images, the two splits swapped, a folder of four
    files read as the bundled t10k pair and split again."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=24):
        FULL.main(["--out", str(tmp_path / "full"), "--no-download"])
        examples = {}
        for split in ("train", "test"):
            source = tfds.data_source("mnist", split=split, download=False)
            examples[split] = [source[i] for i in range(len(source))]
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == sorted(
        FULL.IDX_FILES["train"] + g.IDX_FILES["test"]
    )
    assert FULL.IDX_FILES == g.IDX_FILES
    data = g.load_data(g.Args(data_dir=str(tmp_path / "full")))
    images = np.stack([np.asarray(ex["image"]) for ex in examples["test"]])  # (24, 28, 28, 1) uint8
    assert images.shape == (24, 28, 28, 1) and images.std() > 0  # random mock pixels, not a constant
    expected = np.array([[px / 255.0 for px in img[..., 0].ravel()] for img in images], dtype=np.float32)
    assert data.x_test.dtype == np.float32 and data.y_test.dtype == np.int32
    np.testing.assert_array_equal(data.x_test, expected)
    np.testing.assert_array_equal(data.y_test, [int(ex["label"]) for ex in examples["test"]])
    train = np.stack([np.asarray(ex["image"])[..., 0].ravel() / 255.0 for ex in examples["train"]]).astype(np.float32)
    assert len(data.y_train) + len(data.y_val) == 24 and data.source.startswith(f"IDX files in {tmp_path / 'full'}")
    rows = {r.tobytes(): i for i, r in enumerate(train)}
    assert sorted(rows[r.tobytes()] for r in np.concatenate([data.x_train, data.x_val])) == list(range(24))


@contextlib.contextmanager
def serve_folder(folder):
    """An HTTP server on 127.0.0.1 that serves `folder`; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.unit
def test_tfds_checksum_list_names_the_four_idx_files_and_matches_the_bundled_ones():
    """The tool's tfds_idx_files reads tfds's checksum list; its SHA-256 of the t10k pair matches the bundled files.
    Catches: a misparsed checksum line (columns swapped), a bundled file that is not the official one."""
    pytest.importorskip("tensorflow_datasets")
    for name in ("mnist", "fashion_mnist"):
        files = FULL.tfds_idx_files(name)
        assert sorted(files) == sorted(g.IDX_FILES["train"] + g.IDX_FILES["test"])
        assert all(url.endswith(fname) and len(sha) == 64 for fname, (url, sha) in files.items())
    files = FULL.tfds_idx_files("mnist")
    for name in g.IDX_FILES["test"]:
        assert FULL.sha256_of(str(REAL_MNIST / name)) == files[name][1]


@pytest.mark.unit
def test_the_full_mnist_tool_fetches_checked_idx_files_when_tfds_cannot(tmp_path, monkeypatch, capsys):
    """When tfds cannot prepare the data, the tool fetches the four IDX files (from a local server here), checked
    against their SHA-256, and --data-dir reads them; --no-download keeps tfds's error; a mismatching file is refused
    and not kept; no server: one line. Catches: no fallback, no checksum check, a half-written file under the real
    name, a download with --no-download."""
    served = synthetic_digits(tmp_path / "served", n_train=40, n_test=30)
    with serve_folder(served) as base:
        table = {f: (base + f, FULL.sha256_of(str(served / f))) for f in g.IDX_FILES["train"] + g.IDX_FILES["test"]}
        monkeypatch.setattr(FULL, "tfds_idx_files", lambda name: table)

        def tfds_fails(name, folder, download):  # what tfds does without TensorFlow: it cannot prepare
            raise FULL.FetchError("tfds needs TensorFlow to prepare")

        monkeypatch.setattr(FULL, "from_tfds", tfds_fails)
        FULL.main(["--out", str(tmp_path / "full")])
        data = g.load_data(g.Args(data_dir=str(tmp_path / "full")))
        assert data.x_train.shape == (36, 784) and data.x_val.shape == (4, 784) and data.x_test.shape == (30, 784)
        assert sorted(p.name for p in (tmp_path / "full").iterdir()) == sorted(table)

        with pytest.raises(SystemExit, match="^error: tfds needs TensorFlow"):  # --no-download: tfds's error
            FULL.main(["--out", str(tmp_path / "nodl"), "--no-download"])
        assert not list((tmp_path / "nodl").iterdir())

        first = table["t10k-labels-idx1-ubyte.gz"]
        table["t10k-labels-idx1-ubyte.gz"] = (first[0], "0" * 64)  # a file that does not match its checksum
        with pytest.raises(FULL.FetchError, match="SHA-256"):
            FULL.fetch_idx_files("mnist", str(tmp_path / "full"))
        (tmp_path / "other").mkdir()
        with pytest.raises(FULL.FetchError, match="SHA-256"):
            FULL.fetch_idx_files("mnist", str(tmp_path / "other"))
        assert not (tmp_path / "other" / "t10k-labels-idx1-ubyte.gz").exists()

    with pytest.raises(SystemExit, match="^error: could not download"):  # server gone: offline
        FULL.main(["--out", str(tmp_path / "offline")])


@pytest.mark.unit
def test_split_test_set_is_fixed_and_disjoint(tmp_path):
    """--data bundled (here from --data-dir): the held-out test digits and the validation split do not depend on
    --seed and are disjoint from training and from each other. Catches: a split driven by --seed, overlaps."""
    folder = synthetic_digits(tmp_path / "d", n_test=300, splits=("t10k",))
    a = g.load_data(g.Args(data_dir=str(folder), split_test_set=200, seed=0))
    b = g.load_data(g.Args(data_dir=str(folder), split_test_set=200, seed=5))
    assert a.x_test.shape == (100, 784)
    np.testing.assert_array_equal(a.x_test, b.x_test)
    assert a.x_val.shape == (20, 784) and a.x_train.shape == (180, 784)  # 10 % of the 200 for validation
    np.testing.assert_array_equal(a.x_val, b.x_val)
    rows = {r.tobytes() for r in a.x_train}
    assert not any(r.tobytes() in rows for r in a.x_test)
    assert not any(r.tobytes() in rows for r in a.x_val)
    assert not {r.tobytes() for r in a.x_val} & {r.tobytes() for r in a.x_test}


@pytest.mark.unit
def test_validation_sizes(tmp_path):
    """load_data carves round(--val-size · N) of the N training images for validation, at least one, and keeps at
    least one to train on; together they are the training images. Catches: an empty validation split, one that takes
    every training image, images lost or repeated by the carve."""
    folder = synthetic_digits(tmp_path / "d", n_test=60, splits=("t10k",))
    sizes = {}
    for split_test_set, val_size in ((50, 0.1), (2, 0.01), (2, 0.5), (3, 0.5)):
        data = g.load_data(g.Args(data_dir=str(folder), split_test_set=split_test_set, val_size=val_size))
        sizes[split_test_set, val_size] = (len(data.y_train), len(data.y_val))
        rows = sorted(r.tobytes() for r in np.concatenate([data.x_train, data.x_val]))
        assert len(set(rows)) == split_test_set and not set(rows) & {r.tobytes() for r in data.x_test}
    assert sizes == {(50, 0.1): (45, 5), (2, 0.01): (1, 1), (2, 0.5): (1, 1), (3, 0.5): (1, 2)}
    with pytest.raises(g.RunError, match="need at least 2 training images"):
        g.load_data(g.Args(data_dir=str(folder), split_test_set=1))


@pytest.fixture(scope="module")
def seed_1_without_test(tmp_path_factory):
    """main() in this process on the --task digit smoke flags with --seed 1 --no-score-test, made once for the tests
    that read it, watched: train() must get no test images, and score_split must not be called (a training run
    scores no other split with it); either fails the run. Returns (its metrics, its --out folder)."""

    def no_test_scoring(*a, **k):
        raise AssertionError("score_split called with --no-score-test")

    real_train = g.train

    def train_without_test_images(args, data):
        assert data.x_test is None and data.y_test is None
        return real_train(args, data)

    out = tmp_path_factory.mktemp("seed_1") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(g, "score_split", no_test_scoring)
        mp.setattr(g, "train", train_without_test_images)
        result = g.main(
            g.parse_args([*SMOKE_FLAGS["digit"], *TINY_FLAGS, "--seed", "1", "--no-score-test", "--out", str(out)])
        )
    return result, out


@pytest.mark.unit
def test_no_score_test_leaves_the_test_set_unread(seed_1_without_test):
    """--no-score-test (the shared seed_1_without_test run): training never sees test images (they are dropped
    before training), the test scorer is never called, and metrics.json holds no test number. Catches: scoring the
    test set anyway, writing a test_* key, or passing the test images on to training."""
    result, out = seed_1_without_test
    saved = json.loads((out / "latest" / "metrics.json").read_text())
    for metrics in (result, saved):
        assert not [k for k in metrics if k.startswith("test")]
        assert not [k for row in metrics["history"] for k in row if k.startswith("test")]
        assert "val_pass1" in metrics and metrics["args"]["score_test"] is False


def load_sweep_tool():
    """tools/grpo_val_sweep.py as a module (it imports tools/seeds.py and tools/results.py from beside it)."""
    spec = importlib.util.spec_from_file_location("grpo_val_sweep", REPO / "tools" / "grpo_val_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    return sweep


@pytest.mark.unit
def test_the_validation_sweep_never_scores_the_test_set(tmp_path, monkeypatch):
    """Every run of tools/grpo_val_sweep.py (tools/seeds.py replaced by a recorder here) passes --no-score-test and
    no --score-test to the script, and is scored on val_pass1. Catches: a sweep configuration without
    --no-score-test, choices made on another metric."""
    sweep = load_sweep_tool()
    calls = []

    def fake_seeds_main(argv):
        calls.append(argv)
        return {"mean": 0.5, "min": 0.5, "per_seed": {"0": 0.5}, "median_seconds": 1.0, "seconds_per_seed": {"0": 1.0}}

    monkeypatch.setattr(sweep.seeds, "main", fake_seeds_main)
    sweep.main(["--task", "digit", "--seeds", "0", "--out", str(tmp_path / "o"), "--results-dir", str(tmp_path)])
    assert len(calls) >= 2 * sweep.BUDGET  # GRPO's candidates and as many supervised ones
    for argv in calls:
        flags = argv[argv.index("--") + 1 :]
        assert "--no-score-test" in flags and "--score-test" not in flags
        assert argv[argv.index("--metric") + 1] == "val_pass1"


def fake_figure_run(zero_signal: float, all_right: float) -> dict:
    """A metrics.json as grpo_mnist.py writes it, small: start, one SFT row, two RL rows."""
    row = {"val_pass1": 0.5, "val_pass8": 0.7, "val_greedy": 0.6, "val_length": 3.0, "val_wrong_length": 3.5}
    row["val_kl_ref"] = 0.1
    rl = {**row, "zero_signal": zero_signal, "all_right": all_right, "clip_frac": 0.01, "outside_frac": 0.02}
    history = [{"phase": "start", "iteration": 0, **row}, {"phase": "sft", "iteration": 300, **row}]
    history += [{"phase": "rl", "iteration": i, **rl} for i in (150, 300)]
    args = {"group_size": 8, "inner_steps": 4, "beta": 0.01, "kl": "k3", "loss_agg": "seq-mean-token-mean"}
    args.update(learning_rate=5e-4, iterations=300, label_fraction=0.05)
    return {**history[-1], "history": history, "args": args, "val_prompts": 800, "sft_steps": 300}


@pytest.mark.unit
def test_the_figures_tool_draws_every_figure_and_splits_the_equal_groups(tmp_path, capsys, monkeypatch):
    """tools/grpo_figures.py's drawing and report on fake runs: the four PNGs are written, the sharpening figure's
    score panel draws the same lines as the script's own learning curve (its first panel), and the report splits each
    zero-signal share into its all-right and all-wrong parts (here 0.25 and 0.5 of 0.75). Catches: a figure that
    needs a metric the script does not log, a run the figures name but RUNS lacks, a tool that draws the script's
    score panel another way, the all-right split dropped from the report."""
    from matplotlib.figure import Figure

    figures = load_script("tools/grpo_figures.py")
    runs = {name: fake_figure_run(0.75, 0.25) for name in figures.RUNS}
    for draw in (figures.sharpening, figures.kl_curves, figures.length_curves, figures.zero_signal):
        draw(runs, tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(
        ["grpo_sharpening.png", "grpo_kl.png", "grpo_loss_agg.png", "grpo_zero_signal.png"]
    )
    drawn, history = [], runs["default"]["history"]
    monkeypatch.setattr(Figure, "savefig", lambda fig, *args, **kwargs: drawn.append(fig))
    g.plot_curve(str(tmp_path / "curve.png"), history, 8, {}, "a run")
    tool = Figure().subplots()
    figures.plot_scores(tool, history, 8)

    def lines(ax):
        return [(line.get_label(), line.get_xydata().tolist()) for line in ax.lines if "validation" in line.get_label()]

    assert lines(tool) == lines(drawn[0].axes[0]) and len(lines(tool)) == 3
    figures.report(runs)
    text = capsys.readouterr().out
    assert "default run: zero_signal 0.7500 (all right 0.2500, all wrong 0.5000) in the first RL block" in text


# ------------------------------------------------------------------ unit: the peer checks' results files
TUNIX = load_script("benchmarks/peers/tunix_grpo_loss.py")  # needs no Tunix until its Tunix side is called


TUNIX_CASE_NAMES = {case.name: case for case in TUNIX.cases()}
TUNIX_SPOT_CHECKS = [
    TUNIX.Case("ragged", "std", "β=0", "seq-mean-token-mean"),
    TUNIX.Case("ragged", "std", "β=0", "token-mean"),
    TUNIX.Case("ragged", "std", "β=0", "dr-grpo"),
    TUNIX.Case("ragged", "none", "k1", "seq-mean-token-mean"),
    TUNIX.Case("dropped", "std", "k3", "token-mean"),
    TUNIX.Case("dropped", "none", "k3", "dr-grpo"),
]


def results_lines(name: str) -> list[str]:
    """The output lines of benchmarks/results/NAME.txt (after its header line and the blank line)."""
    return (REPO / "benchmarks" / "results" / f"{name}.txt").read_text(encoding="utf-8").splitlines()[2:]


@pytest.mark.unit
def test_the_tunix_table_holds_for_the_script_as_it_is():
    """benchmarks/results/tunix_grpo_loss.txt, checked against this script without Tunix: it lists every case of
    the peer script once, in order; in every case the losses, gradients, clip fractions and KL means of the two
    sides differ by at most 1e-6; the course's loss it records is what grpo_loss gives on the same tensors now
    (six cases that cover every aggregation, KL mode, advantage and mask); and the advantages differ per group by
    (sample std + 1e-6) / (population std + --adv-eps), within 0.3 % of √(G/(G−1)). Catches: a results file made
    from another grpo_loss (a changed aggregation, KL sign or mask), a case left out, a row that disagrees."""
    lines = results_lines("tunix_grpo_loss")
    rows = {line[:42].rstrip(): line[42:].split() for line in lines if line[:42].rstrip() in TUNIX_CASE_NAMES}
    assert list(rows) == list(TUNIX_CASE_NAMES)
    for cells in rows.values():
        diffs = [float(c) for i, c in enumerate(cells) if i in (1, 2, 4, 5) and c != "–"]
        assert max(diffs) <= 1e-6, cells
    t = TUNIX.tensors()
    for case in TUNIX_SPOT_CHECKS:
        np.testing.assert_allclose(TUNIX.course_side(t, case)["loss"], float(rows[case.name][0]), rtol=1e-5)

    rewards, G = TUNIX.REWARDS.astype(np.float64), TUNIX.G
    expected = (rewards.std(axis=1, ddof=1) + 1e-6) / (rewards.std(axis=1) + g.Args().adv_eps)
    start = next(i for i, line in enumerate(lines) if line.startswith("group rewards"))
    for b, line in enumerate(lines[start + 1 : start + 1 + TUNIX.B]):
        if rewards[b].max() == rewards[b].min():
            assert "both 0 (all equal)" in line and float(line.split()[-1]) == 0.0
            continue
        low, high = (float(v) for v in re.search(r"(\d\.\d+)…(\d\.\d+)", line).groups())
        assert low == pytest.approx(expected[b], abs=1.5e-4) and high == pytest.approx(expected[b], abs=1.5e-4)
        assert abs(expected[b] - np.sqrt(G / (G - 1))) < 3e-3 * np.sqrt(G / (G - 1))
        assert float(line.split()[-1]) <= 1e-6  # --adv-norm none against Tunix's drgrpo
    loss_line, std_line, none_line = lines[-3:]  # the summary the module README quotes
    assert all(float(v) <= 1e-6 for v in re.findall(r"(\d\.\de[+-]\d+) in", loss_line))
    low, high = (float(v) for v in re.search(r"(\d\.\d+)…(\d\.\d+) in every group", std_line).groups())
    signal = rewards.max(axis=1) > rewards.min(axis=1)
    assert min(expected[signal]) == pytest.approx(low, abs=1.5e-4)
    assert max(expected[signal]) == pytest.approx(high, abs=1.5e-4)
    assert f"√(G/(G−1)) = {np.sqrt(G / (G - 1)):.4f}" in std_line and "0 on both sides" in none_line


@pytest.mark.unit
def test_tunix_grpo_loss_and_advantages_agree_where_tunix_is_installed():
    """Where google-tunix is installed (benchmarks/peers/requirements_tunix.txt; skipped otherwise): Tunix's
    grpo_loss_fn and this script's grpo_loss agree in loss and gradient in the spot-check cases, and Tunix's drgrpo
    advantages are --adv-norm none's. Catches: a change on either side that the results file has not seen."""
    pytest.importorskip("tunix")
    t = TUNIX.tensors()
    for case in TUNIX_SPOT_CHECKS:
        ours, theirs = TUNIX.course_side(t, case), TUNIX.tunix_side(t, case)
        np.testing.assert_allclose(ours["loss"], theirs["loss"], atol=1e-6)
        np.testing.assert_allclose(ours["grad"], theirs["grad"], atol=1e-6)
    np.testing.assert_allclose(TUNIX.advantages("none"), TUNIX.tunix_advantages()["drgrpo"], atol=1e-6)


@pytest.mark.unit
def test_the_adv_norm_measurement_says_what_the_readme_says():
    """benchmarks/results/grpo_adv_norm.txt (tools/grpo_adv_norm.py), its summary, read as module 4's insight 3 reads
    it. On each run's final policy --adv-norm none shrinks the surrogate's gradient (× at most 1/2 for 0/1 rewards)
    and leaves the β·KL term's, so the KL term's share grows (× more than 1.5), and the lopsided groups (1 or G − 1
    right) carry less of Σ|A|. Both runs have a KL term (the tool's --beta 0.01 --kl k3; the default has none). The
    run with --adv-norm none ends closer to π_ref and lower in pass@1, with more groups with signal (a lower
    zero_signal) and, on this seed, a lower clip_frac. Catches: a re-measured file (another default, seed or machine)
    whose numbers no longer say what the README says, as the file measured at μ 4 and learning rate 5e-4 (its
    clip_frac was higher with --adv-norm none): then the README's sentence changes with it; a file measured
    without a KL term (β = 0: no KL share to compare)."""
    lines = results_lines("grpo_adv_norm")
    assert "β=0.01, kl k3" in lines[0]  # the KL term insight 3 names: --beta 0.01 --kl k3
    start = next(i for i, line in enumerate(lines) if line.startswith("summary:"))
    header, rows = lines[start + 1], [line.split() for line in lines[start + 2 : start + 4]]
    assert header.split()[:4] == ["run", "KL", "share", "std"]
    assert [r[:2] for r in rows] == [["--adv-norm", "std"], ["--adv-norm", "none"]]
    runs = {}
    for row in rows:
        share_std, share_none, times_share, times_surrogate, lopsided_std, lopsided_none = map(float, row[2:8])
        assert share_none > share_std and times_share > 1.5 and times_surrogate <= 0.5
        assert times_share == pytest.approx(share_none / share_std, rel=0.05)
        assert lopsided_none < lopsided_std
        runs[row[1]] = dict(zip(("pass1", "kl_ref", "clip_frac", "outside_frac", "zero_signal"), map(float, row[8:13])))
    std, none = runs["std"], runs["none"]
    assert none["kl_ref"] < std["kl_ref"] and none["pass1"] < std["pass1"]
    assert none["clip_frac"] < std["clip_frac"] and none["zero_signal"] < std["zero_signal"]


@pytest.mark.unit
def test_the_header_counts_the_policy_and_the_critic_ppo_would_add(capsys):
    """Counted from the layers: encoder 784·H + H; decoder N·(H + 11 + 1)·D + D (the prompt's N·H features, N
    one-hot tokens of 11, N position bits); head D·11 + 11. The critic: the same encoder, N·H·D + D, D + 1. The
    header prints both and the critic's share. Catches: counts of another model, or a critic with the policy's head."""
    data = SimpleNamespace(source="test data")
    for args, n in ((g.Args(task="digit"), 1), (g.Args(task="number", max_digits=4), 4)):  # H = 128, D = 256
        counts = g.print_header(args, data, "a label", g.make_mesh(args, jax.devices()[:1]))
        policy = (784 * 128 + 128) + (n * 140 * 256 + 256) + (256 * 11 + 11)  # 139,659 and 246,923
        critic = (784 * 128 + 128) + (n * 128 * 256 + 256) + (256 + 1)  # 133,889 and 232,065
        assert counts == {"params_policy": policy, "params_critic": critic, "critic_share": critic / (policy + critic)}
        line = capsys.readouterr().out.splitlines()[-1]
        assert line == (
            f"parameters: policy {policy:,}, the only network GRPO trains; PPO's critic V(x) would add {critic:,} "
            f"({critic / (policy + critic):.1%} of policy + critic)"
        )


@pytest.mark.unit
def test_args_are_hashable_and_name_the_batch_axis():
    """The compiled updates take Args as a static argument, so Args is frozen and hashable; batch_axis is the mesh
    axis --rules splits the prompts along. Catches: an Args that a jitted call cannot take, a wrong batch axis."""
    args = g.Args(group_size=4, beta=0.5)
    assert hash(args) == hash(g.Args(group_size=4, beta=0.5)) and args != g.Args(group_size=8, beta=0.5)
    with pytest.raises(AttributeError):
        args.beta = 1.0
    assert [g.Args(rules=r).batch_axis for r in ("dp", "fsdp")] == [
        dict(g.RULE_SETS[r])["batch"] for r in ("dp", "fsdp")
    ]


@pytest.mark.unit
def test_the_checkpoint_round_trips_through_orbax(tmp_path):
    """save_policy writes an orbax checkpoint folder whose metadata names the policy's six arrays; load_policy fills a
    policy with the saved weights, laid out on the mesh. Catches: a checkpoint of another state (Adam's, π_ref's),
    a load that returns fresh weights."""
    policy = g.Policy(2, 8, 16, rngs=nnx.Rngs(3))
    g.save_policy(str(tmp_path / "policy"), nnx.state(policy))
    with ocp.StandardCheckpointer() as checkpointer:
        saved = g.shapes(checkpointer.metadata(str(tmp_path / "policy")).item_metadata.tree)
    assert saved == g.shapes(nnx.state(policy)) and len(saved) == 6 and saved["encoder/kernel/value"][0] == (784, 8)
    args = g.Args(task="number", max_digits=2, hidden_size=8, decoder_size=16, load=str(tmp_path / "policy"))
    loaded = g.load_policy(args, g.make_mesh(args, jax.devices()))
    prompt, tokens = jnp.ones((2, 16)), jnp.array([[1, 2], [3, EOS]])
    np.testing.assert_array_equal(policy(prompt, tokens), loaded(prompt, tokens))


@pytest.mark.unit
def test_a_stop_while_saving_leaves_no_half_written_checkpoint(tmp_path, monkeypatch):
    """A stop inside orbax's save (its temporary folder made, then KeyboardInterrupt) leaves nothing in the folder.
    Catches: orbax's <name>.orbax-checkpoint-tmp-<time> left beside the run's files."""

    def save_then_stop(self, path, state, *args, **kwargs):
        Path(f"{path}.orbax-checkpoint-tmp-1234").mkdir()
        raise KeyboardInterrupt

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        g.save_policy(str(tmp_path / "partial-policy"), nnx.state(g.Policy(1, 4, 8, rngs=nnx.Rngs(0))))
    assert list(tmp_path.iterdir()) == []


def refused(tmp_path, capfd, monkeypatch, path, *flags: str) -> str:
    """main() on `--load path` with the tiny flags: it must stop before any work, with exit status 1 and one line on
    stderr (returned), train nothing and create no folder."""

    def no_work(*a, **k):
        raise AssertionError("a refused --load reached the data or training")

    monkeypatch.setattr(g, "load_data", no_work)
    monkeypatch.setattr(g, "train", no_work)
    out = tmp_path / "refused"
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        g.main(g.parse_args([*SMOKE_FLAGS["number"], *TINY_FLAGS, *flags, "--load", str(path), "--out", str(out)]))
    err = capfd.readouterr().err
    assert e.value.code == 1 and err.startswith(f"error: --load {path}") and err.count("\n") == 1, err
    assert not out.exists()
    return err


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    """A policy/ checkpoint of the tiny --task number flags, as a run saves it (save_policy)."""
    folder = tmp_path_factory.mktemp("saved")
    args = g.parse_args([*SMOKE_FLAGS["number"], *TINY_FLAGS])
    g.save_policy(str(folder / "policy"), nnx.state(g.Policy(3, 16, 32, rngs=nnx.Rngs(0))))
    return args, folder / "policy"


@pytest.mark.unit
@pytest.mark.parametrize("where", ["missing", "empty", "run folder"])
def test_load_refuses_a_path_without_a_checkpoint(tmp_path, capfd, monkeypatch, saved_policy, where):
    """(a) A missing path, an empty folder, a run folder (the checkpoint is one level down): one line.
    Catches: a traceback, or orbax asked to read a folder that holds no checkpoint."""
    path = {"missing": tmp_path / "nowhere", "empty": tmp_path / "empty", "run folder": saved_policy[1].parent}[where]
    (tmp_path / "empty").mkdir()
    assert "holds no checkpoint" in refused(tmp_path, capfd, monkeypatch, path)


@pytest.mark.unit
def test_load_refuses_another_models_checkpoint(tmp_path, capfd, monkeypatch):
    """(b) A checkpoint of another model (here a critic's trunk, other names): one line naming what it holds.
    Catches: names left unchecked (orbax would fail inside its restore, with tracebacks on stderr)."""
    g.save_policy(str(tmp_path / "critic"), nnx.state(nnx.Dict(trunk=nnx.Linear(48, 32, rngs=nnx.Rngs(0)))))
    assert "trunk/kernel/value" in refused(tmp_path, capfd, monkeypatch, tmp_path / "critic")


@pytest.mark.unit
def test_load_refuses_another_shape(tmp_path, capfd, monkeypatch, saved_policy):
    """(c) The checkpoint of --hidden-size 16 loaded with --hidden-size 8: one line naming the array, both shapes
    and the flags that shape it. Catches: shapes left unchecked."""
    err = refused(tmp_path, capfd, monkeypatch, saved_policy[1], "--hidden-size", "8")
    assert "decoder/kernel/value has shape (84, 32), this run needs (60, 32)" in err and "--hidden-size" in err


@pytest.mark.unit
def test_load_refuses_another_dtype(tmp_path, capfd, monkeypatch):
    """(d) The same policy saved in bfloat16: one line naming the dtypes. Catches: a load that casts silently."""
    state = jax.tree.map(lambda a: a.astype(jnp.bfloat16), nnx.state(g.Policy(3, 16, 32, rngs=nnx.Rngs(0))))
    g.save_policy(str(tmp_path / "bf16"), state)
    assert "holds bfloat16, this run needs float32" in refused(tmp_path, capfd, monkeypatch, tmp_path / "bf16")


@pytest.mark.unit
def test_load_refuses_a_truncated_checkpoint(tmp_path, capfd, monkeypatch, saved_policy):
    """(e) The largest file under the checkpoint cut to half its bytes: one line. Catches: orbax's restore error
    passed on as a traceback."""
    damaged = tmp_path / "damaged"
    shutil.copytree(saved_policy[1], damaged)
    largest = max((p for p in damaged.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])
    assert "not a readable checkpoint" in refused(tmp_path, capfd, monkeypatch, damaged)


@pytest.mark.smoke
def test_load_refuses_a_garbled_checkpoint_in_one_line_from_the_command_line(tmp_path, saved_policy):
    """(e) Its _METADATA overwritten, from the command line (where absl's logging and orbax's threads reach stderr
    as they would for a learner): exit status 1, exactly one line on stderr, no progress line, no folder. Catches:
    absl's 'Failed to get item metadata' warning printed above the line, a traceback at exit."""
    damaged = tmp_path / "damaged"
    shutil.copytree(saved_policy[1], damaged)
    (damaged / "_METADATA").write_text("{not json")
    flags = [*SMOKE_FLAGS["number"], *TINY_FLAGS, "--load", str(damaged), "--out", str(tmp_path / "o")]
    proc = run_script(SCRIPT, *flags, cwd=tmp_path, timeout=240)
    assert proc.returncode == 1 and "phase=" not in proc.stdout and not (tmp_path / "o").exists()
    assert (
        proc.stderr == f"error: --load {damaged} is not a readable checkpoint (truncated or corrupt); nothing written\n"
    )


@pytest.mark.unit
def test_bad_input_exits_with_one_line(tmp_path, capsys):
    """Each bad input is one 'error: …' line and exit status 1 before any work. Catches: a contradiction that
    starts training (--pass-k above --eval-samples, G = 1 in prompt mode), a traceback instead of a line."""
    out = str(tmp_path / "o")

    def fails(message: str, **flags) -> None:
        with pytest.raises(SystemExit) as e:
            g.main(g.Args(out=out, **flags))
        err = capsys.readouterr().err
        assert e.value.code == 1 and re.match(f"error: {message}", err) and err.count("\n") == 1, err

    fails("--group-size must be >= 2 with --group-mode prompt", group_size=1)
    g.validate(g.Args(group_size=1, group_mode="batch", out=out))  # a batch-wide baseline needs no group
    fails(r"--pass-k must be at most --eval-samples \(4\), got 5", eval_samples=4, pass_k=5)
    fails("--clip-eps must be > 0", clip_eps=0.0)
    fails("--val-size must be <= 0.5", val_size=1.0)
    fails("--learning-rate must be > 0", learning_rate=0.0)
    fails("--max-digits must be <= 8", task="number", max_digits=9)
    with pytest.raises(g.RunError, match="--hidden-size must be >= 1"):  # validate() raises; main reports it
        g.validate(g.Args(hidden_size=0, out=out))
    with pytest.raises(SystemExit, match=r"^error: argument --kl: invalid choice.*\(see --help\)"):
        g.parse_args(["--kl", "k2"])
    only_test = synthetic_digits(tmp_path / "t", splits=("t10k",))
    fails("--split-test-set must be below the 500 test images", data_dir=str(only_test), split_test_set=500)
    fails(r"\S*nowhere/t10k-images-idx3-ubyte.gz not found", data_dir=str(tmp_path / "nowhere"))
    data = synthetic_digits(tmp_path / "data", n_train=64, n_test=64)
    blob = (data / "train-images-idx3-ubyte.gz").read_bytes()
    (data / "train-images-idx3-ubyte.gz").write_bytes(blob[: len(blob) // 3])  # truncated download
    fails(r"\S*train-images-idx3-ubyte.gz is not a complete gzip file", data_dir=str(data))
    assert not Path(out).exists() or not any(Path(out).iterdir())  # no run left a folder behind


# ------------------------------------------------------------------ smoke: the CLI
def without_seconds(metrics: dict) -> dict:
    """metrics.json without its wall-clock times and its --out."""
    out = {k: v for k, v in metrics.items() if k != "train_seconds"}
    out["history"] = [{k: v for k, v in row.items() if k != "seconds"} for row in metrics["history"]]
    out["args"] = {k: v for k, v in metrics["args"].items() if k != "out"}
    return out


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """The tiny run of a task (SMOKE_FLAGS and TINY_FLAGS on the bundled digits), made once for the tests that read
    it: cli_run(task) -> (the finished process, its --out folder). --task digit runs the command line in a
    subprocess, as a user does; --task number runs main() on the same flags parsed by parse_args, in this process
    (one start of Python and JAX fewer), its stdout captured: the command line's own path is the digit run's, and
    tests/test_cli.py's and tests/test_interrupt.py's. What train() returned to that main() is kept too:
    cli_run.trained["number"] -> (its args, (policy, π_ref, history, timings))."""
    made = {}

    def run(task: str):
        if task not in made:
            folder = tmp_path_factory.mktemp(f"cli_{task}")
            out = folder / "cli"
            argv = [*SMOKE_FLAGS[task], *TINY_FLAGS, "--out", str(out)]
            if task == "digit":
                made[task] = (run_script(SCRIPT, *argv, cwd=folder, timeout=240), out)
            else:
                stdout, stderr, code, returned, real_train = io.StringIO(), io.StringIO(), 0, [], g.train
                args = g.parse_args(argv)
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    with pytest.MonkeyPatch.context() as mp:
                        mp.setattr(
                            g, "train", lambda args, data: returned.append(real_train(args, data)) or returned[-1]
                        )
                        try:
                            g.main(args)
                        except SystemExit as e:  # main() ends a failed run with exit status 1
                            code = e.code
                run.trained[task] = (args, returned[0] if len(returned) == 1 else None)
                made[task] = (SimpleNamespace(returncode=code, stdout=stdout.getvalue(), stderr=stderr.getvalue()), out)
        return made[task]

    run.trained = {}
    return run


@pytest.mark.smoke
@pytest.mark.parametrize("task", ["digit", "number"])
def test_cli_runs_both_tasks(task, cli_run, request):
    """The command line runs each task for 4 iterations on the bundled digits and writes metrics.json (validation
    and test pass@1, pass@2 and greedy; the test set only once, at the end), learning_curve.png and policy/
    (key prefix 'policy'); one progress line per score, SFT rows first for --task number, whose run also has the KL
    penalty (β = 0.1: its mean per-token KL on the progress line). For --task digit the same flags run again
    in-process through main() (the shared digit_main run) give the same metrics apart from the seconds, and --seed 1
    (the shared seed_1_without_test run) another run. Catches: a broken CLI, a missing output or metric, test scores
    in the per-block history, randomness that --seed does not drive, a --seed that drives nothing."""
    r, out = cli_run(task)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("phase=")]
    phases = ["start", "rl", "rl"] if task == "digit" else ["start", "sft", "rl", "rl"]
    assert [line.split()[0] for line in lines] == [f"phase={p}" for p in phases]
    for name in ("val_pass1=", "val_pass2=", "val_greedy=", "clip_frac=", "outside_frac=", "zero_signal="):
        assert name in lines[-1], name
    assert (" kl=" in lines[-1]) == (task == "number")  # the penalty's KL is reported only where β > 0
    assert "\nparameters: policy " in r.stdout and "PPO's critic V(x) would add" in r.stdout
    metrics = json.loads((out / "latest" / "metrics.json").read_text())
    for key in ("val_pass1", "val_pass2", "val_greedy", "test_pass1", "test_pass2", "test_greedy", "clip_frac"):
        assert 0 <= metrics[key] <= 1, key
    assert metrics["val_pass1"] <= metrics["val_pass2"]
    assert metrics["test_prompts"] == 2000 and metrics["val_prompts"] == 800
    assert all(not k.startswith("test") for row in metrics["history"] for k in row)
    assert (out / "latest" / "learning_curve.png").stat().st_size > 1000
    n_slots = 1 if task == "digit" else 3
    with ocp.StandardCheckpointer() as checkpointer:
        saved = g.shapes(checkpointer.metadata(str((out / "latest" / "policy").resolve())).item_metadata.tree)
    assert saved["encoder/kernel/value"][0] == (784, 16)
    assert saved["decoder/kernel/value"][0] == (n_slots * (16 + g.VOCAB + 1), 32)
    assert r.stdout.splitlines()[-1] == f"outputs: {out / (out / 'latest').readlink()} " + (
        "(metrics.json, learning_curve.png, policy/)"
    )
    if task == "number":
        return
    again = request.getfixturevalue("digit_main")[1]  # main() in this process on the same flags
    assert without_seconds(json.loads(json.dumps(again))) == without_seconds(metrics)
    # --seed 1 with --no-score-test, which only skips the final test scoring (training and its history are the same)
    other = request.getfixturevalue("seed_1_without_test")[0]
    assert [row.get("reward") for row in other["history"]] != [row.get("reward") for row in metrics["history"]]


@pytest.mark.smoke
def test_load_scores_the_saved_policy_as_its_run_did(tmp_path, cli_run, capsys):
    """--load of the tiny --task number run's latest/policy with the run's flags trains nothing and writes a run of
    its own under <out>/eval/: the run's final validation and test scores, exactly (the same policy, the same
    evaluation keys), and no KL to π_ref (the checkpoint holds none); <out>/latest still points at the training run,
    whose files stay as they were, so the same --load works again. Catches: a --load that trains, scores another
    policy (the initial one) or with other keys, writes into the training run's folder or moves <out>/latest."""
    r, out = cli_run("number")
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "latest" / "metrics.json").read_text())
    before = {p: p.read_bytes() for p in (out / "latest").resolve().rglob("*") if p.is_file()}
    argv = [*SMOKE_FLAGS["number"], *TINY_FLAGS, "--load", str(out / "latest" / "policy"), "--out", str(out)]
    capsys.readouterr()
    loaded = g.main(g.parse_args(argv))
    printed = capsys.readouterr().out
    assert "phase=" not in printed and f"loaded {out / 'latest' / 'policy'}" in printed and "\ntest_pass1=" in printed
    assert json.loads((out / "eval" / "latest" / "metrics.json").read_text()) == json.loads(json.dumps(loaded))
    scored = [k for k in run if k.startswith(("val_", "test_")) and not k.endswith("_kl_ref")]
    assert len(scored) == 12  # val and test: pass@1, pass@2, greedy, length, wrong-answer length, prompts
    assert {k: loaded[k] for k in scored} == {k: run[k] for k in scored}
    assert not [k for k in loaded if "kl_ref" in k] and "history" not in loaded
    assert loaded["loaded"] == str(out / "latest" / "policy")
    assert {p: p.read_bytes() for p in (out / "latest").resolve().rglob("*") if p.is_file()} == before
    assert [p.name for p in (out / "eval" / "latest").iterdir()] == ["metrics.json"]
    assert g.main(g.parse_args(argv))["val_pass1"] == loaded["val_pass1"]  # latest is still the training run


# ------------------------------------------------------------------ learning: short real runs
# Measured with seed 0 (jax 0.12, the defaults μ 2, β 0, learning rate 1e-3): --task digit, 150 iterations,
# validation pass@1 / greedy 0.881 / 0.895 (chance 0.10); the bar below leaves a wide margin. The --task number
# test's bars are read from the files that measured its command over seeds 0-4 (short_run_bars).
@pytest.mark.learning
def test_digit_task_learns_well_above_chance(tmp_path):
    """--task digit, the other flags at their defaults but 150 iterations: validation pass@1 (one answer sampled at
    temperature 1) and greedy accuracy far above chance (10 %): measured 0.881 and 0.895, the bar is 0.6. Catches:
    a flipped advantage sign, a broken baseline or verifier, a sampler that ignores the prompt."""
    result = g.main(g.Args(task="digit", iterations=150, eval_every=50, score_test=False, out=str(tmp_path)))
    assert result["history"][0]["val_pass1"] < 0.2  # untrained: near chance
    assert result["val_pass1"] > 0.6 and result["val_greedy"] > 0.6


def short_run_bars() -> tuple[list[str], dict, dict]:
    """The shortened default run's flags and its two measured files (tools/seeds.py over seeds 0-4, validation
    only): grpo_number_short, the default --task number run cut to 300 RL iterations after its 300 SFT steps, and
    grpo_number_short_sft, SFT alone for as many iterations. The flags are read from the first file's command, so
    the test runs what was measured."""
    files = [
        REPO / "benchmarks" / "results" / f"{name}.json" for name in ("grpo_number_short", "grpo_number_short_sft")
    ]
    grpo, sft = (json.loads(path.read_text(encoding="utf-8")) for path in files)
    flags = grpo["provenance"]["command"].split(" -- ", 1)[1].split()
    return flags, grpo, sft


def check_short_run(script, out: Path) -> dict:
    """Run the shortened default (short_run_bars) with `script`, seed 0, and check it against the measured files:
    validation pass@1 after SFT is far above its untrained value, and at the end it is above the midpoint of the
    IQMs of GRPO and of SFT alone for as many iterations, over seeds 0-4. Returns the run's metrics."""
    flags, grpo, sft = short_run_bars()
    result = script.main(script.parse_args([*flags, "--seed", "0", "--out", str(out)]))
    history = result["history"]
    sft_rows = [row for row in history if row["phase"] == "sft"]
    assert sft_rows and history[0]["val_pass1"] < 0.05 < sft_rows[-1]["val_pass1"], "no warm start, or one that failed"
    assert history[-1]["phase"] == "rl" and result["val_pass1"] > (grpo["iqm"] + sft["iqm"]) / 2
    return result


@pytest.mark.learning
def test_the_default_number_run_shortened_learns_as_measured(tmp_path):
    """The default --task number run cut to 300 RL iterations (check_short_run, bars from the files measured over
    seeds 0-4; measured 0.5226 on seed 0, against a bar of about 0.49). Catches (each tried on a copy of the script,
    each failed here): a flipped advantage sign, the ratio inverted (π_old / π_θ), a verifier that compares each
    answer with another prompt's target, μ steps that never update the policy, RL from scratch (the SFT warm start
    skipped). Losses on the tokens after EOS (an all-ones mask) still pass it (0.5164): the mask tests above catch
    that."""
    check_short_run(g, tmp_path)


def test_each_exercise_change_of_grpo_answers_meets_the_script_once():
    """tools/grpo_answers.py makes an exercise's change on a copy of the repository and runs the tests named for it.
    A piece of source that no longer occurs exactly once, or a named test that no longer exists, would measure
    nothing: the tool refuses the first, and this test catches both."""
    answers = load_script("tools/grpo_answers.py")
    source = (REPO / answers.SCRIPT).read_text(encoding="utf-8")
    assert answers.CHANGES and set(answers.CHANGES) == set(answers.CATCHING_TESTS)
    for change, (piece, replacement) in answers.CHANGES.items():
        assert source.count(piece) == 1, change
        changed = answers.changed_source(change)
        assert changed != source and changed.count(replacement) == 1, change
        assert all(callable(globals().get(test)) for test in answers.CATCHING_TESTS[change]), change
