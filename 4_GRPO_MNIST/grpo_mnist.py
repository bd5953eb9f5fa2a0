"""GRPO on MNIST, the way language models are trained: a prompt of digit images, an answer sampled token by token.

Each prompt is a strip of 1 to N MNIST images (`--task number`, N = `--max-digits`) or one (`--task digit`).
The policy is a small causal model: an encoder turns each image into features, and a decoder emits the answer
one token at a time (the ten digits and EOS); step t sees the prompt and the tokens before t. A verifier gives
reward 1 for the exact number, else 0 (`--reward partial`: credit per digit).

GRPO samples G answers per prompt from the rollout policy π_old, turns each group's rewards into advantages
with the group's own mean and standard deviation (no critic), and takes μ = `--inner-steps` steps on a
per-token clipped surrogate, with a per-token KL penalty towards a reference policy π_ref (`--kl exact|k1|k3`),
frozen unless `--ref-refresh` asks otherwise. `--loss-agg` sets how the per-token losses are averaged. For
`--task number` a supervised warm start (SFT) on a small labelled share of the training prompts comes first; RL
then learns from the verifier alone. `--objective supervised` trains with cross-entropy instead, the baseline.

Order: Args → prompts (strips) → the policy → sampling → the verifier → group advantages → per-token ratio,
clip and KL → loss aggregation → the GRPO and SFT losses → the compiled updates → evaluation (pass@1, pass@k,
greedy) → the training loop. Below the `# Plumbing` banner: the command line, checks, the data splits, reading
MNIST, the critic GRPO does without (only counted), checkpoints and `--load`, the figure, metrics.json and main.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import hashlib
import json
import math
import os
import shutil
import signal
import struct
import sys
import threading
import time
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from typing import NamedTuple

if __name__ == "__main__":  # a SIGTERM while the libraries load waits for main, which reports it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
try:  # Ctrl-C while the libraries load: one line and exit status 130, not a traceback
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from tensorflow_probability.substrates.jax import distributions as tfd  # TFP on JAX: no TensorFlow needed
except KeyboardInterrupt:
    print("interrupted while loading the libraries; nothing written", file=sys.stderr)
    raise SystemExit(130) from None


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag. Its bounds travel with it and check_flags tests them:
    choices (a tuple of allowed values), min / max (inclusive) and gt (strictly greater than)."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: one split of jax.random.key(seed) gives weights, training, val, test", min=0)
    host_devices: int = flag(0, "fake N CPU devices before JAX starts (0: the devices there are)", min=0)
    mesh: str = flag("", "device mesh as DATAxMODEL, e.g. 2x2 (empty: every device on 'data')")
    rules: str = flag(
        "dp", "logical-axis rules: dp (split the prompts) or fsdp (also the large weights)", choices=("dp", "fsdp")
    )
    task: str = flag(
        "number",
        "digit: one image, answer its digit; number: a strip of 1 to --max-digits images, answer the number",
        choices=("digit", "number"),
    )
    max_digits: int = flag(4, "with --task number: the longest strip (and answer); --task digit uses 1", min=1, max=8)
    data: str = flag(
        "bundled",
        "bundled: the 10,000 MNIST test digits in 4_GRPO_MNIST/data/ (offline), split by --split-test-set; "
        "full: the official 60,000 training and 10,000 test digits, from tensorflow-datasets or downloaded",
        choices=("bundled", "full"),
    )
    split_test_set: int = flag(8000, "with --data bundled: train on this many digits, test on the rest", min=1)
    val_size: float = flag(
        0.1, "share of the training images held out for validation, where every choice is made", gt=0, max=0.5
    )
    score_test: bool = flag(True, "score the test set once, after training (--no-score-test: leave it unread)")
    data_dir: str = flag("", "read the IDX .gz files from this folder: the t10k pair (bundled) or all four (full)")
    dataset: str = flag("mnist", "with --data full: the tensorflow-datasets name", choices=("mnist", "fashion_mnist"))
    download: bool = flag(True, "with --data full: let tensorflow-datasets prepare the data, or fetch its IDX files")
    objective: str = flag(
        "grpo",
        "grpo: learn from the verifier's reward; supervised: cross-entropy on the labelled images instead",
        choices=("grpo", "supervised"),
    )
    label_fraction: float = flag(0.05, "share of training images whose labels SFT and supervised may read", gt=0, max=1)
    sft_steps: int = flag(-1, "supervised warm-start steps before RL (-1: 300 for --task number, 0 for digit)", min=-1)
    reward: str = flag(
        "exact",
        "exact: 1 for the exact number, else 0; partial: digits right in place / the longer of answer and number",
        choices=("exact", "partial"),
    )
    group_mode: str = flag(
        "prompt",
        "prompt: a prompt's G answers form a group (GRPO); batch: one baseline for all B·G answers (a common bug)",
        choices=("prompt", "batch"),
    )
    group_size: int = flag(8, "G, answers sampled per prompt (prompt mode needs G >= 2)", min=1)
    batch_size: int = flag(64, "B, prompts per rollout and update", min=1)
    inner_steps: int = flag(2, "μ, gradient steps per rollout (1: the ratio stays 1, the clip never acts)", min=1)
    iterations: int = flag(1500, "RL iterations (rollout + μ steps), or supervised steps after the warm start", min=1)
    eval_every: int = flag(150, "iterations between validation scores and progress lines", min=1)
    learning_rate: float = flag(1e-3, "Adam learning rate (SFT and RL)", gt=0)
    clip_eps: float = flag(0.2, "ε: each token's ratio π/π_old is clipped to [1 − ε, 1 + ε]", gt=0, max=1)
    beta: float = flag(0.0, "β, weight of the per-token KL penalty towards π_ref; 0 turns it off", min=0)
    kl: str = flag(
        "k3",
        "per-token KL: exact (summed over the vocabulary), k1 or k3 (estimates on the sampled token)",
        choices=("exact", "k1", "k3"),
    )
    ref_refresh: int = flag(0, "copy the policy into π_ref every this many iterations (0: π_ref stays frozen)", min=0)
    loss_agg: str = flag(
        "seq-mean-token-mean",
        "per-token losses → one number: seq-mean-token-mean (GRPO), token-mean (DAPO) or dr-grpo (Dr. GRPO's "
        "constant normaliser; Dr. GRPO itself also needs --adv-norm none)",
        choices=("seq-mean-token-mean", "token-mean", "dr-grpo"),
    )
    drop_zero_var: bool = flag(False, "leave groups whose rewards are all equal out of the loss and its normaliser")
    adv_norm: str = flag(
        "std",
        "std: A = (r − mean) / (std + ε) (GRPO); none: A = r − mean (Dr. GRPO's advantage)",
        choices=("std", "none"),
    )
    adv_eps: float = flag(1e-4, "ε in (r − mean) / (std + ε)", gt=0)
    hidden_size: int = flag(128, "width of the image encoder's features", min=1)
    decoder_size: int = flag(256, "width of the decoder's hidden layer", min=1)
    eval_samples: int = flag(16, "n, answers sampled per validation / test prompt for pass@1 and pass@k", min=1)
    pass_k: int = flag(8, "k of pass@k (at most --eval-samples)", min=1)
    out: str = flag("runs/grpo_mnist", "folder for metrics.json, the curve PNG and policy.npz")
    load: str = flag("", "score a saved policy.npz on validation (and test) without training; writes into <out>/eval/")
    compile_cache: str = flag(
        "~/.cache/jax-rl-course", "JAX's persistent compilation cache: later runs skip compiling ('' turns it off)"
    )


# ---- Prompts: a strip of 1..N images; the target is its digits, then EOS
VOCAB, EOS = 11, 10  # tokens 0-9 are the digits, token 10 ends the answer


class Strips(NamedTuple):
    images: jax.Array  # (P, N, 784): N image slots, empty ones zero
    slots: jax.Array  # (P, N) 1.0 where the strip has an image
    target: jax.Array  # (P, N) int: the digits, then EOS in every empty slot


def make_strips(x, y, idx, lengths) -> Strips:
    """idx (P, N) image indices, lengths (P,) in 1..N → strips whose first `length` slots hold images."""
    slots = (jnp.arange(idx.shape[1]) < lengths[:, None]).astype(jnp.float32)
    return Strips(x[idx] * slots[..., None], slots, jnp.where(slots > 0, y[idx], EOS))


def draw_strips(key, x, y, n_prompts: int, n_slots: int) -> Strips:
    """A fresh training batch: every slot an image drawn uniformly from (x, y), every length in 1..N equally likely."""
    k_idx, k_len = jax.random.split(key)
    idx = jax.random.randint(k_idx, (n_prompts, n_slots), 0, len(y))
    return make_strips(x, y, idx, jax.random.randint(k_len, (n_prompts,), 1, n_slots + 1))


# ---- Logical axis names: each weight is created with names, and a rule set maps names to mesh axes (chapter 6),
# as MaxText's logical_axis_rules: 'batch' is the prompts' dimension; 'pixels' and 'inputs' are the input
# dimensions of the two large weights; names no rule lists are replicated.
RULE_SETS = {
    "dp": (("batch", "data"),),  # data parallel: split the prompts, replicate every weight
    "fsdp": (("batch", "data"), ("pixels", "data"), ("inputs", "data")),  # and the two large weights' input dim
}


def named(names: tuple[str, str]) -> dict:
    """nnx.Linear initialisers that tag the kernel with logical axis names (and the bias with the output's)."""
    init = partial(nnx.with_partitioning, eager_sharding=False)  # laid out later, by the rules, on a mesh
    return {
        "kernel_init": init(nnx.initializers.lecun_normal(), names),
        "bias_init": init(nnx.initializers.zeros_init(), names[1:]),
    }


# ---- The policy: a causal model over answer tokens
class Policy(nnx.Module):
    """π_θ(y_t | x, y_<t). The decoder's first layer reads, at position t, the prompt's features, the one-hot tokens
    before t and a one-hot of t; its kernel stacks one block of rows per part, W = [W_x; W_y; W_t], so
    h_t = relu(W_x·x + W_y·y_<t + W_t·t + b) → VOCAB logits. encode: each image slot → hidden_size features (one
    Linear + ReLU, shared by the slots; empty slots give zeros), then W_x·x, the prompt's share, the same at every
    position and for every answer: computed once per prompt, as a language model keeps its prompt's keys and values.
    The causal mask makes position t blind to tokens t, t+1, …"""

    def __init__(self, n_slots: int, hidden_size: int, decoder_size: int, *, rngs: nnx.Rngs):
        self.n_slots = n_slots  # N: image slots, and the longest answer
        self.encoder = nnx.Linear(784, hidden_size, **named(("pixels", "features")), rngs=rngs)
        inputs = n_slots * (hidden_size + VOCAB + 1)  # prompt features, tokens before t, one-hot of t
        self.decoder = nnx.Linear(inputs, decoder_size, **named(("inputs", "hidden")), rngs=rngs)
        self.head = nnx.Linear(decoder_size, VOCAB, **named(("hidden", "vocab")), rngs=rngs)

    def encode(self, images: jax.Array, slots: jax.Array) -> jax.Array:
        """images (P, N, 784), slots (P, N) → the prompt's share of the decoder's first layer, W_x·x,
        (P, decoder_size)."""
        h = nnx.relu(self.encoder(images)) * slots[..., None]
        features = h.reshape(h.shape[0], -1)  # x, (P, N · hidden_size)
        return features @ self.decoder.kernel[: features.shape[-1]]

    def __call__(self, prompt: jax.Array, tokens: jax.Array, at: jax.Array | None = None) -> jax.Array:
        """prompt (S, decoder_size) from encode, tokens (S, N) → logits (S, R, VOCAB) at the R positions `at`
        (default: all N, in order); the row of position t sees tokens[:, :t] only. A one-hot code times a matrix
        is one row of the matrix, so W_y·y_<t is a lookup, as a language model's token embedding: for each slot
        s < t, the row of W_y that belongs to slot s and token y_s; W_t·t is row t of W_t."""
        S, N = tokens.shape
        at = jnp.arange(N) if at is None else at
        n_x = self.decoder.kernel.shape[0] - N * (VOCAB + 1)  # W_x's rows, then W_y's N·VOCAB, then W_t's N
        w_y = self.decoder.kernel[n_x : n_x + N * VOCAB].reshape(N, VOCAB, -1)  # (N, VOCAB, D): slot s, token v
        w_t = self.decoder.kernel[n_x + N * VOCAB :]  # (N, D): one row per position
        rows = w_y[jnp.arange(N), tokens]  # (S, N, D): the row of token y_s in slot s's block, for every s
        before = jnp.tril(jnp.ones((N, N)), k=-1)[at]  # (R, N): before[r, s] = 1 iff s < at[r], the causal mask
        h = nnx.relu(prompt[:, None] + jnp.einsum("rs,bsd->brd", before, rows) + w_t[at] + self.decoder.bias)
        return self.head(h)


def token_logp(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log π(y_t | …) of the given tokens, (S, N), from logits z (S, N, VOCAB): log π(v) = z_v − log Σ_u e^{z_u}."""
    return tfd.Categorical(logits=logits).log_prob(tokens)


# ---- Sampling: N decoding steps in lax.scan; step t fills token t from the logits at position t
def generate(policy: Policy, prompt: jax.Array, key, greedy: bool = False) -> jax.Array:
    """prompt (S, decoder_size) from Policy.encode → tokens (S, N), sampled at temperature 1 (greedy: the argmax).
    Step t computes position t's logits alone. Tokens after the first EOS are sampled too; `completion_mask` leaves
    them out of every loss and score."""
    n = policy.n_slots

    def step(tokens, inputs):
        t, step_key = inputs
        logits = policy(prompt, tokens, at=t[None])[:, 0]  # (S, VOCAB): position t alone, seeing tokens[:, :t]
        token = jnp.argmax(logits, -1) if greedy else jax.random.categorical(step_key, logits)
        return tokens.at[:, t].set(token), None

    start = jnp.full((prompt.shape[0], n), EOS)
    tokens, _ = jax.lax.scan(step, start, (jnp.arange(n), jax.random.split(key, n)))
    return tokens


def completion_mask(tokens: jax.Array) -> jax.Array:
    """1.0 on the tokens of the answer: up to and including the first EOS (all N if there is none). (S, N)."""
    eos = tokens == EOS
    return (jnp.cumsum(eos, axis=1) - eos == 0).astype(jnp.float32)


# ---- The verifier: reward 1 for the exact number (or per-digit credit); it never sees the policy
def answer_length(tokens: jax.Array) -> jax.Array:
    """Digits before the first EOS. (S, N) → (S,)."""
    return jnp.sum(completion_mask(tokens) * (tokens != EOS), axis=1)


def verify(tokens: jax.Array, target: jax.Array, partial: bool = False) -> jax.Array:
    """Reward per answer, (S,). Exact: 1 iff the digits and the stopping point match the target. Partial: digits
    right in place, divided by the longer of the answer and the target (1 only for the exact answer)."""
    canonical = jnp.where(completion_mask(tokens) > 0, tokens, EOS)  # every token after the first EOS → EOS
    if not partial:
        return jnp.all(canonical == target, axis=1).astype(jnp.float32)
    n_answer, n_target = answer_length(tokens), answer_length(target)
    in_both = jnp.arange(tokens.shape[1]) < jnp.minimum(n_answer, n_target)[:, None]
    return jnp.sum((tokens == target) & in_both, axis=1) / jnp.maximum(n_answer, n_target)


# ---- Group advantages: the baseline is the group's own mean, so no critic is needed
def has_signal(rewards: jax.Array) -> jax.Array:
    """(B,): True where a row's rewards are not all equal, so its advantages can be non-zero."""
    return rewards.max(axis=1) > rewards.min(axis=1)


def group_advantages(rewards: jax.Array, eps: float, norm: str = "std") -> jax.Array:
    """Real GRPO. rewards (B, G): row b holds the G answers to prompt b.
    A_bg = (r_bg − mean_g r_b·) / (std_g r_b· + ε), or r_bg − mean_g r_b· with norm="none" (Dr. GRPO);
    a group whose rewards are all equal gets A = 0 exactly. Equality is decided with max == min: eight float32
    rewards of 1/3 can have a std of about 3e-8 (jnp.std sums them in an order that does not cancel), not 0."""
    centred = rewards - rewards.mean(axis=1, keepdims=True)  # (B, G)
    if norm == "std":
        centred = centred / (rewards.std(axis=1, keepdims=True) + eps)  # population std, (B, 1)
    return jnp.where(has_signal(rewards)[:, None], centred, 0.0)


def batch_advantages(rewards: jax.Array, eps: float, norm: str = "std") -> jax.Array:
    """A common bug, kept to measure it (--group-mode batch): the batch of different prompts as one group, one
    baseline for all of it, A = (r − mean(all r)) / (std(all r) + ε) (without the division when norm="none"), and
    A = 0 when every reward in the batch is equal. A hard prompt's answers are judged against easy prompts' rewards."""
    return group_advantages(rewards.reshape(1, -1), eps, norm).reshape(rewards.shape)


# ---- Per token: the clipped ratio and the KL to π_ref
def clipped_surrogate(logp, logp_old, adv, clip_eps: float):
    """Per token, the PPO-clip objective to MAXIMISE: ρ_t = exp(log π_θ − log π_old), min(ρ_t A, clip(ρ_t, 1 ± ε) A).
    Also per token: binds (ρ > 1 + ε with A > 0, or ρ < 1 − ε with A < 0: the clipped constant is the minimum,
    the gradient is 0) and outside (|ρ − 1| > ε, whatever A's sign). All (S, N); adv broadcasts from (S, 1)."""
    ratio = jnp.exp(logp - logp_old)
    objective = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    binds = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))
    return objective, binds, jnp.abs(ratio - 1) > clip_eps


def token_kl(logits, ref_logits, tokens, how: str) -> jax.Array:
    """Per-token KL(π_θ ‖ π_ref), (S, N). exact: Σ_v π(v)(log π(v) − log π_ref(v)). On the sampled token y_t, with
    log_r = log π_ref(y_t) − log π(y_t): k1 = −log_r; k3 = e^log_r − log_r − 1 (≥ 0). The gradients differ (README)."""
    policy, reference = tfd.Categorical(logits=logits), tfd.Categorical(logits=ref_logits)
    if how == "exact":
        return tfd.kl_divergence(policy, reference)  # the vocabulary sum above, at every position
    log_r = reference.log_prob(tokens) - policy.log_prob(tokens)
    return -log_r if how == "k1" else jnp.exp(log_r) - log_r - 1


# ---- Loss aggregation: how the per-token losses of S answers become one number
def aggregate(per_token: jax.Array, mask: jax.Array, how: str) -> jax.Array:
    """per_token, mask (S, N). seq-mean-token-mean: each answer's mean over its tokens, then the mean over answers;
    token-mean: the sum over all tokens / their number; dr-grpo: the sum / (answers × N), a constant normaliser.
    Answers whose mask is all 0 (dropped groups) count in no denominator."""
    total = jnp.sum(per_token * mask, axis=1)  # (S,)
    length = jnp.sum(mask, axis=1)  # (S,)
    answers = jnp.maximum(jnp.sum(length > 0), 1)
    if how == "seq-mean-token-mean":
        return jnp.sum(total / jnp.maximum(length, 1)) / answers
    if how == "token-mean":
        return jnp.sum(total) / jnp.maximum(jnp.sum(length), 1)
    return jnp.sum(total) / (answers * per_token.shape[1])


# ---- The losses: GRPO (clipped surrogate + β·KL, aggregated) and cross-entropy for SFT
@dataclass(frozen=True)
class GRPOConfig:
    """The static (compile-time) part of Args that the jitted updates need."""

    objective: str
    group_mode: str
    group_size: int
    batch_size: int
    inner_steps: int
    clip_eps: float
    beta: float
    kl: str
    loss_agg: str
    drop_zero_var: bool
    ref_refresh: int
    reward: str
    adv_norm: str
    adv_eps: float
    batch_axis: str | None = None  # the mesh axis the prompts are split along (RULE_SETS[...]['batch'])

    @classmethod
    def from_args(cls, args: Args) -> GRPOConfig:
        flags = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**flags, batch_axis=dict(RULE_SETS[args.rules]).get("batch"))


class Rollout(NamedTuple):
    tokens: jax.Array  # (S, N), S = B·G answers; the G answers to a prompt are adjacent rows
    mask: jax.Array  # (S, N) completion mask, zeroed for dropped groups
    logp_old: jax.Array  # (S, N) log π_old of each sampled token
    adv: jax.Array  # (S, 1) one advantage per answer, shared by its tokens
    ref_logits: jax.Array | None  # (S, N, VOCAB) π_ref at every position (None when β = 0)


def grpo_loss(policy: Policy, strips: Strips, rollout: Rollout, config: GRPOConfig):
    """−aggregate(min(ρ_t A, clip(ρ_t) A) − β·KL_t) over the answer tokens; returns (loss, metrics)."""
    prompt = jnp.repeat(policy.encode(strips.images, strips.slots), config.group_size, axis=0)  # (S, decoder_size)
    logits = policy(prompt, rollout.tokens)  # (S, N, VOCAB)
    logp = token_logp(logits, rollout.tokens)
    objective, binds, outside = clipped_surrogate(logp, rollout.logp_old, rollout.adv, config.clip_eps)
    per_token = -objective
    answer = completion_mask(rollout.tokens)  # every answer token, dropped groups included: the same denominator
    metrics = {"clip_frac": aggregate(binds, answer, "token-mean")}
    metrics["outside_frac"] = aggregate(outside, answer, "token-mean")
    if config.beta > 0:
        kl = token_kl(logits, rollout.ref_logits, rollout.tokens, config.kl)
        per_token = per_token + config.beta * kl
        metrics["kl"] = aggregate(kl, rollout.mask, "token-mean")
    loss = aggregate(per_token, rollout.mask, config.loss_agg)
    return loss, {"loss": loss, **metrics}


def sft_loss(policy: Policy, strips: Strips):
    """Cross-entropy of the target answer (its digits and EOS), teacher-forced, averaged over its tokens."""
    logits = policy(policy.encode(strips.images, strips.slots), strips.target)
    loss = aggregate(-token_logp(logits, strips.target), completion_mask(strips.target), "token-mean")
    return loss, {"loss": loss}


# ---- The compiled updates: one GRPO iteration, one SFT step; a block of them is one lax.scan
def rollout_groups(policy: Policy, reference: Policy, strips: Strips, key, config: GRPOConfig):
    """Sample G answers per prompt from π_old (the current policy), score them, and fix everything the μ steps
    reuse. Returns (Rollout, metrics)."""
    prompt = jnp.repeat(policy.encode(strips.images, strips.slots), config.group_size, axis=0)  # (S, decoder_size)
    tokens = generate(policy, prompt, key)
    logp_old = jax.lax.stop_gradient(token_logp(policy(prompt, tokens), tokens))
    target = jnp.repeat(strips.target, config.group_size, axis=0)
    rewards = verify(tokens, target, config.reward == "partial").reshape(-1, config.group_size)  # (B, G)
    if config.group_mode == "prompt":
        adv = group_advantages(rewards, config.adv_eps, config.adv_norm)
        signal = has_signal(rewards)  # (B,): False where all G rewards are equal, so every A is 0
    else:
        adv = batch_advantages(rewards, config.adv_eps, config.adv_norm)
        signal = jnp.full(rewards.shape[0], has_signal(rewards.reshape(1, -1))[0])
    mask = completion_mask(tokens)
    if config.drop_zero_var:
        mask = mask * jnp.repeat(signal, config.group_size)[:, None]
    ref_logits = None
    if config.beta > 0:
        ref_logits = reference(jnp.repeat(reference.encode(strips.images, strips.slots), config.group_size, 0), tokens)
    rollout = Rollout(tokens, mask, logp_old, adv.reshape(-1, 1), ref_logits)
    all_right = jnp.mean(rewards.min(axis=1) == 1)  # groups with every answer right: no signal, nothing left to fix
    return rollout, {"reward": rewards.mean(), "zero_signal": 1 - signal.mean(), "all_right": all_right}


def grpo_update(policy, optimizer, reference, strips: Strips, key, config: GRPOConfig) -> dict:
    """One GRPO iteration: a rollout from π_old, then μ gradient steps on it (after the first, ρ ≠ 1)."""
    rollout, metrics = rollout_groups(policy, reference, strips, key, config)
    grad_fn = nnx.value_and_grad(grpo_loss, has_aux=True)
    steps = []
    for _ in range(config.inner_steps):
        (_, aux), grads = grad_fn(policy, strips, rollout, config)
        optimizer.update(policy, grads)
        steps.append(aux)
    averages = {name: jnp.mean(jnp.stack([aux[name] for aux in steps])) for name in steps[0]}  # over the μ steps
    can_bind = steps[1:] or steps  # step 1 has ρ = 1 exactly; with μ = 1 nothing can bind and both fractions are 0
    for name in ("clip_frac", "outside_frac"):  # over steps 2..μ only
        averages[name] = jnp.mean(jnp.stack([aux[name] for aux in can_bind]))
    return {**averages, **metrics}


def sft_update(policy, optimizer, strips: Strips, key) -> dict:
    """One cross-entropy step; also samples one answer per prompt so 'reward' is comparable with GRPO's."""
    reward = verify(generate(policy, policy.encode(strips.images, strips.slots), key), strips.target).mean()
    (_, aux), grads = nnx.value_and_grad(sft_loss, has_aux=True)(policy, strips)
    optimizer.update(policy, grads)
    return {**aux, "reward": reward}


class TrainState(NamedTuple):
    """The policy and its Adam state; nnx.state of a TrainState names its parts state["policy"], state["optimizer"]."""

    policy: Policy
    optimizer: nnx.Optimizer


def train_block(graphdef, policy_def, config: GRPOConfig, n_slots: int, state, ref_state, step0, x, y, keys):
    """len(keys) iterations as one lax.scan. state = nnx.state(TrainState), ref_state = π_ref's state
    (policy_def is its graphdef), replaced by the policy's every config.ref_refresh iterations if that is > 0.
    Prompts are drawn from (x, y). The NNX objects are rebuilt inside the traced step (nnx.merge) and split
    back out, so Python and NNX bookkeeping run once, at trace time."""

    def one_iteration(carry, inputs):
        state, ref_state = carry
        step, key = inputs
        policy, optimizer = nnx.merge(graphdef, state)
        draw_key, update_key = jax.random.split(key)
        strips = draw_strips(draw_key, x, y, config.batch_size, n_slots)
        if config.batch_axis and not jax.sharding.get_abstract_mesh().empty:  # under jax.set_mesh: split the prompts
            strips = jax.lax.with_sharding_constraint(strips, jax.P(config.batch_axis))
        if config.objective == "grpo":
            reference = nnx.merge(policy_def, ref_state)
            metrics = grpo_update(policy, optimizer, reference, strips, update_key, config)
        else:
            metrics = sft_update(policy, optimizer, strips, update_key)
        if config.ref_refresh > 0:  # π_ref ← π_θ after every ref_refresh-th iteration
            refresh = (step + 1) % config.ref_refresh == 0
            ref_state = jax.tree.map(lambda new, old: jnp.where(refresh, new, old), nnx.state(policy), ref_state)
        return (nnx.state(TrainState(policy, optimizer)), ref_state), metrics

    steps = step0 + jnp.arange(len(keys))
    (state, ref_state), metrics = jax.lax.scan(one_iteration, (state, ref_state), (steps, keys))
    return state, ref_state, jax.tree.map(jnp.mean, metrics)


# ---- Evaluation: n sampled answers per prompt give pass@1 and pass@k; greedy decoding gives exact match
def pass_at_k(n: int, correct, k: int) -> float:
    """Unbiased pass@k from n samples per prompt, c of them correct (Chen et al., 2021):
    the mean over prompts of 1 − C(n − c, k) / C(n, k), the chance that k of the n samples include a right one."""
    return float(np.mean([1 - math.comb(n - int(c), k) / math.comb(n, k) for c in correct]))


def evaluate(policy_def, state, ref_state, strips: Strips, key, n_samples: int) -> dict:
    """On fixed prompts: `correct` (P,), how many of n answers sampled at temperature 1 are exactly right; the
    greedy exact match; the mean answer length (tokens in the completion mask) overall and of wrong answers;
    and the exact KL(π_θ ‖ π_ref) summed over each answer's tokens."""
    policy, reference = nnx.merge(policy_def, state), nnx.merge(policy_def, ref_state)
    prompt = policy.encode(strips.images, strips.slots)
    greedy = verify(generate(policy, prompt, key, greedy=True), strips.target).mean()
    prompts = jnp.repeat(prompt, n_samples, axis=0)  # (P·n, decoder_size)
    tokens = generate(policy, prompts, key)
    right = verify(tokens, jnp.repeat(strips.target, n_samples, axis=0))  # (P·n,) exact match, 0 or 1
    mask = completion_mask(tokens)
    length = mask.sum(axis=1)
    ref_prompts = jnp.repeat(reference.encode(strips.images, strips.slots), n_samples, axis=0)
    kl = token_kl(policy(prompts, tokens), reference(ref_prompts, tokens), tokens, "exact")
    return {
        "correct": right.reshape(-1, n_samples).sum(axis=1),
        "greedy": greedy,
        "length": length.mean(),
        "wrong_length": jnp.sum(length * (1 - right)) / jnp.maximum(jnp.sum(1 - right), 1),
        "kl_ref": jnp.sum(kl * mask, axis=1).mean(),
    }


# ---- Before the loop: the splits, the task's sizes, the layout of the state on the mesh, one progress line
class Data(NamedTuple):
    x_train: np.ndarray  # (N, 784) float32 in [0, 1]
    y_train: np.ndarray  # (N,) int32 digit labels
    x_val: np.ndarray  # (V, 784) validation images, carved from the training images: every choice is made here
    y_val: np.ndarray
    x_test: np.ndarray | None  # (M, 784) held-out test images, scored once at the end (None: --no-score-test)
    y_test: np.ndarray | None
    source: str  # what the numbers were measured on


SPLIT_SEED = 0  # the fixed shuffles behind --split-test-set, --val-size and the evaluation strips


class RunKeys(NamedTuple):
    """The four random streams of a run, from one split of --seed's key, so no two of them share a key."""

    init: jax.Array  # nnx.Rngs(init) draws the initial weights' keys: fold_in(init, 0), fold_in(init, 1), …
    train: jax.Array  # split once per block: the block's prompts and sampled answers
    val: jax.Array  # the same key at every validation score: the rows differ only by the policy
    test: jax.Array  # the test set's sampled answers, scored once


def run_keys(seed: int) -> RunKeys:
    """split(key(seed), 4). nnx.Rngs(seed) itself would draw fold_in(key(seed), n), and split(k)[i] equals
    fold_in(k, i): keys taken from key(seed) directly would repeat the initial weights' keys."""
    return RunKeys(*jax.random.split(jax.random.key(seed), 4))


def fixed_strips(x, y, n_slots: int) -> Strips:
    """The validation or test prompts: one strip per image, which opens it; the other slots and the length come
    from a fixed shuffle, so every run scores the same strips. With N = 1 these are the images themselves."""
    rng = np.random.default_rng(SPLIT_SEED)
    idx = np.concatenate([np.arange(len(y))[:, None], rng.integers(0, len(y), (len(y), n_slots - 1))], axis=1)
    return make_strips(
        jnp.asarray(x), jnp.asarray(y), jnp.asarray(idx), jnp.asarray(rng.integers(1, n_slots + 1, len(y)))
    )


def slots_for(args: Args) -> int:
    """N, the image slots of a prompt and the longest answer: --max-digits for --task number, 1 for digit."""
    return args.max_digits if args.task == "number" else 1


def sft_steps_for(args: Args) -> int:
    """--sft-steps -1 means: 300 warm-start steps for --task number, none for --task digit."""
    return args.sft_steps if args.sft_steps >= 0 else (300 if args.task == "number" else 0)


def labelled_count(args: Args, n_train: int) -> int:
    """How many training images SFT and --objective supervised may read the labels of: round(fraction · N), >= 1."""
    return max(1, round(args.label_fraction * n_train))


LOGICAL_NAMES = ("batch", "pixels", "features", "inputs", "hidden", "vocab", "value")


def shardings(state, mesh: jax.sharding.Mesh, rules: str):
    """NamedSharding for every leaf of `state`, from its logical axis names: nnx.logical_axis_rules +
    nnx.get_named_sharding, with every name the rule set does not list replicated."""
    listed = {name for name, _ in RULE_SETS[rules]}
    with nnx.logical_axis_rules((*RULE_SETS[rules], *((n, None) for n in LOGICAL_NAMES if n not in listed))):
        return nnx.get_named_sharding(state, mesh)


def spec_paths(state, mesh, rules: str) -> tuple[list[str], list]:
    """('encoder/kernel', …) and each leaf's PartitionSpec, in jax.tree.leaves order."""
    flat = jax.tree_util.tree_flatten_with_path(shardings(state, mesh, rules))[0]
    paths = ["/".join(str(k.key) for k in path if hasattr(k, "key")) for path, _ in flat]
    return paths, [sharding.spec for _, sharding in flat]


def place(state, rules: str):
    """Put every array of `state` where the rules say, on the mesh set by jax.set_mesh (as is without one)."""
    mesh = jax.sharding.get_mesh()
    return state if mesh.empty else jax.device_put(state, shardings(state, mesh, rules))


def scores(raw: dict, n: int, k: int, prefix: str) -> dict:
    """evaluate()'s arrays → floats: pass@1 (the mean reward of one sampled answer), pass@k, greedy, lengths, KL."""
    out = {"pass1": float(raw["correct"].mean()) / n, f"pass{k}": pass_at_k(n, raw["correct"], k)}
    out.update({name: float(raw[name]) for name in ("greedy", "length", "wrong_length", "kl_ref")})
    return {f"{prefix}{name}": value for name, value in out.items()}


PROGRESS = ("reward", "loss", "clip_frac", "outside_frac", "zero_signal", "kl")


def print_progress(row: dict) -> None:
    """One grep-able line per block: the phase and iteration, validation scores, then the block's training means."""
    passes = " ".join(f"{key}={row[key]:.4f}" for key in row if key.startswith("val_pass"))  # pass@1, pass@k
    line = (
        f"phase={row['phase']} iter={row['iteration']} {passes} "
        f"val_greedy={row['val_greedy']:.4f} len={row['val_length']:.2f} wrong_len={row['val_wrong_length']:.2f} "
        f"kl_ref={row['val_kl_ref']:.4f}"
    )
    extra = "".join(f" {key}={row[key]:.4f}" for key in PROGRESS if key in row)
    print(line + extra + (f" sec={row['seconds']:.2f}" if "seconds" in row else ""), flush=True)


# ---- The training loop: SFT warm start, then RL (or more SFT) in blocks, scoring validation after each
class Phase(NamedTuple):
    """One stretch of training: its name in the history, its static config, its iterations, its prompt pool."""

    name: str  # "sft", then "rl" (or "supervised", the baseline)
    config: GRPOConfig
    steps: int
    x: jax.Array  # the images its prompts are drawn from, (M, 784)
    y: jax.Array  # their labels, (M,)


def train(args: Args, data: Data) -> tuple[Policy, Policy, list[dict], dict]:
    """Returns (policy, reference, history, timings). π_ref is the policy RL starts from: after the SFT warm
    start, or the initial policy without one. The test images are not touched here."""
    n_slots, n, streams = slots_for(args), args.eval_samples, run_keys(args.seed)
    policy = Policy(n_slots, args.hidden_size, args.decoder_size, rngs=nnx.Rngs(streams.init))
    optimizer = nnx.Optimizer(policy, optax.adam(args.learning_rate), wrt=nnx.Param)
    graphdef, state = nnx.split(TrainState(policy, optimizer))
    state = place(state, args.rules)  # weights and Adam's moments, split by the rules over the mesh
    policy_def, ref_state = nnx.graphdef(policy), state["policy"]  # π_ref: the same arrays, so the same layout
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    val = fixed_strips(data.x_val, data.y_val, n_slots)
    if not jax.sharding.get_mesh().empty:  # every device keeps all the images: copied once here, not at every call
        x, y, val = jax.device_put((x, y, val), jax.P())
    labelled = labelled_count(args, len(y))  # the training images are shuffled: SFT reads the first ones' labels
    rl = GRPOConfig.from_args(args)
    sft = replace(rl, objective="supervised", ref_refresh=0)
    phases = [Phase("sft", sft, sft_steps_for(args), x[:labelled], y[:labelled])]
    if args.objective == "grpo":
        phases.append(Phase("rl", rl, args.iterations, x, y))
    else:  # the baseline: more of the same supervised steps
        phases.append(Phase("supervised", sft, args.iterations, x[:labelled], y[:labelled]))
    key = streams.train
    score = jax.jit(partial(evaluate, policy_def), static_argnums=4)  # the same streams.val at every score: less noise
    history, t0 = [], time.perf_counter()

    def record(row: dict, state, ref_state) -> None:
        """Score the policy in `state` on validation; the row joins the history only once it is scored."""
        row.update(scores(score(state["policy"], ref_state, val, streams.val, n), n, args.pass_k, "val_"))
        history.append(row)
        print_progress(row)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops the loop here; what it measured is kept
        record({"phase": "start", "iteration": 0}, state, ref_state)  # the initial policy, scored once
        for phase in phases:
            if phase.name == "rl":
                ref_state = state["policy"]  # π_ref: a copy of the policy RL starts from
            run = jax.jit(partial(train_block, graphdef, policy_def, phase.config, n_slots))
            iteration = 0  # iterations done in this phase
            while iteration < phase.steps:
                block, t_block = min(args.eval_every, phase.steps - iteration), time.perf_counter()
                key, block_key = jax.random.split(key)
                keys = jax.random.split(block_key, block)
                state, ref_state, metrics = run(state, ref_state, iteration, phase.x, phase.y, keys)
                iteration += block
                row = {"phase": phase.name, "iteration": iteration, **{k: float(v) for k, v in metrics.items()}}
                row["seconds"] = time.perf_counter() - t_block
                record(row, state, ref_state)
    policy = nnx.merge(graphdef, state).policy
    return policy, nnx.merge(policy_def, ref_state), history, {"train_seconds": time.perf_counter() - t0}


# =============================================================================================
# Plumbing: the command line, input checks, reading MNIST, the parameter table, checkpoints, the figure, main
# =============================================================================================
class InputError(Exception):
    """Bad input: a flag value, a missing or corrupt file, an unwritable folder, a mesh that does not fit."""


class WriteError(Exception):
    """A file of the run could not be written (a full disk, a folder that turned read-only): what and why."""


def reports_input_errors(main):
    """Every early end of a run is one line on stderr. Bad input (InputError) or a file that cannot be written
    (WriteError): exit status 1. SIGINT (Ctrl-C) or SIGTERM, at any moment: exit status 130 or 143. The run's
    folder then holds its previous files or the set this run kept (Outputs.stop), never a mix; the line says which."""

    @functools.wraps(main)
    def run(args):
        main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
        handlers = {s: signal.signal(s, Outputs.on_signal) for s in (signal.SIGINT, signal.SIGTERM) if main_thread}
        hook, sys.unraisablehook = sys.unraisablehook, functools.partial(Outputs.unraisable, then=sys.unraisablehook)
        Outputs.signals, Outputs.holding, Outputs.again = [], False, None
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one held back while the libraries loaded
            return main(args)
        except (InputError, WriteError) as e:
            Outputs.holding = True  # from here on a signal is recorded, not raised
            out = Outputs.active
            tell = out is not None and not out.done and (isinstance(e, WriteError) or out.kept is not None)
            sys.exit(f"error: {e}" + (out.stop(str(e)) if tell else ""))
        except KeyboardInterrupt:
            Outputs.holding = True
            rest = Outputs.active.stop(None) if Outputs.active else f"; nothing written to {args.out}"
            print(f"interrupted{rest}", file=sys.stderr)
            sys.exit(128 + (Outputs.signals or [signal.SIGINT])[0])
        finally:
            Outputs.holding = True
            if Outputs.again is not None:  # a signal being sent again lands while the handlers are still in place
                Outputs.again.cancel()
                Outputs.again.join()
            if Outputs.active is not None:
                Outputs.active.close()
            for s, handler in handlers.items():
                signal.signal(s, handler)
            sys.unraisablehook, Outputs.holding = hook, False

    return run


class Outputs:
    """The files of one run in one folder (--out; <out>/eval/ for --load), kept as one set.

    write() puts each file into a staging folder inside it, under a temporary name until it is whole; commit()
    writes metrics.json there too, then deletes this script's files that the new set lacks (an old episode.gif) and
    moves the set into place, metrics.json last, with SIGINT and SIGTERM held back. Until then the folder keeps its
    previous files. A run stopped early commits what keep() last named, marked `interrupted`. A lock file holding
    the PID keeps a second run out of the folder.
    """

    active = None  # the Outputs of the run in progress (reports_input_errors stops and closes it)
    signals: list = []  # SIGINT / SIGTERM received during the run, in order
    holding = False  # True: a signal is recorded, and raised only when the hold ends (held)
    again = None  # the timer that sends a swallowed signal again (unraisable)

    def __init__(self, folder: str, files: dict[str, bool]):
        """files: every file this script can write into such a folder besides metrics.json -> written by this run."""
        self.folder, self.files, self.written, self.writing = folder, files, [], None
        self.kept, self.done = None, False  # what a stop commits (keep); whether the set is in place (commit)
        self.staging, self.lock = os.path.join(folder, ".staging"), os.path.join(folder, ".lock")
        try:
            os.makedirs(folder, exist_ok=True)
            self.take_lock()
            Outputs.active = self
            shutil.rmtree(self.staging, ignore_errors=True)  # what a killed run left
            os.mkdir(self.staging)
        except OSError as e:
            raise InputError(f"--out {folder!r} is not a writable folder ({e.strerror or type(e).__name__})") from None

    def take_lock(self) -> None:
        """Create the lock file, holding this PID. A lock whose process has ended is taken over; a live one refused."""
        while True:
            try:
                with open(self.lock, "x") as f:  # "x": only if no such file exists
                    f.write(str(os.getpid()))
                return
            except FileExistsError:
                try:
                    with open(self.lock) as f:
                        text = f.read()
                except FileNotFoundError:  # its run has just ended
                    continue
            pid = int(text) if text.strip().isdigit() else 0  # 0: none yet, its run is writing it right now
            try:
                os.kill(pid or os.getpid(), 0)  # signal 0 only asks whether that process exists
            except ProcessLookupError:  # it has ended (killed, say): its lock is taken over
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.lock)
                print(f"{self.lock}: PID {pid} has ended; its lock is taken over", flush=True)
                continue
            except PermissionError:  # it exists, and belongs to another user
                pass
            raise InputError(
                f"--out {self.folder!r} is in use by the run of PID {pid or 'unknown'}; wait for it to end or pick "
                f"another --out (its lock file: {self.lock})"
            )

    def write(self, name: str, writer, *args, **kwargs):
        """writer(path, *args, **kwargs) writes the set's file `name` (into the staging folder, under a temporary
        name until it is whole); returns what writer returns."""
        partial = os.path.join(self.staging, "partial-" + name)  # the same ending: savez, savefig and PIL read it
        self.writing = name
        try:
            result = writer(partial, *args, **kwargs)
            os.replace(partial, os.path.join(self.staging, name))
        except OSError as e:
            raise WriteError(f"{(e.strerror or type(e).__name__).lower()} while writing {name}") from None
        finally:  # a file that stopped half-way goes, and gives back its space
            with contextlib.suppress(FileNotFoundError):
                os.remove(partial)
        self.written, self.writing = [*(n for n in self.written if n != name), name], None
        return result

    def keep(self, metrics: dict, during: str, missing: list[str]) -> None:
        """From here on a stop commits `metrics` (as it is then) with the files written by then, marked interrupted
        `during` (say, 'the final evaluation'), with `missing` and every file not written listed as not done."""
        self.kept = (metrics, during, missing)

    def commit(self, metrics: dict) -> None:
        """Write metrics.json, then put the set in place of the folder's previous one; signals wait until it is."""
        if Outputs.signals and not Outputs.holding:  # one came, and no code stopped for it (a library swallowed it)
            raise KeyboardInterrupt
        with Outputs.held():

            def dump(path: str) -> None:
                with open(path, "w") as f:
                    json.dump(metrics, f, indent=2)

            self.write("metrics.json", dump)
            for name in self.files:
                if name not in self.written:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(os.path.join(self.folder, name))
            for name in sorted(self.written, key=lambda name: name == "metrics.json"):  # metrics.json last
                os.replace(os.path.join(self.staging, name), os.path.join(self.folder, name))
            self.done = True

    def stop(self, error: str | None) -> str:
        """After a signal (error None) or an error: commit the set keep() named, marked interrupted, and return the
        rest of the one line: where the run stopped (after a signal) and what the folder holds."""
        if self.done:
            return f" once the run was saved; {self.folder} holds all of it"
        if self.kept is None:
            return f"; nothing written to {self.folder}"
        metrics, during, missing = self.kept
        missing = [*missing, *(name for name, wanted in self.files.items() if wanted and name not in self.written)]
        during = f"writing {self.writing}" if self.writing else during
        mark = {**metrics.get("interrupted", {}), "during": during, "missing": missing}
        where = f"{'while' if self.writing else 'during'} {during}"
        if mark.get("at", 0) < mark.get("of", 0):  # training itself stopped early
            where = f"at {mark['unit']} {mark['at']} of {mark['of']}"
        try:
            self.commit({**metrics, "interrupted": mark | ({"error": error} if error else {})})
        except WriteError:
            return f"; nothing written to {self.folder}"
        kept = f"kept in {self.folder}: {', '.join(sorted(self.written, key=lambda n: n != 'metrics.json'))}"
        return ("" if error else f" {where}") + f"; {kept}" + (f" (not done: {', '.join(missing)})" if missing else "")

    def close(self) -> None:
        """Remove the staging folder (whatever it still holds was never committed) and the lock."""
        shutil.rmtree(self.staging, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.lock)
        Outputs.active = None

    @staticmethod
    def on_signal(signum, frame) -> None:
        """SIGINT and SIGTERM: recorded (the exit status says which), then raised as KeyboardInterrupt unless held."""
        Outputs.signals.append(signum)
        if not Outputs.holding:
            raise KeyboardInterrupt

    @staticmethod
    def unraisable(info, then) -> None:
        """A KeyboardInterrupt raised inside a library callback (JAX's garbage-collection hook), which cannot pass it
        on, is not lost: the signal is sent again a moment later, to land in the run's own code. Any other exception
        goes to `then`, the hook that was in place."""
        if isinstance(info.exc_value, KeyboardInterrupt) and Outputs.signals:
            Outputs.again = threading.Timer(0.01, os.kill, (os.getpid(), Outputs.signals[-1]))
            Outputs.again.daemon = True
            Outputs.again.start()
        else:
            then(info)

    @staticmethod
    @contextlib.contextmanager
    def held():
        """Inside, SIGINT and SIGTERM are recorded, not raised; one that came is raised on leaving."""
        seen, was = len(Outputs.signals), Outputs.holding
        Outputs.holding = True
        try:
            yield
        finally:
            Outputs.holding = was
        if len(Outputs.signals) > seen and not was:
            raise KeyboardInterrupt


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, exit status 1, instead of dumping the usage."""

    def error(self, message):
        sys.exit(f"error: {message} (see --help)")


def parse_args(argv=None) -> Args:
    """Args from the command line: one flag per field, whose --help line shows its bounds and default."""
    p = OneLineParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Args):
        kind = {"type": type(f.default), "choices": f.metadata["choices"]}
        if isinstance(f.default, bool):
            kind = {"action": argparse.BooleanOptionalAction}
        bounds = bounds_text(f.metadata)
        text = f.metadata["help"] + (f"; must be {bounds}" if bounds else "")
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default, help=text, **kind)
    args = Args(**vars(p.parse_args(argv)))
    try:
        check_flags(args)
    except InputError as e:
        p.error(str(e))
    return args


def bounds_text(meta: dict) -> str:
    """'in (0, 1]', '>= 1', '> 0' … from a flag's min / max / gt ('' if it has none)."""
    low = ("(", meta["gt"]) if meta["gt"] is not None else ("[", meta["min"]) if meta["min"] is not None else None
    high = meta["max"]
    if low and high is not None:
        return f"in {low[0]}{low[1]}, {high}]"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    return f"<= {high}" if high is not None else ""


def check_flags(args) -> None:
    """Raise InputError, one line, for the first flag outside the choices or bounds its flag() declares."""
    for f in fields(args):
        value, meta = getattr(args, f.name), f.metadata
        name = "--" + f.name.replace("_", "-")
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise InputError(f"{name} must be one of {', '.join(map(str, meta['choices']))}; got {value!r}")
        low_ok = (meta.get("gt") is None or value > meta["gt"]) and (meta.get("min") is None or value >= meta["min"])
        if not (low_ok and (meta.get("max") is None or value <= meta["max"])):
            raise InputError(f"{name} must be {bounds_text(meta)}, got {value}")


def validate(args: Args) -> None:
    """Raise InputError (one line for the user) if the flags contradict each other (main then takes the output
    folder: Outputs). Each flag's own range is checked first, by check_flags, from the bounds its flag() declares."""
    check_flags(args)
    if args.group_mode == "prompt" and args.objective == "grpo" and args.group_size < 2:
        # a group of one always has advantage 0: nothing to learn
        raise InputError(
            f"--group-size must be >= 2 with --group-mode prompt (a group of one always has advantage 0), "
            f"got {args.group_size}"
        )
    if args.pass_k > args.eval_samples:  # pass@k needs k of the n samples
        raise InputError(f"--pass-k must be at most --eval-samples ({args.eval_samples}), got {args.pass_k}")
    if args.dataset != "mnist" and args.data != "full":
        # the bundled digits are MNIST's; another tensorflow-datasets name needs its own files
        raise InputError(f"--dataset {args.dataset} needs --data full (the bundled digits are MNIST)")
    if args.load and not os.path.isfile(args.load):
        raise InputError(f"--load: no such file {args.load!r}")


def output_folder(args: Args) -> str:
    """Where this run writes: --out for training, <out>/eval/ for a --load run (a training run's files stay)."""
    return os.path.join(args.out, "eval") if args.load else args.out


# ---- The splits: train / validation / test images; prompts are built from one split only
def split_test_digits(x: np.ndarray, y: np.ndarray, n_train: int) -> tuple[np.ndarray, ...]:
    """--data bundled: the 10,000 official test digits, shuffled once, become n_train training digits and a
    held-out test set (the rest). Returns (x_train, y_train, x_test, y_test)."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    train, held = order[:n_train], order[n_train:]
    return x[train], y[train], x[held], y[held]


def carve_validation(x: np.ndarray, y: np.ndarray, val_size: float) -> tuple[np.ndarray, ...]:
    """Split the training images into (x_train, y_train, x_val, y_val) with a fixed shuffle; val gets
    round(val_size · N) images, at least one, and training keeps at least one."""
    n_val = min(max(1, round(val_size * len(y))), len(y) - 1)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    train, val = order[n_val:], order[:n_val]
    return x[train], y[train], x[val], y[val]


# ---- Reading MNIST: the IDX .gz files from a folder, or tensorflow-datasets, or a checked download
IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # the t10k pair, see data/README.md


def read_idx(path: str) -> np.ndarray:
    """Read one gzip-compressed IDX file of unsigned bytes (the MNIST format) into a uint8 array.

    Layout: 0x00 0x00 0x08 ndim | ndim big-endian uint32 sizes | prod(sizes) bytes.
    """
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise InputError(f"{path} not found") from None
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile, truncated stream, bad CRC
        raise InputError(f"{path} is not a complete gzip file ({e})") from None
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise InputError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise InputError(f"{path} is truncated inside its IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = math.prod(shape)
    if len(raw) - header != expected:
        raise InputError(
            f"{path}: shape {shape} needs {expected} data bytes, found {len(raw) - header} (truncated or corrupt)"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def to_features(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28[, 1]) → float32 (N, 784) in [0, 1]."""
    return images.reshape(images.shape[0], -1).astype(np.float32) / 255.0


def load_idx_split(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    image_file, label_file = (os.path.join(folder, name) for name in IDX_FILES[split])
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise InputError(f"{image_file}: expected images of shape (N, 28, 28), got {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise InputError(f"{label_file}: expected {images.shape[0]} labels, got shape {labels.shape}")
    if labels.max(initial=0) > 9:
        raise InputError(f"{label_file}: labels must be digits 0-9, found {labels.max()}")
    return to_features(images), labels.astype(np.int32)


def load_tfds_split(name: str, split: str, download: bool) -> tuple[np.ndarray, np.ndarray]:
    """Read a whole split through tfds.data_source (random-access ArrayRecord; no TensorFlow needed to read).

    The tests run it under tfds.testing.mock_data, which fakes the dataset without any files."""
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)  # keep tfds' warnings off the error path
    import tensorflow_datasets as tfds

    try:
        source = tfds.data_source(name, split=split, download=download)
        examples = [source[i] for i in range(len(source))]
    except Exception as e:  # offline, not cached, tfds needs TensorFlow to prepare, ...
        reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:200]
        raise InputError(
            f"could not load '{name}' split '{split}' through tensorflow-datasets ({reason}); "
            f"pass --data-dir DIR, a folder with the four IDX .gz files "
            f"({', '.join(IDX_FILES['train'] + IDX_FILES['test'])})"
        ) from None
    images = np.stack([np.asarray(ex["image"]) for ex in examples])
    labels = np.array([int(ex["label"]) for ex in examples], dtype=np.int32)
    return to_features(images), labels


def tfds_idx_files(name: str) -> dict[str, tuple[str, str]]:
    """{file name: (url, sha256)} of the IDX files tfds's own builder downloads for `name`.

    Read from the checksum list that tensorflow-datasets ships (url_checksums/<name>.txt)."""
    import tensorflow_datasets as tfds

    path = os.path.join(os.path.dirname(tfds.__file__), "url_checksums", f"{name}.txt")
    files = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                url, _size, sha256, filename = line.rstrip("\n").split("\t")
                files[filename] = (url, sha256)
    return files


def sha256_of(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def fetch_idx_files(name: str, folder: str, timeout: float = 60.0) -> str:
    """Download the four IDX .gz files of `name` into `folder` (once), each checked against tfds's SHA-256.

    This is the fallback when tfds cannot prepare the dataset itself: preparing encodes every image
    with TensorFlow, which this course does not install. Reading needs only NumPy (`read_idx`)."""
    os.makedirs(folder, exist_ok=True)
    for filename, (url, sha256) in tfds_idx_files(name).items():
        path = os.path.join(folder, filename)
        if os.path.exists(path) and sha256_of(path) == sha256:
            continue  # cached by an earlier run
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                blob = response.read()
        except (OSError, ValueError) as e:  # URLError, timeouts and refused connections are OSErrors
            raise InputError(
                f"could not download {url} ({e}); pass --data-dir DIR, a folder with the four "
                f"IDX .gz files ({', '.join(IDX_FILES['train'] + IDX_FILES['test'])})"
            ) from None
        if hashlib.sha256(blob).hexdigest() != sha256:
            raise InputError(f"{url} does not match the SHA-256 that tensorflow-datasets lists; not using it")
        with open(path + ".part", "wb") as fh:
            fh.write(blob)
        os.replace(path + ".part", path)  # never leave a half-written file under the real name
    return folder


def idx_cache_dir(name: str) -> str:
    """Where fetched IDX files are kept: beside tfds's own data, $TFDS_DATA_DIR or ~/tensorflow_datasets."""
    root = os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
    return os.path.join(root, "downloads", f"{name}_idx")


def load_full(args: Args) -> tuple[np.ndarray, ...]:
    """--data full: (x_train, y_train, x_test, y_test, origin) of the official train and test splits.

    From --data-dir if given; else tfds.data_source, and if tfds cannot provide the data (not prepared, and
    preparing needs TensorFlow) with --download on, the IDX files its builder uses, fetched and checked."""
    folder = args.data_dir
    if not folder:
        try:
            x_test, y_test = load_tfds_split(args.dataset, "test", args.download)
            x_train, y_train = load_tfds_split(args.dataset, "train", args.download)
            return x_train, y_train, x_test, y_test, f"tfds {args.dataset}"
        except InputError as tfds_error:
            if not args.download:
                raise
            print(
                f"tensorflow-datasets could not provide {args.dataset}; fetching its IDX files instead "
                f"({str(tfds_error).split(';')[0]})",
                flush=True,
            )
            folder = fetch_idx_files(args.dataset, idx_cache_dir(args.dataset))
    if not os.path.isdir(folder):
        raise InputError(f"--data-dir {folder} is not a folder")
    x_test, y_test = load_idx_split(folder, "test")
    if not os.path.exists(os.path.join(folder, IDX_FILES["train"][0])):
        raise InputError(
            f"--data-dir {folder} has no {IDX_FILES['train'][0]}; with only the test files, use --data bundled "
            f"to train on --split-test-set of them and hold out the rest"
        )
    x_train, y_train = load_idx_split(folder, "train")
    return x_train, y_train, x_test, y_test, f"IDX files in {folder}"


def load_data(args: Args) -> Data:
    """Train, validation and test arrays. --data bundled: the two t10k files in 4_GRPO_MNIST/data/ (or in
    --data-dir), split by `split_test_digits`; --data full: `load_full`. The validation split is always
    carved from the training images (`carve_validation`)."""
    if args.data == "bundled":
        folder = args.data_dir or BUNDLED_DIR
        if not os.path.isdir(folder):
            raise InputError(f"--data-dir {folder} is not a folder")
        x, y = load_idx_split(folder, "test")
        n = args.split_test_set
        if n >= len(y):
            raise InputError(f"--split-test-set must be below the {len(y)} test images, got {n}")
        x_train, y_train, x_test, y_test = split_test_digits(x, y, n)
        origin = f"IDX files in {folder}" if args.data_dir else "MNIST test digits bundled in 4_GRPO_MNIST/data"
        source = f"{origin}: test split shuffled, first {n} for training"
    else:
        x_train, y_train, x_test, y_test, origin = load_full(args)
        source = f"{origin}: train split"
    if len(y_train) < 2:
        raise InputError(f"need at least 2 training images to carve a validation split, got {len(y_train)}")
    x_train, y_train, x_val, y_val = carve_validation(x_train, y_train, args.val_size)
    return Data(
        x_train,
        y_train,
        x_val,
        y_val,
        x_test,
        y_test,
        f"{source} -> train {len(y_train)} / val {len(y_val)}; test {len(y_test)}",
    )


# ---- The device mesh: fake CPU devices, the (data, model) mesh, bytes per device
def start_devices(args: Args) -> list:
    """The devices to build the mesh from. --host-devices N asks JAX for N CPU devices; it must run before the
    first JAX operation (the flag only shapes the CPU backend: on a GPU or TPU host the accelerators are used)."""
    if args.host_devices > 0:
        try:
            jax.config.update("jax_num_cpu_devices", args.host_devices)
        except RuntimeError:  # JAX had already started (inside a test or a notebook): it keeps its devices
            if len(jax.devices("cpu")) < args.host_devices:
                raise InputError(
                    f"--host-devices {args.host_devices} came too late: JAX had already started with "
                    f"{len(jax.devices('cpu'))} CPU device(s); run the script from the command line"
                ) from None
        return jax.devices("cpu")[: args.host_devices]
    return jax.devices()


def make_mesh(args: Args, devices: list) -> jax.sharding.Mesh:
    """A (data, model) mesh with Auto axes (GSPMD lays out what is computed from the placed arrays). --mesh DATAxMODEL,
    or every device on 'data'. A mesh that does not fit the devices, the batch or a weight is a one-line error."""
    text = args.mesh or f"{len(devices)}x1"
    try:
        shape = tuple(int(n) for n in text.lower().split("x"))
        assert len(shape) == 2 and min(shape) >= 1
    except (ValueError, AssertionError):
        raise InputError(f"--mesh must look like DATAxMODEL, e.g. 2x2, got {args.mesh!r}") from None
    if shape[0] * shape[1] != len(devices):
        raise InputError(
            f"--mesh {text} needs {shape[0] * shape[1]} devices, there are {len(devices)} (see --host-devices)"
        )
    if shape[1] > 1 and "model" not in {axis for _, axis in RULE_SETS[args.rules]}:
        raise InputError(
            f"--mesh {text}: no --rules {args.rules} rule splits anything along 'model', so its {shape[1]} devices "
            f"would repeat the same work; use --mesh {shape[0]}x1 (module 5 splits a model along 'model')"
        )
    if args.batch_size % shape[0]:
        raise InputError(f"--batch-size {args.batch_size} must split evenly along 'data' ({shape[0]} devices)")
    auto = (jax.sharding.AxisType.Auto,) * 2
    abstract = jax.sharding.AbstractMesh(shape, ("data", "model"), axis_types=auto)  # sizes only: check first
    sizes = (slots_for(args), args.hidden_size, args.decoder_size)
    state = nnx.state(nnx.eval_shape(lambda: Policy(*sizes, rngs=nnx.Rngs(0))))
    for path, spec, leaf in zip(*spec_paths(state, abstract, args.rules), jax.tree.leaves(state)):
        for dim, axis in zip(leaf.shape, spec):
            if axis is not None and dim % abstract.shape[axis]:
                raise InputError(
                    f"--rules {args.rules} splits {path} {tuple(leaf.shape)} along '{axis}' ({abstract.shape[axis]} "
                    f"devices), which does not divide {dim}; pick another --mesh or --rules"
                )
    return jax.make_mesh(shape, ("data", "model"), axis_types=auto, devices=devices)


def bytes_on(tree, device) -> int:
    """Bytes that `device` holds of every array in `tree` (its addressable shards), measured, not computed."""
    return sum(
        shard.data.nbytes for a in jax.tree.leaves(tree) for shard in a.addressable_shards if shard.device == device
    )


def mesh_memory(args: Args, data: Data, mesh: jax.sharding.Mesh) -> dict:
    """On the first device of the mesh: the bytes of the policy + Adam state, of π_ref (parameters only: it is never
    trained, so it has no gradient and no optimizer state) and of the critic + Adam that GRPO does not build; and
    what XLA's compiled RL block (--eval-every iterations) reserves there (memory_analysis; None if not reported)."""
    sizes, device = (slots_for(args), args.hidden_size, args.decoder_size), mesh.devices.flat[0]

    def adam(model):
        return nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param)

    policy = Policy(*sizes, rngs=nnx.Rngs(run_keys(args.seed).init))
    graphdef, state = nnx.split(TrainState(policy, adam(policy)))
    state = place(state, args.rules)  # as train() places it
    critic = critic_layers(*sizes, rngs=nnx.Rngs(args.seed))
    critic_state = place(nnx.state((critic, adam(critic))), args.rules)  # the critic and its Adam, never trained
    run = jax.jit(partial(train_block, graphdef, nnx.graphdef(policy), GRPOConfig.from_args(args), sizes[0]))
    keys = jax.random.split(jax.random.key(0), args.eval_every)
    x, y = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    analysis = run.lower(state, state["policy"], 0, x, y, keys).compile()
    stats = analysis.memory_analysis()
    compiled = None
    if stats is not None:
        compiled = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
    return {
        "devices": mesh.size,
        "mesh": dict(mesh.shape),
        "rules": args.rules,
        "policy_adam_bytes": bytes_on(state, device),
        "policy_adam_bytes_total": sum(a.nbytes for a in jax.tree.leaves(state)),
        "reference_bytes": bytes_on(state["policy"], device),
        "critic_adam_bytes": bytes_on(critic_state, device),
        "compiled_block": compiled,
    }


# ---- The parameter table: what dropping the critic saves
def critic_layers(n_slots: int, hidden_size: int, decoder_size: int, *, rngs: nnx.Rngs) -> nnx.Dict:
    """The layers of PPO's value network V(x) = out(relu(trunk(relu(encoder(images)) · slots))) (P,), the policy's
    widths with one output. GRPO has no critic: these are never called or trained, only counted (param_table) and
    laid out on a mesh (mesh_memory)."""
    return nnx.Dict(
        encoder=nnx.Linear(784, hidden_size, **named(("pixels", "features")), rngs=rngs),
        trunk=nnx.Linear(n_slots * hidden_size, decoder_size, **named(("inputs", "hidden")), rngs=rngs),
        out=nnx.Linear(decoder_size, 1, **named(("hidden", "value")), rngs=rngs),
    )


def count_params(model: nnx.Module) -> int:
    return sum(int(p.size) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


# Mixed-precision Adam, per trained parameter: a bfloat16 weight and gradient, and float32 master weight, m and v
BYTES_PER_PARAM = 2 + 2 + 4 + 4 + 4
MEMORY_RULE = "bf16 weight 2 + bf16 gradient 2 + fp32 master weight 4 + Adam's fp32 m 4 and v 4 = 16 B"
LLM_ACTOR_PARAMS = 8e9  # the policy size the table scales to, a common language model's


def param_table(args: Args) -> tuple[str, dict]:
    """Policy only (GRPO) vs policy + critic (PPO), counted from the models and scaled to an 8B policy."""
    sizes = (slots_for(args), args.hidden_size, args.decoder_size)
    actor = count_params(Policy(*sizes, rngs=nnx.Rngs(0)))
    critic = count_params(critic_layers(*sizes, rngs=nnx.Rngs(0)))
    scale = LLM_ACTOR_PARAMS / actor  # an 8B policy; its critic shares the encoder and width, with a 1-unit head
    rows = [
        ("policy only (GRPO)", actor),
        ("critic V(x) (PPO only)", critic),
        ("policy + critic (PPO)", actor + critic),
    ]
    lines = [f"memory per trained parameter, mixed-precision Adam: {MEMORY_RULE}"]
    lines.append(f"{'model':<24}{'params here':>13}{'scaled to 8B policy':>21}{'train state, 16 B/param':>25}")
    for name, count in rows:
        lines.append(
            f"{name:<24}{count:>13,}{count * scale / 1e9:>20.2f}B{count * scale * BYTES_PER_PARAM / 1e9:>22.1f} GB"
        )
    saved = critic / (actor + critic)
    lines.append(
        f"GRPO drops the critic: {saved:.1%} of PPO's parameters, "
        f"{critic * scale * BYTES_PER_PARAM / 1e9:.1f} GB of training state at the 8B scale"
    )
    return "\n".join(lines), {"params_policy": actor, "params_critic": critic, "critic_share": saved}


# ---- Checkpoints and the figure
LOAD_HINT = "was it saved with another --hidden-size, --decoder-size, --task or --max-digits?"  # what shapes the arrays


def save_checkpoint(path: str, parts: dict) -> None:
    """parts: name -> nnx.Module (its nnx.Param arrays) or array. One flat .npz, no pickle: a module's leaf at path
    ('hidden1', 'kernel') is stored under 'name/hidden1/kernel' (checkpoint_key), an array under its name."""
    arrays = {}
    for name, part in parts.items():
        if isinstance(part, nnx.Module):
            pure = nnx.to_pure_dict(nnx.state(part, nnx.Param))  # nested dict: {'hidden1': {'kernel': …}, …}
            for keys, leaf in jax.tree_util.tree_leaves_with_path(pure):
                arrays[checkpoint_key(name, keys)] = np.asarray(leaf)
        else:
            arrays[name] = np.asarray(part)
    np.savez(path, **arrays)


def load_checkpoint(path: str, parts: dict, hint: str) -> dict:
    """Fill every Module in `parts` in place from `path` (nnx.replace_by_pure_dict) and return the arrays stored
    under the other names; their values in `parts` give the expected shapes and dtypes. A missing, corrupt or
    mismatched file, or one that holds arrays this run has no place for, is an InputError of one line (a shape or a
    name that does not fit ends with `hint`)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = dict(f)
    except Exception as e:  # missing, truncated, not an .npz, pickled objects …
        raise InputError(f"--load {path}: not a readable .npz checkpoint ({type(e).__name__})") from None
    used = set()

    def stored(key: str, like) -> np.ndarray:  # the array saved under `key`, with the shape and dtype of `like`
        if key not in arrays or arrays[key].shape != np.shape(like):
            found = arrays[key].shape if key in arrays else "missing"
            raise InputError(f"--load {path}: {key} should have shape {np.shape(like)}, found {found} ({hint})")
        if arrays[key].dtype != like.dtype:  # loaded as it is: int32 weights would be a broken network
            raise InputError(f"--load {path}: {key} should hold {like.dtype}, found {arrays[key].dtype}")
        used.add(key)
        return arrays[key]

    filled = {}  # every array is checked before any module changes: a refused file changes nothing
    for name, part in parts.items():
        if isinstance(part, nnx.Module):
            filled[name] = jax.tree_util.tree_map_with_path(
                lambda keys, leaf, name=name: jnp.asarray(stored(checkpoint_key(name, keys), leaf)),
                nnx.to_pure_dict(nnx.state(part, nnx.Param)),
            )
        else:
            filled[name] = stored(name, part)
    if set(arrays) - used:
        raise InputError(f"--load {path}: {min(set(arrays) - used)} has no place in this run ({hint})")
    for name, part in parts.items():
        if isinstance(part, nnx.Module):
            state = nnx.state(part, nnx.Param)
            nnx.replace_by_pure_dict(state, filled[name])
            nnx.update(part, state)
    return {name: value for name, value in filled.items() if not isinstance(parts[name], nnx.Module)}


def checkpoint_key(name: str, keys) -> str:
    """'q_network/hidden1/kernel': the .npz key of the leaf at path ('hidden1', 'kernel') of the part called name."""
    return f"{name}/{jax.tree_util.keystr(keys, simple=True, separator='/')}"


def plot_scores(ax, history: list[dict], k: int) -> list[int]:
    """Validation pass@1, pass@k and greedy exact match (%) of every scored row on `ax`, the SFT steps at x ≤ 0 (so
    RL starts at 0); returns the rows' x values. plot_curve's first panel (tools/grpo_figures.py draws it too)."""
    sft = max((h["iteration"] for h in history if h["phase"] == "sft"), default=0)
    steps = [h["iteration"] - (sft if h["phase"] in ("start", "sft") else 0) for h in history]
    for key, style, text in (
        ("val_pass1", "o-", "pass@1"),
        (f"val_pass{k}", "d-", f"pass@{k}"),
        ("val_greedy", "s-", "greedy"),
    ):
        ax.plot(steps, [100 * h[key] for h in history], style, label=f"{text} (validation)")
    return steps


def plot_curve(path: str, history: list[dict], k: int, test: dict, title: str) -> None:
    """Per block of iterations: validation pass@1, pass@k and greedy exact match with the training reward; the clip
    and zero-signal shares (RL only); the answer lengths and the KL to π_ref. Test scores are stars at the end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [h for h in history if h["phase"] == "rl"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    score_axis, share_axis, length_axis = axes
    steps = plot_scores(score_axis, history, k)
    trained = [h for h in history if "reward" in h]
    score_axis.plot(
        [steps[history.index(h)] for h in trained], [100 * h["reward"] for h in trained], "x--", label="train reward"
    )
    for key, text in (("test_pass1", "pass@1"), ("test_greedy", "greedy")):
        if key in test:
            score_axis.plot([steps[-1]], [100 * test[key]], "k*", ms=10, label=f"test {text} (scored once)")
    score_axis.set(xlabel="iteration (SFT steps at x ≤ 0)", ylabel="%", title="validation scores")
    for key, style, text in (
        ("clip_frac", "o-", "clip binds (clip_frac)"),
        ("outside_frac", "x--", "ratio outside [1 − ε, 1 + ε]"),
        ("zero_signal", "s-", "groups with all-equal rewards"),
    ):
        share_axis.plot([h["iteration"] for h in rl], [100 * h.get(key, 0) for h in rl], style, label=text)
    share_axis.set(xlabel="RL iteration", ylabel="% of tokens / groups", title="clip and zero-signal shares")
    length_axis.plot(steps, [h["val_length"] for h in history], "o-", label="answer length (tokens)")
    length_axis.plot(steps, [h["val_wrong_length"] for h in history], "x--", label="length of wrong answers")
    if rl:  # π_ref is the policy at the start of RL (x = 0): its KL starts there, at 0
        kl_x, kl_y = [0] + [h["iteration"] for h in rl], [0.0] + [h["val_kl_ref"] for h in rl]
    else:  # supervised: π_ref stays the initial policy
        kl_x, kl_y = steps, [h["val_kl_ref"] for h in history]
    length_axis.plot(kl_x, kl_y, "^-", label="KL(π ‖ π_ref) per answer (nats)")
    length_axis.set(xlabel="iteration", title="lengths and KL to π_ref")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- main: check the flags, load the data, train, score the test set once, save
def run_label(args: Args) -> str:
    task = f"task {args.task}" + (f" (1-{args.max_digits} digits)" if args.task == "number" else "")
    sft = f"SFT {sft_steps_for(args)} steps on {args.label_fraction:.0%} of labels"
    if args.objective == "supervised":
        return f"{task}, supervised: {sft} + {args.iterations} more"
    kl = f"β={args.beta}, kl {args.kl}" if args.beta > 0 else "β=0"
    refresh = f", π_ref refreshed every {args.ref_refresh}" if args.ref_refresh else ""
    return (
        f"{task}, {sft}, then grpo: G={args.group_size}, μ={args.inner_steps}, {kl}{refresh}, "
        f"{args.loss_agg}, reward {args.reward}" + (", zero-variance groups dropped" if args.drop_zero_var else "")
    )


def print_header(args: Args, data: Data, label: str, mesh: jax.sharding.Mesh) -> dict:
    """Print the data, the run, the mesh and the parameter table (GRPO vs PPO); return the counts for metrics.json."""
    print(f"data: {data.source}", flush=True)
    kind = mesh.devices.flat[0].platform
    print(
        f"mesh: data {mesh.shape['data']} × model {mesh.shape['model']} over {mesh.size} {kind} device(s), "
        f"rules {args.rules}: {RULE_SETS[args.rules]}",
        flush=True,
    )
    print(
        f"run: {label}, batch {args.batch_size} prompts, learning rate {args.learning_rate}, "
        f"{args.iterations} iterations, seed {args.seed}",
        flush=True,
    )
    table, param_counts = param_table(args)
    print(table, flush=True)
    return param_counts


def score_test_set(args: Args, policy: Policy, reference: Policy, data: Data) -> dict:
    """evaluate() on the held-out test prompts, called once, after training: test_pass1, test_pass{k}, ..."""
    strips = fixed_strips(data.x_test, data.y_test, slots_for(args))
    key = run_keys(args.seed).test
    evaluate_test = jax.jit(partial(evaluate, nnx.graphdef(policy)), static_argnums=4)
    raw = evaluate_test(nnx.state(policy), nnx.state(reference), strips, key, args.eval_samples)
    return scores(raw, args.eval_samples, args.pass_k, "test_")


def evaluate_saved(args: Args, data: Data, out: Outputs) -> dict:
    """--load: score a saved policy as a training run scores its final policy (validation with train()'s
    evaluation key, the test set with score_test_set's, both drawn from --seed), so the run's flags reproduce its
    final scores; writes <out>/eval/metrics.json. policy.npz holds no π_ref, so no KL to it is reported."""
    policy = Policy(slots_for(args), args.hidden_size, args.decoder_size, rngs=nnx.Rngs(0))  # filled from --load
    load_checkpoint(args.load, {"policy": policy}, LOAD_HINT)
    nnx.update(policy, place(nnx.state(policy), args.rules))  # laid out on the mesh as train() lays it out
    print(f"data: {data.source}\nloaded {args.load}", flush=True)
    eval_key = run_keys(args.seed).val  # train()'s validation key
    score = jax.jit(partial(evaluate, nnx.graphdef(policy)), static_argnums=4)
    val = fixed_strips(data.x_val, data.y_val, slots_for(args))
    state = nnx.state(policy)  # also π_ref's stand-in, here and on test: that KL (0) is dropped below
    results = scores(score(state, state, val, eval_key, args.eval_samples), args.eval_samples, args.pass_k, "val_")
    if args.score_test:
        results.update(**score_test_set(args, policy, policy, data), test_prompts=len(data.y_test))
    results = {k: v for k, v in results.items() if not k.endswith("_kl_ref")}
    results.update(loaded=args.load, val_prompts=len(data.y_val), data=data.source, args=asdict(args))
    out.commit(results)
    print_summary(args, results, f"policy loaded from {args.load}, scored with the keys of seed {args.seed}")
    return results


def print_summary(args: Args, results: dict, label: str) -> None:
    k = args.pass_k
    print("---- summary ----")
    print(f"data:            {results['data']}")
    print(f"run:             {label}")
    for split in ("val", "test"):
        if f"{split}_pass1" not in results:
            print("test:            not scored (--no-score-test)")
            continue
        print(
            f"{split + ':':<17}pass@1 {results[f'{split}_pass1']:.4f}  pass@{k} {results[f'{split}_pass{k}']:.4f}  "
            f"greedy {results[f'{split}_greedy']:.4f}  length {results[f'{split}_length']:.2f} "
            f"(wrong answers {results[f'{split}_wrong_length']:.2f})"
            + (f"  KL to π_ref {results[f'{split}_kl_ref']:.3f}" if f"{split}_kl_ref" in results else "")
        )
    if "clip_frac" in results:
        binds = "ρ > 1+ε with A > 0, or ρ < 1−ε with A < 0"
        where = "last block, inner steps 2..μ, share of all answer tokens"
        print(f"clip_frac:       {results['clip_frac']:.4f}  ({where}; the clip binds: {binds})")
        print(f"outside_frac:    {results['outside_frac']:.4f}  (last block; |ρ − 1| > ε, whatever the sign of A)")
        print(f"zero_signal:     {results['zero_signal']:.4f}  (last block; groups whose G rewards are all equal)")
    if "mesh" in results:
        m, kb = results["mesh"], lambda n: f"{n / 1000:,.1f} kB"  # kB = 1,000 bytes, as GB = 10⁹ in module 5
        print(
            f"per device:      policy + Adam {kb(m['policy_adam_bytes'])} (of {kb(m['policy_adam_bytes_total'])}), "
            f"π_ref {kb(m['reference_bytes'])}, a critic + Adam would add {kb(m['critic_adam_bytes'])} (shards)"
        )
        c = m["compiled_block"]
        text = "not reported by this backend" if c is None else ", ".join(f"{k} {kb(v)}" for k, v in c.items())
        print(f"compiled block:  {text}  (XLA memory_analysis of {args.eval_every} RL iterations, per device)")
    if "train_seconds" in results:
        print(f"train_seconds:   {results['train_seconds']:.1f}  (SFT, RL and validation scoring)")
    files = "metrics.json" if args.load else "metrics.json, learning_curve.png, policy.npz"
    print(f"outputs:         {output_folder(args)}/{files}", flush=True)


def use_compile_cache(folder: str) -> None:
    """Keep every compiled XLA program on disk, so the next run with the same shapes skips compilation.
    Must run before the first compilation. The numbers do not change, only the start-up time."""
    if folder:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default: only programs > 1 s
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def stopped_at(args: Args, history: list[dict]) -> dict | None:
    """Where Ctrl-C ended training, as metrics.json records it: the phase and iteration of the last scored row.
    None when that row is the last phase's last iteration: training ran to the end."""
    last, final = history[-1], "rl" if args.objective == "grpo" else "supervised"
    if (last["phase"], last["iteration"]) == (final, args.iterations):
        return None
    phase = last["phase"] if last["phase"] != "start" else "sft" if sft_steps_for(args) else final
    total = sft_steps_for(args) if phase == "sft" else args.iterations
    return {"unit": f"{phase} iteration", "at": last["iteration"], "of": total}


@reports_input_errors
def main(args: Args) -> dict:
    validate(args)  # flag values, before any work
    files = {} if args.load else {"learning_curve.png": True, "policy.npz": True}
    out = Outputs(output_folder(args), files)  # a writable folder, this run's alone
    mesh = make_mesh(args, start_devices(args))  # before any other JAX operation: --host-devices must come first
    use_compile_cache(args.compile_cache)
    data = load_data(args)
    if not args.score_test:  # the test images are dropped before training: nothing below can read them
        data = data._replace(x_test=None, y_test=None)
    if args.load:  # score a saved policy, no training
        with jax.set_mesh(mesh):
            return evaluate_saved(args, data, out)
    label = run_label(args)
    param_counts = print_header(args, data, label, mesh)
    title = f"{label} | train {len(data.y_train)} / validation {len(data.y_val)} images"

    with jax.set_mesh(mesh):  # every placement and sharding constraint below refers to this mesh
        policy, reference, history, timings = train(args, data)
        if not history:
            raise KeyboardInterrupt  # before the first validation score: nothing measured, nothing to write
        early = stopped_at(args, history)  # where a stop (Ctrl-C, SIGTERM) ended training early
        last = history[-1]
        results = {k: v for k, v in last.items() if k.startswith("val_")}
        run = {
            **{k: last[k] for k in PROGRESS if k in last},
            "iterations": args.iterations,
            "sft_steps": sft_steps_for(args),
            "labelled_images": labelled_count(args, len(data.y_train)),
            **timings,
            "train_images": len(data.y_train),
            "val_prompts": len(data.y_val),
            "data": data.source,
            **param_counts,
            "history": history,
            "args": asdict(args),
        }
        # A stop from here on keeps the training: its scores (`interrupted` says where), the policy and the curve.
        finished = {"unit": f"{last['phase']} iteration", "at": last["iteration"], "of": args.iterations}
        on_mesh = bool(args.host_devices or args.mesh)  # a run on a mesh also measures what each device holds
        later = ["the test scores"] * args.score_test + ["the mesh measurement"] * on_mesh
        stopped = early or bool(Outputs.signals)  # or came at its very end: nothing more is scored
        during = "the test scoring" if args.score_test else "the mesh measurement" if on_mesh else "saving"
        missing = ["the rest of training", *later] if early else later
        out.keep({**results, **run, "interrupted": early or finished}, "training" if stopped else during, missing)
        out.write("policy.npz", save_checkpoint, {"policy": policy})
        out.write("learning_curve.png", plot_curve, history, args.pass_k, {}, title)
        if stopped:
            raise KeyboardInterrupt  # nothing more is scored
        if args.score_test:  # the test set is scored once, here, after every choice on validation
            results.update(**score_test_set(args, policy, reference, data), test_prompts=len(data.y_test))
        if on_mesh:
            stars = ["the test scores on the curve"] * args.score_test
            out.keep(
                {**results, **run, "interrupted": finished}, "the mesh measurement", ["the mesh measurement", *stars]
            )
            results["mesh"] = mesh_memory(args, data, mesh)
    results.update(run)
    if args.score_test:  # the curve again, with the test scores
        out.keep({**results, "interrupted": finished}, "drawing", ["the test scores on the curve"])
        test = {k: v for k, v in results.items() if k.startswith("test_")}
        out.write("learning_curve.png", plot_curve, history, args.pass_k, test, title)
    out.commit(results)
    print_summary(args, results, label)
    return results


if __name__ == "__main__":
    main(parse_args())
