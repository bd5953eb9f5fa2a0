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
greedy) → the training loop → the test set, scored once. Below the `# Plumbing` banner: the command line and this
run's folder, checks, reading and splitting MNIST, the device mesh and the processes of a `--distributed` run, the orbax
checkpoint and `--load`, the figure, printing (with the parameters a critic would add), metrics.json and main.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from operator import ge, gt, le
from pathlib import Path
from typing import NamedTuple

if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load waits for main(), which reports it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax._src import distributed  # its global_state.client, for peers()
from jax.experimental import multihost_utils
from tensorflow_probability.substrates.jax import distributions as tfd  # TFP on JAX: no TensorFlow needed


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag, with the bounds check_flags tests."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass(frozen=True)  # frozen, so hashable: the compiled updates read it as a static argument
class Args:
    seed: int = flag(0, "seeds everything: one split of jax.random.key(seed) gives weights, training, val, test", min=0)
    host_devices: int = flag(0, "fake N CPU devices before JAX starts (0: the devices there are)", min=0)
    rules: str = flag(
        "dp", "logical-axis rules: dp (split the prompts) or fsdp (also the large weights)", choices=("dp", "fsdp")
    )
    distributed: bool = flag(False, "call jax.distributed.initialize() first: one process per host in a multi-host run")
    coordinator_address: str = flag("", "with --distributed: host:port of process 0; empty = auto-detect")
    num_processes: int = flag(0, "with --distributed: how many processes in all; 0 = auto-detect", min=0)
    process_id: int = flag(-1, "with --distributed: this process's rank, 0..num_processes-1; -1 = auto-detect", min=-1)
    join_timeout: int = flag(300, "with --distributed: seconds to wait for every process to join", min=1)
    task: str = flag(
        "number",
        "digit: one image, answer its digit; number: a strip of 1 to --max-digits images, answer the number",
        choices=("digit", "number"),
    )
    max_digits: int = flag(4, "with --task number: the longest strip (and answer); --task digit uses 1", min=1, max=8)
    split_test_set: int = flag(
        8000, "train on this many of the t10k digits, test on the rest (unused if --data-dir holds all four)", min=1
    )
    val_size: float = flag(
        0.1, "share of the training images held out for validation, where every choice is made", gt=0, max=0.5
    )
    score_test: bool = flag(True, "score the test set once, after training (--no-score-test: leave it unread)")
    data_dir: str = flag(
        "", "read the IDX .gz files from this folder: the t10k pair, split as above, or all four (train and test)"
    )
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
    out: str = flag("runs/grpo_mnist", "each run's folder goes here; <out>/latest is the newest complete run")
    load: str = flag("", "score a saved policy/ checkpoint on validation (and test) without training; into <out>/eval/")
    compile_cache: str = flag(
        "~/.cache/jax-rl-course", "JAX's persistent compilation cache: later runs skip compiling ('' turns it off)"
    )

    @property
    def batch_axis(self) -> str | None:  # the mesh axis the prompts are split along: --rules' rule for 'batch'
        return dict(RULE_SETS[self.rules]).get("batch")


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


def draw_prompts(key, n_images: int, n_prompts: int, n_slots: int) -> tuple[jax.Array, jax.Array]:
    """A fresh training batch as image IDs, the way a language model's prompts are token IDs: idx (P, N), every slot
    an image index drawn uniformly from 0..n_images-1, and lengths (P,), every length in 1..N equally likely.
    make_strips(x, y, idx, lengths) looks the images up, as a language model looks up its token embeddings."""
    k_idx, k_len = jax.random.split(key)
    idx = jax.random.randint(k_idx, (n_prompts, n_slots), 0, n_images)
    return idx, jax.random.randint(k_len, (n_prompts,), 1, n_slots + 1)


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
class Rollout(NamedTuple):
    tokens: jax.Array  # (S, N), S = B·G answers; the G answers to a prompt are adjacent rows
    mask: jax.Array  # (S, N) completion mask, zeroed for dropped groups
    logp_old: jax.Array  # (S, N) log π_old of each sampled token
    adv: jax.Array  # (S, 1) one advantage per answer, shared by its tokens
    ref_logits: jax.Array | None  # (S, N, VOCAB) π_ref at every position (None when β = 0)


def grpo_loss(policy: Policy, strips: Strips, rollout: Rollout, args: Args):
    """−aggregate(min(ρ_t A, clip(ρ_t) A) − β·KL_t) over the answer tokens; returns (loss, metrics)."""
    prompt = jnp.repeat(policy.encode(strips.images, strips.slots), args.group_size, axis=0)  # (S, decoder_size)
    logits = policy(prompt, rollout.tokens)  # (S, N, VOCAB)
    logp = token_logp(logits, rollout.tokens)
    objective, binds, outside = clipped_surrogate(logp, rollout.logp_old, rollout.adv, args.clip_eps)
    per_token = -objective
    answer = completion_mask(rollout.tokens)  # every answer token, dropped groups included: the same denominator
    metrics = {"clip_frac": aggregate(binds, answer, "token-mean")}
    metrics["outside_frac"] = aggregate(outside, answer, "token-mean")
    if args.beta > 0:
        kl = token_kl(logits, rollout.ref_logits, rollout.tokens, args.kl)
        per_token = per_token + args.beta * kl
        metrics["kl"] = aggregate(kl, rollout.mask, "token-mean")
    loss = aggregate(per_token, rollout.mask, args.loss_agg)
    return loss, {"loss": loss, **metrics}


def sft_loss(policy: Policy, strips: Strips):
    """Cross-entropy of the target answer (its digits and EOS), teacher-forced, averaged over its tokens."""
    logits = policy(policy.encode(strips.images, strips.slots), strips.target)
    loss = aggregate(-token_logp(logits, strips.target), completion_mask(strips.target), "token-mean")
    return loss, {"loss": loss}


# ---- The compiled updates: one GRPO iteration, one SFT step; a block of them is one lax.scan
def rollout_groups(policy: Policy, reference: Policy, strips: Strips, key, args: Args):
    """Sample G answers per prompt from π_old (the current policy), score them, and fix everything the μ steps
    reuse. Returns (Rollout, metrics)."""
    prompt = jnp.repeat(policy.encode(strips.images, strips.slots), args.group_size, axis=0)  # (S, decoder_size)
    tokens = generate(policy, prompt, key)
    logp_old = jax.lax.stop_gradient(token_logp(policy(prompt, tokens), tokens))
    target = jnp.repeat(strips.target, args.group_size, axis=0)
    rewards = verify(tokens, target, args.reward == "partial").reshape(-1, args.group_size)  # (B, G)
    if args.group_mode == "prompt":
        adv = group_advantages(rewards, args.adv_eps, args.adv_norm)
        signal = has_signal(rewards)  # (B,): False where all G rewards are equal, so every A is 0
    else:
        adv = batch_advantages(rewards, args.adv_eps, args.adv_norm)
        signal = jnp.full(rewards.shape[0], has_signal(rewards.reshape(1, -1))[0])
    mask = completion_mask(tokens)
    if args.drop_zero_var:
        mask = mask * jnp.repeat(signal, args.group_size)[:, None]
    ref_logits = None
    if args.beta > 0:
        ref_logits = reference(jnp.repeat(reference.encode(strips.images, strips.slots), args.group_size, 0), tokens)
    rollout = Rollout(tokens, mask, logp_old, adv.reshape(-1, 1), ref_logits)
    all_right = jnp.mean(rewards.min(axis=1) == 1)  # groups with every answer right: no signal, nothing left to fix
    return rollout, {"reward": rewards.mean(), "zero_signal": 1 - signal.mean(), "all_right": all_right}


def grpo_update(policy, optimizer, reference, strips: Strips, key, args: Args) -> dict:
    """One GRPO iteration: a rollout from π_old, then μ gradient steps on it (after the first, ρ ≠ 1)."""
    rollout, metrics = rollout_groups(policy, reference, strips, key, args)
    grad_fn = nnx.value_and_grad(grpo_loss, has_aux=True)
    steps = []
    for _ in range(args.inner_steps):
        (_, aux), grads = grad_fn(policy, strips, rollout, args)
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


def train_block(graphdef, policy_def, args: Args, state, ref_state, step0, x, y, keys, prompts):
    """len(keys) iterations as one lax.scan. state = nnx.state(TrainState), ref_state = π_ref's state
    (policy_def is its graphdef), replaced by the policy's every args.ref_refresh iterations if that is > 0.
    prompts = (idx, lengths) from draw_prompts, (T, B, N) and (T, B) for T = len(keys) iterations, whose images
    are looked up in (x, y). The NNX objects are rebuilt inside the traced step (nnx.merge) and split back out,
    so Python and NNX bookkeeping run once, at trace time."""

    def one_iteration(carry, inputs):
        state, ref_state = carry
        step, update_key, (idx, lengths) = inputs
        policy, optimizer = nnx.merge(graphdef, state)
        strips = make_strips(x, y, idx, lengths)  # the batch's B prompts
        if args.batch_axis and not jax.sharding.get_abstract_mesh().empty:  # under jax.set_mesh: split the prompts
            strips = jax.lax.with_sharding_constraint(strips, jax.P(args.batch_axis))
        if args.objective == "grpo":
            reference = nnx.merge(policy_def, ref_state)
            metrics = grpo_update(policy, optimizer, reference, strips, update_key, args)
        else:
            metrics = sft_update(policy, optimizer, strips, update_key)
        if args.ref_refresh > 0:  # π_ref ← π_θ after every ref_refresh-th iteration
            refresh = (step + 1) % args.ref_refresh == 0
            ref_state = jax.tree.map(lambda new, old: jnp.where(refresh, new, old), nnx.state(policy), ref_state)
        return (nnx.state(TrainState(policy, optimizer)), ref_state), metrics

    steps = step0 + jnp.arange(len(keys))
    (state, ref_state), metrics = jax.lax.scan(one_iteration, (state, ref_state), (steps, keys, prompts))
    return state, ref_state, jax.tree.map(jnp.mean, metrics)


# ---- Evaluation: n sampled answers per prompt give pass@1 and pass@k; greedy decoding gives exact match
def pass_at_k(n: int, correct, k: int) -> float:
    """Unbiased pass@k from n samples per prompt, c of them correct (Chen et al., 2021):
    the mean over prompts of 1 − C(n − c, k) / C(n, k), the chance that k of the n samples include a right one."""
    return float(np.mean([1 - math.comb(n - int(c), k) / math.comb(n, k) for c in correct]))


def evaluate(policy_def, state, ref_state, strips: Strips, key, n_samples: int) -> dict:
    """On fixed prompts: `correct` (P,), how many of n answers sampled at temperature 1 are exactly right; the
    greedy exact match; the mean answer length (tokens in the completion mask) overall and of wrong answers;
    and the exact KL(π_θ ‖ π_ref) summed over each answer's tokens. A row without an image pads P to a multiple
    of the devices (eval_prompts): it counts in no mean, and scores() drops its `correct`."""
    policy, reference = nnx.merge(policy_def, state), nnx.merge(policy_def, ref_state)
    prompt = policy.encode(strips.images, strips.slots)
    real = strips.slots[:, 0]  # (P,) 1.0 for a prompt (its first slot always holds an image), 0.0 for padding
    greedy = jnp.mean(verify(generate(policy, prompt, key, greedy=True), strips.target) * real) / real.mean()
    prompts = jnp.repeat(prompt, n_samples, axis=0)  # (P·n, decoder_size)
    tokens = generate(policy, prompts, key)
    right = verify(tokens, jnp.repeat(strips.target, n_samples, axis=0))  # (P·n,) exact match, 0 or 1
    mask, answers = completion_mask(tokens), jnp.repeat(real, n_samples)  # answers: 1.0 for a real prompt's
    length = mask.sum(axis=1)
    ref_prompts = jnp.repeat(reference.encode(strips.images, strips.slots), n_samples, axis=0)
    kl = token_kl(policy(prompts, tokens), reference(ref_prompts, tokens), tokens, "exact")
    wrong = (1 - right) * answers
    return {
        "correct": right.reshape(-1, n_samples).sum(axis=1),
        "greedy": greedy,
        "length": jnp.mean(length * answers) / answers.mean(),
        "wrong_length": jnp.sum(length * wrong) / jnp.maximum(jnp.sum(wrong), 1),
        "kl_ref": jnp.mean(jnp.sum(kl * mask, axis=1) * answers) / answers.mean(),
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


def split_off(x: np.ndarray, y: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """(x, y) in one fixed shuffle, the same for every --seed: its first n images and labels, then the rest."""
    order = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    return x[order[:n]], y[order[:n]], x[order[n:]], y[order[n:]]


class RunKeys(NamedTuple):
    """The four random streams of a run, from one split of --seed's key, so no two of them share a key."""

    init: jax.Array  # nnx.Rngs(init) draws the initial weights' keys: fold_in(init, 0), fold_in(init, 1), …
    train: jax.Array  # split once per block: the block's prompts and sampled answers
    val: jax.Array  # the same key at every validation score: the rows differ only by the policy
    test: jax.Array  # the test set's sampled answers, scored once


def run_keys(seed: int) -> RunKeys:
    """split(key(seed), 4): the keys of the initial weights, training, validation and the test. nnx.Rngs(init)
    draws fold_in(init, n); with jax_threefry_partitionable on (the default in jax 0.12) split(k, 4)[i] is the very
    key fold_in(k, i), with it off it is not, so keys taken from key(seed) itself beside nnx.Rngs(seed) would repeat
    the initial weights' keys under the default. Splitting once keeps the four apart under either setting."""
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


def param_counts(args: Args) -> dict:
    """What dropping the critic saves: the policy's parameters, and those of the critic V(x) that PPO would train
    beside it, with the policy's widths and one output, V(x) = out(relu(trunk(relu(encoder(images)) · slots))): an
    encoder 784·H + H, a trunk N·H·D + D and a head D + 1 (tools/grpo_mesh.py builds it and lays it out)."""
    n, h, d = slots_for(args), args.hidden_size, args.decoder_size
    actor = sum(int(p.size) for p in jax.tree.leaves(nnx.state(Policy(n, h, d, rngs=nnx.Rngs(0)), nnx.Param)))
    critic = (784 * h + h) + (n * h * d + d) + (d + 1)
    return {"params_policy": actor, "params_critic": critic, "critic_share": critic / (actor + critic)}


LOGICAL_NAMES = ("batch", "pixels", "features", "inputs", "hidden", "vocab", "value")


def shardings(state, mesh: jax.sharding.Mesh, rules: str):
    """NamedSharding for every leaf of `state`, from its logical axis names: nnx.logical_axis_rules +
    nnx.get_named_sharding, with every name the rule set does not list replicated."""
    listed = {name for name, _ in RULE_SETS[rules]}
    with nnx.logical_axis_rules((*RULE_SETS[rules], *((n, None) for n in LOGICAL_NAMES if n not in listed))):
        return nnx.get_named_sharding(state, mesh)


def place(state, rules: str):
    """Put every array of `state` where the rules say, on the mesh set by jax.set_mesh (as is without one)."""
    mesh = jax.sharding.get_mesh()
    return state if mesh.empty else jax.device_put(state, shardings(state, mesh, rules))


def feed(tree, spec=jax.P()):  # noqa: B008 - P() is an immutable tuple
    """Host arrays → global arrays on the mesh of jax.set_mesh (jnp arrays without one). spec P(): a whole copy on
    every device. A PartitionSpec that splits dimension d: each process hands over only its own block of d, the p-th
    of P (jax.make_mesh lines up each process's devices), and jax.make_array_from_process_local_data joins them."""
    mesh, d = jax.sharding.get_mesh(), next((d for d, axis in enumerate(spec) if axis), None)  # d: the split one

    def local(a):  # this process's part of the global array
        a = np.asarray(a) if d is None else np.split(np.asarray(a), jax.process_count(), axis=d)[jax.process_index()]
        return jax.make_array_from_process_local_data(jax.sharding.NamedSharding(mesh, spec), a)

    return jax.tree.map(jnp.asarray if mesh.empty else local, tree)


def eval_prompts(x, y, args: Args) -> Strips:
    """A split's fixed strips, split over the devices along 'batch' like the training prompts: rows without an
    image pad them to a multiple of the devices on that axis (evaluate leaves them out)."""
    strips, mesh = fixed_strips(x, y, slots_for(args)), jax.sharding.get_mesh()
    pad = 0 if mesh.empty or not args.batch_axis else -len(y) % mesh.shape[args.batch_axis]
    return feed(jax.tree.map(lambda a: np.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)), strips), jax.P(args.batch_axis))


def scores(raw: dict, n: int, k: int, prefix: str, prompts: int | None = None) -> dict:
    """evaluate()'s arrays → floats over the first `prompts` rows (the rest pad): pass@1 (the mean reward of one
    sampled answer), pass@k, greedy, lengths, KL. Every process gathers the whole arrays (process_allgather)."""
    raw = multihost_utils.process_allgather(raw, tiled=True)  # numpy; across processes, a collective
    raw["correct"] = raw["correct"][:prompts]
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
    """One stretch of training: its name in the history, its flags, its iterations, its prompt pool."""

    name: str  # "sft", then "rl" (or "supervised", the baseline)
    args: Args  # --objective supervised for SFT
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
    x, y = feed((data.x_train, data.y_train))  # every device keeps all the images: copied once here, not per call
    val = eval_prompts(data.x_val, data.y_val, args)
    labelled = labelled_count(args, len(y))  # the training images are shuffled: SFT reads the first ones' labels
    sft = replace(args, objective="supervised", ref_refresh=0)
    phases = [Phase("sft", sft, sft_steps_for(args), x[:labelled], y[:labelled])]
    if args.objective == "grpo":
        phases.append(Phase("rl", args, args.iterations, x, y))
    else:  # the baseline: more of the same supervised steps
        phases.append(Phase("supervised", sft, args.iterations, x[:labelled], y[:labelled]))
    key = streams.train
    score = jax.jit(partial(evaluate, policy_def), static_argnums=4)  # the same streams.val at every score: less noise
    history, t0 = [], time.perf_counter()

    def record(row: dict, state, ref_state) -> None:
        """Score the policy in `state` on validation, keep the row and print it."""
        raw = score(state["policy"], ref_state, val, streams.val, n)
        row.update(scores(raw, n, args.pass_k, "val_", len(data.y_val)))
        history.append(row)
        print_progress(row)

    record({"phase": "start", "iteration": 0}, state, ref_state)  # the initial policy, scored once
    for phase in phases:
        if phase.name == "rl":
            ref_state = state["policy"]  # π_ref: a copy of the policy RL starts from
        run = jax.jit(partial(train_block, graphdef, policy_def, phase.args))
        draw = jax.vmap(partial(draw_prompts, n_images=len(phase.y), n_prompts=args.batch_size, n_slots=n_slots))
        iteration = 0  # iterations done in this phase
        while iteration < phase.steps:
            block, t_block = min(args.eval_every, phase.steps - iteration), time.perf_counter()
            key, block_key = jax.random.split(key)
            draw_keys, keys = jax.vmap(jax.random.split, out_axes=1)(jax.random.split(block_key, block))
            prompts = feed(draw(draw_keys), jax.P(None, args.batch_axis))  # each process places its own prompts
            state, ref_state, metrics = run(state, ref_state, iteration, phase.x, phase.y, keys, prompts)
            iteration += block
            row = {"phase": phase.name, "iteration": iteration, **{k: float(v) for k, v in metrics.items()}}
            row["seconds"] = time.perf_counter() - t_block
            record(row, state, ref_state)
    policy = nnx.merge(graphdef, state).policy
    return policy, nnx.merge(policy_def, ref_state), history, {"train_seconds": time.perf_counter() - t0}


def score_split(args: Args, policy: Policy, reference: Policy, data: Data, split: str) -> dict:
    """evaluate() on the fixed prompts of "val" or "test" with that split's key: the test set once, after training."""
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    evaluate_split = jax.jit(partial(evaluate, nnx.graphdef(policy)), static_argnums=4)
    key = getattr(run_keys(args.seed), split)  # "val": train()'s own, so a saved policy scores as it did there
    raw = evaluate_split(nnx.state(policy), nnx.state(reference), eval_prompts(x, y, args), key, args.eval_samples)
    return {**scores(raw, args.eval_samples, args.pass_k, f"{split}_", len(y)), f"{split}_prompts": len(y)}


# Plumbing: the command line, checks, reading MNIST, the mesh, checkpoints, the figure, printing, main -----------------
class RunError(Exception):
    """What ends a run early with one line on stderr and exit status 1: bad input, a full disk, a failed check."""


class Run:
    """This run's own folder, <--out>/<date>-<time>-seed<seed>. Each file is written under a temporary name, then moved
    into place; metrics.json comes last and marks a complete run, which <--out>/latest then points at."""

    def __init__(self, args):
        stamp, Run.active, self.saved, self.complete = time.strftime("%Y%m%d-%H%M%S"), self, [], False
        for n in range(1, 1000):  # a folder that exists is another run's: this one takes the next name
            self.folder = os.path.join(args.out, f"{stamp}-seed{args.seed}" + f"-{n}" * (n > 1))
            try:
                return os.makedirs(self.folder)
            except FileExistsError:
                continue
            except OSError as e:
                raise RunError(f"--out {args.out!r} is not a writable folder ({e.strerror})") from None

    def save(self, name: str, writer, *args) -> None:  # writer(path, *args) writes `name`: whole, or absent
        partial = os.path.join(self.folder, "partial-" + name)  # the same ending: savefig and PIL read it
        try:
            writer(partial, *args)
            os.replace(partial, os.path.join(self.folder, name))
        except OSError as e:
            raise RunError(f"{(e.strerror or type(e).__name__).lower()} while writing {name}") from None
        finally:  # what a full disk or a stop left half-written goes, and gives its space back
            shutil.rmtree(partial) if os.path.isdir(partial) else Path(partial).unlink(missing_ok=True)
        self.saved.append(name)

    def finish(self, metrics: dict) -> None:
        if Run.stops:  # a stop that a library callback swallowed: the run ends here, not complete
            raise KeyboardInterrupt
        self.save("metrics.json", lambda path: Path(path).write_text(json.dumps(metrics, indent=2)))
        self.complete, link = True, os.path.join(os.path.dirname(self.folder), f"partial-latest-{os.getpid()}")
        os.symlink(os.path.basename(self.folder), link)  # then moved into place: `latest` is never missing
        os.replace(link, os.path.join(os.path.dirname(self.folder), "latest"))

    def left(self) -> str:  # the end of the one line: what this run's folder holds now
        if self.complete:
            return f" once the run was complete; {self.folder} holds all of it"
        if not self.saved:
            return shutil.rmtree(self.folder, ignore_errors=True) or "; nothing written"
        return f"; kept in {self.folder}: {', '.join(self.saved)} (not complete: no metrics.json)"


def stop(signum, frame):  # SIGINT and SIGTERM end a run the same way: a KeyboardInterrupt, reported by one_line
    Run.stops.append(signum)
    raise KeyboardInterrupt


def one_line(main):
    """main(args), ended by one line on stderr unless it finishes: status 1 (RunError), 130 (Ctrl-C), 143 (SIGTERM)."""

    def run(args=None):
        cli, code, signals, hook = args is None, 0, {signal.SIGINT, signal.SIGTERM}, sys.unraisablehook
        handlers, Run.stops, Run.active = {s: signal.signal(s, stop) for s in signals}, [], None
        sys.unraisablehook = lambda u: u.exc_type is KeyboardInterrupt or hook(u)  # finish() sees a swallowed stop
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # one that came while the libraries loaded lands now
            metrics = main(args or parse_args())
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # done: a stop from here on waits for the exit
        except BaseException as e:  # after a stop, whatever a library made of its KeyboardInterrupt (JAX: ValueError)
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # stopping already: one line, then the exit
            if not (Run.stops or isinstance(e, (RunError, OSError))):
                raise  # a bug, or argparse's exit: as Python reports it
            rest = Run.active.left() if Run.active else "; nothing written"
            print(f"interrupted{rest}" if Run.stops else f"error: {e}{rest}", file=sys.stderr)
            code = 128 + Run.stops[0] if Run.stops else 1
        finally:
            if not cli:  # a test called main(args): its own handlers come back
                signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
                sys.unraisablehook, _ = hook, [signal.signal(s, h) for s, h in handlers.items()]
        if cli:  # exit at once: the files are complete, and Python's shutdown would outlive the handlers
            sys.stdout.flush(), sys.stderr.flush(), os._exit(code)
        return sys.exit(code) if code else metrics

    return run


def parse_args(argv=None) -> Args:  # one flag per field of Args; a malformed one is one line (main checks bounds)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.error = lambda message: sys.exit(f"error: {message} (see --help)")  # one line, not the usage
    for f in fields(Args):
        kind = {"type": type(f.default), "choices": f.metadata["choices"]}
        kind = {"action": argparse.BooleanOptionalAction} if isinstance(f.default, bool) else kind
        p.add_argument("--" + f.name.replace("_", "-"), default=f.default, help=f.metadata["help"], **kind)
    return Args(**vars(p.parse_args(argv)))


def check_flags(args) -> None:  # RunError, one line, for the first flag outside its flag()'s bounds
    for f in fields(args):
        v, m, name = getattr(args, f.name), f.metadata, "--" + f.name.replace("_", "-")  # choices: argparse checks
        for bound, op, ok in ((m["gt"], ">", gt), (m["min"], ">=", ge), (m["max"], "<=", le)):
            if bound is not None and not ok(v, bound):
                raise RunError(f"{name} must be {op} {bound}, got {v}")


def validate(args: Args) -> None:
    """Raise RunError on a flag outside its bounds, or one that does not fit the others."""
    check_flags(args)
    if args.group_mode == "prompt" and args.objective == "grpo" and args.group_size < 2:
        raise RunError(
            f"--group-size must be >= 2 with --group-mode prompt (a group of one always has advantage 0), "
            f"got {args.group_size}"
        )
    if args.pass_k > args.eval_samples:  # pass@k needs k of the n samples
        raise RunError(f"--pass-k must be at most --eval-samples ({args.eval_samples}), got {args.pass_k}")


# ---- The data: the IDX .gz files in 4_GRPO_MNIST/data/ or --data-dir, split by one fixed shuffle
IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
BUNDLED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # the t10k pair, see data/README.md


def load_idx_split(folder: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's two files → images (N, 784) float32 in [0, 1] and labels (N,) int32. Each is an IDX file of
    unsigned bytes, gzip-compressed: 0x00 0x00 0x08 ndim | ndim big-endian uint32 sizes | the bytes."""
    arrays = []
    for name, sizes in zip(IDX_FILES[split], ((28, 28), ())):  # N images of 28 × 28, then one label per image
        path = os.path.join(folder, name)
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise RunError(f"{path} not found") from None
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile, a truncated stream, a bad CRC
            raise RunError(f"{path} is not a complete gzip file ({e})") from None
        n = len(arrays[0]) if arrays else int.from_bytes(raw[4:8], "big")
        header = np.array([0x801 + len(sizes), n, *sizes], ">u4").tobytes()  # 0x00 0x00 0x08 ndim, the sizes
        if raw[: len(header)] != header or len(raw) != len(header) + n * math.prod(sizes):
            raise RunError(f"{path} is truncated or corrupt: not an IDX file of unsigned bytes of shape {(n, *sizes)}")
        arrays.append(np.frombuffer(raw, np.uint8, offset=len(header)).reshape(n, *sizes))
    if arrays[1].max(initial=0) > 9:
        raise RunError(f"{path}: labels must be digits 0-9, found {arrays[1].max()}")
    return arrays[0].reshape(n, -1).astype(np.float32) / 255.0, arrays[1].astype(np.int32)


def load_data(args: Args) -> Data:
    """Train, validation and test arrays: the two t10k files in 4_GRPO_MNIST/data/ (or in --data-dir), whose first
    --split-test-set images in `split_off`'s shuffle train and the rest test; a --data-dir that also holds the train
    pair gives the official train and test splits (tools/grpo_full_mnist.py writes the four files). Validation is
    carved from the training images the same way: round(--val-size · N) of them, at least one."""
    folder = args.data_dir or BUNDLED_DIR
    x_test, y_test = load_idx_split(folder, "test")
    if os.path.exists(os.path.join(folder, IDX_FILES["train"][0])):  # all four files: the official splits
        x_train, y_train = load_idx_split(folder, "train")
        source = f"IDX files in {folder}: train split"
    else:
        n = args.split_test_set
        if n >= len(y_test):
            raise RunError(f"--split-test-set must be below the {len(y_test)} test images, got {n}")
        x_train, y_train, x_test, y_test = split_off(x_test, y_test, n)
        origin = f"IDX files in {folder}" if args.data_dir else "MNIST test digits bundled in 4_GRPO_MNIST/data"
        source = f"{origin}: test split shuffled, first {n} for training"
    if len(y_train) < 2:
        raise RunError(f"need at least 2 training images to carve a validation split, got {len(y_train)}")
    n_val = max(1, round(args.val_size * len(y_train)))  # --val-size <= 0.5 leaves at least one to train on
    x_val, y_val, x_train, y_train = split_off(x_train, y_train, n_val)
    source = f"{source} -> train {len(y_train)} / val {len(y_val)}; test {len(y_test)}"
    return Data(x_train, y_train, x_val, y_val, x_test, y_test, source)


# ---- The device mesh: fake CPU devices, the processes of a --distributed run, the (data, model) mesh
def start_devices(args: Args) -> list:
    """The devices to build the mesh from, every process's once a --distributed run has joined. --host-devices N asks
    JAX for N CPU devices per process before its first operation (the flag only shapes the CPU backend: on a GPU or
    TPU host the accelerators are used); a JAX that has already started keeps its devices, and the header says how
    many."""
    if args.host_devices:
        with contextlib.suppress(RuntimeError):  # JAX had already started (a test, a notebook)
            jax.config.update("jax_num_cpu_devices", args.host_devices)
    if args.distributed:
        join(args)
    return jax.devices("cpu") if args.host_devices else jax.devices()


SILENT, JOINED, LEAVING = 30, threading.Event(), threading.Event()  # seconds before a silent process counts as gone


def join(args: Args) -> None:
    """--distributed: join the others through JAX's coordination service, which runs in process 0 (flags left empty
    are auto-detected: SLURM, Open MPI, Kubernetes, Cloud TPU), refuse processes started with other flags, then
    `watch` them. A process that ends or dies then ends the others with one line, not with a hang or JAX's abort."""
    late = threading.Timer(
        args.join_timeout, end, [f"not every process joined within --join-timeout {args.join_timeout} s"]
    )
    late.start()  # after initialization_timeout, JAX itself would abort with a C++ trace
    jax.config.update("jax_enable_recoverability", True)  # a process that dies is for watch to report, not an abort
    jax.config.update("jax_enable_preemption_service", False)  # it would take SIGTERM, which stops a run here
    try:
        ids = (args.num_processes or None, None if args.process_id < 0 else args.process_id)
        wait = args.join_timeout + 60  # JAX's own limit, after the Timer's
        jax.distributed.initialize(args.coordinator_address or None, *ids, initialization_timeout=wait)
    except Exception as e:  # noqa: BLE001 - any failure to join is a one-line error
        raise RunError(f"jax.distributed.initialize() failed: {str(e).splitlines()[0]}") from None
    finally:
        late.cancel()
    JOINED.set()
    same = json.dumps({k: v for k, v in asdict(args).items() if k not in ("process_id", "out")})  # all must share
    if len(set(multihost_utils.process_allgather(np.int32(zlib.crc32(same.encode()) >> 1)).tolist())) > 1:
        raise RunError("the processes were started with different flags (only --process-id and --out may differ)")
    threading.Thread(target=watch, daemon=True).start()


def peers():  # JAX's client of its coordination service, a key-value store (no public name yet); None until joined
    return distributed.global_state.client if JOINED.is_set() else None


def watch() -> None:
    """A thread: once a second, tell the others this process is alive (alive/<rank>: a count that goes up) and look
    at them: one that said it ends (under ended/), or whose count has stood still for SILENT s, ends this one too."""
    me = str(jax.process_index())
    seen = {str(rank): (None, time.monotonic()) for rank in range(jax.process_count())}  # rank: (count, since when)
    with contextlib.suppress(Exception):  # the client is gone: this process is shutting down
        for beat in itertools.count():
            peers().key_value_set(f"alive/{me}", str(beat), allow_overwrite=True)
            if LEAVING.wait(1):
                return
            for key, count in peers().key_value_dir_get("alive/"):
                if seen[key[6:]][0] != count:  # it counted on since the last look
                    seen[key[6:]] = (count, time.monotonic())
            ended = [(k[6:], why) for k, why in peers().key_value_dir_get("ended/") if k[6:] != me and why != "done"]
            silent = [rank for rank, (_, since) in seen.items() if time.monotonic() - since > SILENT]
            if ended:
                end(f"process {ended[0][0]} ended: {ended[0][1]}")
            if silent:  # the dead cannot answer: leave waits for no one
                end(f"process {silent[0]} fell silent for {SILENT} s (killed, or its host is down)", wait=False)


def leave(why: str, wait: bool = True) -> None:
    """Tell the others why this process ends. Process 0, whose coordination service they need in order to end with
    one line, first waits (10 s at most) until every other process has said it ends too."""
    LEAVING.set()
    if peers() is not None:  # joined
        peers().key_value_set(f"ended/{jax.process_index()}", why, allow_overwrite=True)
        deadline = time.monotonic() + 10 if wait and jax.process_index() == 0 else 0
        while time.monotonic() < deadline and len(peers().key_value_dir_get("ended/")) < jax.process_count():
            time.sleep(0.5)
        time.sleep(0.5 if deadline else 0)  # each prints its line and exits right after saying so


def end(why: str, wait: bool = True) -> None:  # from a thread: end this process with one line, its main thread stuck
    leave(why, wait)
    print(f"error: {why}{Run.active.left() if Run.active else '; nothing written'}", file=sys.stderr, flush=True)
    os._exit(1)


def make_mesh(args: Args, devices: list) -> jax.sharding.Mesh:
    """A (data, model) mesh with Auto axes (GSPMD lays out what is computed from the placed arrays): every device
    on 'data' (no rule set splits anything along 'model'). A batch or a weight that the devices cannot split evenly
    is a one-line error."""
    shape = (len(devices), 1)
    if args.batch_size % shape[0]:
        raise RunError(f"--batch-size {args.batch_size} must split evenly along 'data' ({shape[0]} devices)")
    auto = (jax.sharding.AxisType.Auto,) * 2
    abstract = jax.sharding.AbstractMesh(shape, ("data", "model"), axis_types=auto)  # sizes only: check first
    sizes = (slots_for(args), args.hidden_size, args.decoder_size)
    state = nnx.state(nnx.eval_shape(lambda: Policy(*sizes, rngs=nnx.Rngs(0))))
    layout = jax.tree_util.tree_flatten_with_path(shardings(state, abstract, args.rules))[0]
    for (path, sharding), leaf in zip(layout, jax.tree.leaves(state)):
        for dim, axis in zip(leaf.shape, sharding.spec):
            if axis is not None and dim % abstract.shape[axis]:
                raise RunError(
                    f"--rules {args.rules} splits {jax.tree_util.keystr(path, simple=True, separator='/')} "
                    f"{tuple(leaf.shape)} along '{axis}' ({abstract.shape[axis]} devices), which does not divide "
                    f"{dim}; pick other --host-devices or --rules"
                )
    return jax.make_mesh(shape, ("data", "model"), axis_types=auto, devices=devices)


# ---- Checkpoints (orbax, Flax's own format for NNX state) and the figure
LOAD_HINT = "was it saved with another --hidden-size, --decoder-size, --task or --max-digits?"  # what shapes the arrays


def save_policy(path: str, state: nnx.State) -> None:
    """The policy's parameters as an orbax checkpoint folder; leaving the `with` waits until it is written. Orbax
    writes it as <path>.orbax-checkpoint-tmp-<time> first, then renames it: what a stop leaves half-written goes."""
    logging.getLogger("absl").disabled = True  # a failed write: orbax's log, and its other writes' tracebacks, go
    sys.unraisablehook = lambda u, hook=sys.unraisablehook: "Event loop is closed" in str(u.exc_value) or hook(u)
    try:
        only_0 = ocp.options.MultiprocessingOptions(active_processes={0})  # --distributed: process 0 writes alone
        with ocp.StandardCheckpointer(multiprocessing_options=only_0) as checkpointer:
            checkpointer.save(os.path.abspath(path), state)
    except ValueError as e:  # a failed write (a full disk): orbax names the OS error, "[os_error_code='28']"
        code = int(str(e).partition("os_error_code='")[2].partition("'")[0] or 5)  # 5: EIO, where it names none
        raise OSError(code, os.strerror(code)) from None  # Run.save's one line: "no space left on device while …"
    finally:
        for unfinished in Path(path).parent.glob(Path(path).name + ".orbax-checkpoint-tmp*"):
            shutil.rmtree(unfinished, ignore_errors=True)


def shapes(tree) -> dict:
    """{'decoder/kernel/value': (shape, dtype)} for every array of a state, abstract state or checkpoint metadata."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(k, simple=True, separator="/"): (tuple(a.shape), np.dtype(a.dtype)) for k, a in flat}


def load_policy(args: Args, mesh: jax.sharding.Mesh) -> Policy:
    """--load: the policy saved in a run's policy/ folder, laid out on the mesh as train() lays it out. The names,
    shapes and dtypes in the checkpoint's metadata are checked against this run's Policy before any array is read;
    a folder without a checkpoint, another model's, another shape or dtype, or a damaged one is one RunError."""
    path, name = os.path.abspath(args.load), f"--load {args.load}"
    sizes = (slots_for(args), args.hidden_size, args.decoder_size)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Policy(*sizes, rngs=nnx.Rngs(0))))
    if not os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA")):
        raise RunError(f"{name} holds no checkpoint (give a run's policy folder: runs/grpo_mnist/latest/policy)")
    logging.getLogger("absl").setLevel(logging.ERROR)  # orbax's warning on unreadable metadata: the RunError says it
    with ocp.StandardCheckpointer() as checkpointer:
        saved = checkpointer.metadata(path).item_metadata  # None if the metadata cannot be read
        if saved is None:
            raise RunError(f"{name} is not a readable checkpoint (truncated or corrupt)")
        have, want = shapes(saved.tree), shapes(abstract)
        if have.keys() != want.keys():
            raise RunError(f"{name} holds {', '.join(sorted(have))}: not this script's policy")
        for key, (shape, dtype) in want.items():
            if have[key][0] != shape:
                raise RunError(f"{name}: {key} has shape {have[key][0]}, this run needs {shape} ({LOAD_HINT})")
            if have[key][1] != dtype:
                raise RunError(f"{name}: {key} holds {have[key][1]}, this run needs {dtype}")
        layout = shardings(abstract, mesh, args.rules)
        target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, layout)
        try:
            return nnx.merge(graphdef, checkpointer.restore(path, target))
        except Exception as e:  # a file under it cut short or overwritten
            raise RunError(f"{name} is not a readable checkpoint ({type(e).__name__}: truncated or corrupt)") from None


def plot_curve(path: str, history: list[dict], k: int, test: dict, title: str) -> None:
    """Per block of iterations: validation pass@1, pass@k and greedy exact match with the training reward (test
    scores are stars at the end), then the clip and zero-signal shares (RL only)."""
    from matplotlib.figure import Figure

    rl, trained = [h for h in history if h["phase"] == "rl"], [i for i, h in enumerate(history) if "reward" in h]
    fig = Figure(figsize=(11, 3.8))
    score_axis, share_axis = fig.subplots(1, 2)
    sft = max((h["iteration"] for h in history if h["phase"] == "sft"), default=0)  # the SFT steps at x ≤ 0
    steps = [h["iteration"] - (sft if h["phase"] in ("start", "sft") else 0) for h in history]
    scores = (("val_pass1", "o-", "pass@1"), (f"val_pass{k}", "d-", f"pass@{k}"), ("val_greedy", "s-", "greedy"))
    for key, style, text in scores:
        score_axis.plot(steps, [100 * h[key] for h in history], style, label=f"{text} (validation)")
    score_axis.plot(
        [steps[i] for i in trained], [100 * history[i]["reward"] for i in trained], "x--", label="train reward"
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
    for ax in fig.axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


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
    """Print the data, the mesh, the run and the parameter counts; return the counts for metrics.json."""
    counts = param_counts(args)
    print(
        f"data: {data.source}\nmesh: data {mesh.shape['data']} × model {mesh.shape['model']} over {mesh.size} "
        f"{mesh.devices.flat[0].platform} device(s), rules {args.rules}: {RULE_SETS[args.rules]}\n"
        f"run: {label}, batch {args.batch_size} prompts, learning rate {args.learning_rate}, "
        f"{args.iterations} iterations, seed {args.seed}\nparameters: policy {counts['params_policy']:,}, the only "
        f"network GRPO trains; PPO's critic V(x) would add {counts['params_critic']:,} "
        f"({counts['critic_share']:.1%} of policy + critic)",
        flush=True,
    )
    return counts


def collect_metrics(args: Args, data: Data, history: list[dict], timings: dict, counts: dict) -> dict:
    """metrics.json of a training run: the final validation scores, the last block's training means, the run's sizes
    and times and every scored row (history); main adds the test scores and the flags."""
    return {
        **{k: v for k, v in history[-1].items() if k.startswith("val_") or k in PROGRESS},
        "iterations": args.iterations,
        "sft_steps": sft_steps_for(args),
        "labelled_images": labelled_count(args, len(data.y_train)),
        **timings,
        "train_images": len(data.y_train),
        "val_prompts": len(data.y_val),
        "data": data.source,
        **counts,
        "history": history,
    }


def print_summary(args: Args, results: dict, label: str, run: Run) -> None:
    """Each split's final scores and the last block's shares, named as in metrics.json; then where they are."""
    print(f"---- summary ----\ndata: {results['data']}\nrun: {label}")
    for split in ("val", "test"):
        final = {k: v for k, v in results.items() if k.startswith(split + "_") and not k.endswith("_prompts")}
        print(" ".join(f"{k}={v:.4f}" for k, v in final.items()) or "test: not scored (--no-score-test)")
    if "clip_frac" in results:
        print(" ".join(f"{k}={results[k]:.4f}" for k in ("clip_frac", "outside_frac", "zero_signal")), "(last block)")
    if "train_seconds" in results:
        print(f"train_seconds={results['train_seconds']:.1f} (SFT, RL and validation scoring)")
    files = "metrics.json" if args.load else "metrics.json, learning_curve.png, policy/"
    print(f"outputs: {run.folder} ({files})", flush=True)


def use_compile_cache(folder: str) -> None:
    """Keep every compiled XLA program on disk, so the next run with the same shapes skips compilation.
    Must run before the first compilation. The numbers do not change, only the start-up time."""
    if folder:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default: only programs > 1 s
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@one_line
def main(args: Args) -> dict:
    validate(args)  # flag values, before any work
    try:
        return train_and_save(args, make_mesh(args, start_devices(args)))  # devices: before any other JAX operation
    except BaseException as e:  # --distributed: what ends this process with one line is told to the others first
        if args.distributed and (Run.stops or isinstance(e, (RunError, OSError))):
            leave("interrupted" if Run.stops else str(e))
        elif args.distributed and isinstance(e, Exception):  # most often a collective whose peer died: watch says so
            time.sleep(SILENT + 15)
        raise


def train_and_save(args: Args, mesh: jax.sharding.Mesh) -> dict:  # main's work, once the devices are known
    if jax.process_index() > 0:  # with --distributed, only process 0 prints and writes; the others' errors still show
        sys.stdout = open(os.devnull, "w")
    use_compile_cache(args.compile_cache)
    loaded = load_policy(args, mesh) if args.load else None  # a bad checkpoint is refused before any work
    where = replace(args, out=os.path.join(args.out, "eval")) if args.load else args
    run = Run(where) if jax.process_index() == 0 else None  # this run's own folder
    data = load_data(args)
    if not args.score_test:  # the test images are dropped before training: nothing below can read them
        data = data._replace(x_test=None, y_test=None)
    with jax.set_mesh(mesh):  # every placement and sharding constraint below refers to this mesh
        if loaded is None:
            label = run_label(args)
            counts = print_header(args, data, label, mesh)
            policy, reference, history, timings = train(args, data)
            state = multihost_utils.process_allgather(nnx.state(policy), tiled=True)  # the whole policy, as numpy
            if run:  # right after training: a stop later keeps it
                run.save("policy", save_policy, state)
            results = collect_metrics(args, data, history, timings, counts)
        else:  # score a saved policy as train() scores its final one, with the keys of --seed: no training
            label = f"policy loaded from {args.load}, scored with the keys of seed {args.seed}"
            print(f"data: {data.source}\nloaded {args.load}", flush=True)
            policy = reference = loaded  # the checkpoint holds no π_ref: the policy stands in, and that KL (0) goes
            results = {**score_split(args, policy, reference, data, "val"), "loaded": args.load, "data": data.source}
        if args.score_test:  # the test set is scored once, here, after every choice on validation
            results.update(score_split(args, policy, reference, data, "test"))
    results = {k: v for k, v in results.items() if loaded is None or not k.endswith("_kl_ref")} | {"args": asdict(args)}
    if run:
        if loaded is None:
            title = f"{label} | train {len(data.y_train)} / validation {len(data.y_val)} images"
            run.save("learning_curve.png", plot_curve, history, args.pass_k, results, title)
        run.finish(results)
        print_summary(args, results, label, run)
    if args.distributed:  # all wait for process 0's files; it exits last, as the others need its coordination service
        multihost_utils.sync_global_devices("done")
        leave("done")
    return results


if __name__ == "__main__":
    main()
