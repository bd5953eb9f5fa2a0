"""GRPO on MNIST: a critic-less policy learns digits from a 0/1 reward, one group of answers per image.

Each image is a prompt. The actor (an MLP returning a Categorical over the ten digits) samples G answers
per image from the rollout policy π_old; an answer earns reward 1 if it names the right digit, else 0.
The group's own mean and standard deviation turn the rewards into advantages, so no value network
(critic) is needed. The actor then takes μ = `--inner-steps` clipped-surrogate (PPO-clip) steps on that
rollout, with a KL penalty towards a frozen reference policy π_ref, the initial actor: the exact
KL(π_θ ‖ π_ref) over the ten answers (`--kl exact`), or the sampled k3 estimator (`--kl k3`).

`--group-mode batch` is the original guide's variant: one baseline for all B·G answers of a batch
(`--group-size 1` gives its one answer per image). `--objective supervised` trains the same MLP with
cross-entropy on the labels. Every choice is made on a validation split; the test set is scored once.

Order: Args → data split → policy network (and the critic GRPO does without) → group advantages → KL →
the GRPO loss → the compiled update and epoch → the training loop → evaluation. Below the `# Plumbing`
banner: the command line, input checks, reading MNIST, checkpoints, the figure, metrics.json and main.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import math
import os
import struct
import sys
import time
import urllib.request
import zlib
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax
from flax import nnx
from tensorflow_probability.substrates import jax as tfp

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

tfd = tfp.distributions


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag. Its bounds travel with it and check_flags tests them:
    choices (a tuple of allowed values), min / max (inclusive) and gt (strictly greater than)."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: jax.random.key (shuffles, sampling) and nnx.Rngs (weights)", min=0)
    data: str = flag(
        "bundled",
        "bundled: the 10,000 official MNIST test digits shipped in 4_GRPO_MNIST/data/ (offline), split into "
        "--split-test-set training digits and a held-out test set; full: the official 60,000 training and "
        "10,000 test digits, from tensorflow-datasets or downloaded",
        choices=("bundled", "full"),
    )
    split_test_set: int = flag(
        8000,
        "with --data bundled: train on this many of the 10,000 digits and hold out the rest as the test set "
        "(a fixed shuffle, the same for every --seed)",
        min=1,
    )
    val_size: float = flag(
        0.1,
        "share of the training images held out for validation (fixed shuffle); every choice is made on it",
        gt=0,
        max=0.5,
    )
    score_test: bool = flag(
        True,
        "score the held-out test set once, after training; --no-score-test leaves it unread (for runs that "
        "make a choice, such as tools/grpo_val_sweep.py's), so metrics.json holds no test number",
    )
    data_dir: str = flag(
        "",
        "read the IDX .gz files from this folder: the t10k pair (--data bundled) or all four (--data full)",
    )
    dataset: str = flag("mnist", "with --data full: the tensorflow-datasets name", choices=("mnist", "fashion_mnist"))
    download: bool = flag(
        True,
        "with --data full: if the dataset is not cached, let tensorflow-datasets prepare it, or else fetch "
        "the IDX files its builder uses (checked against its SHA-256 list)",
    )
    objective: str = flag(
        "grpo",
        "grpo: learn from the 0/1 reward; supervised: cross-entropy on the labels",
        choices=("grpo", "supervised"),
    )
    group_mode: str = flag(
        "prompt",
        "prompt: each image's G answers form a group (real GRPO); batch: one baseline for all B·G answers "
        "of the batch (the original guide's variant; add --group-size 1 for its one answer per image)",
        choices=("prompt", "batch"),
    )
    group_size: int = flag(16, "G, answers sampled per image (prompt mode needs G >= 2)", min=1)
    batch_size: int = flag(64, "images (prompts) per rollout and update", min=1)
    inner_steps: int = flag(
        1, "μ, clipped-surrogate gradient steps on each rollout (1 keeps the ratio at 1, so the clip never acts)", min=1
    )
    epochs: int = flag(10, "passes over the training images", min=1)
    learning_rate: float = flag(1e-3, "Adam learning rate", gt=0)
    clip_eps: float = flag(0.2, "ε of the PPO clip: the ratio π/π_old is clipped to [1 − ε, 1 + ε]", gt=0, max=1)
    beta: float = flag(
        1.0, "β, weight of the KL penalty towards π_ref, the frozen initial actor; 0 turns it off", min=0
    )
    kl: str = flag(
        "exact",
        "exact: the analytic KL(π_θ ‖ π_ref) over the ten answers; k3: the sampled "
        "estimator π_ref/π − log(π_ref/π) − 1 of LLM-scale GRPO",
        choices=("exact", "k3"),
    )
    adv_eps: float = flag(1e-4, "ε in (r − mean) / (std + ε)", gt=0)
    hidden_size: int = flag(128, "width of the actor's two hidden layers", min=1)
    out: str = flag("runs/grpo_mnist", "folder for metrics.json, the curve PNG and actor.npz")
    compile_cache: str = flag("~/.cache/jax-rl-course", "JAX's persistent compilation cache folder ('' turns it off)")


# ---- Data: every image is a prompt; its label is what the verifier checks an answer against
class Data(NamedTuple):
    x_train: np.ndarray  # (N, 784) float32 in [0, 1]: the prompts
    y_train: np.ndarray  # (N,) int32: what the verifier checks an answer against
    x_val: np.ndarray  # (V, 784) validation images, carved from the training images: every choice is made here
    y_val: np.ndarray
    x_test: np.ndarray | None  # (M, 784) held-out test images, scored once at the end (None: --no-score-test)
    y_test: np.ndarray | None
    source: str  # what the numbers were measured on


SPLIT_SEED = 0  # the fixed shuffles behind --split-test-set and --val-size: the same digits for every --seed


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


# ---- The policy: the actor is the only network GRPO trains; the critic exists only to be counted
class Actor(nnx.Module):
    """π_θ(a | s): 784 → hidden_size → hidden_size → 10 logits, returned as a Categorical over the digits."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs, in_features: int = 784, n_actions: int = 10):
        self.fc1 = nnx.Linear(in_features, hidden_size, rngs=rngs)
        self.fc2 = nnx.Linear(hidden_size, hidden_size, rngs=rngs)
        self.out = nnx.Linear(hidden_size, n_actions, rngs=rngs)

    def __call__(self, x: jax.Array) -> tfd.Categorical:
        h = nnx.relu(self.fc1(x))  # (B, hidden_size)
        h = nnx.relu(self.fc2(h))
        return tfd.Categorical(logits=self.out(h))  # batch_shape (B,), 10 classes


class Critic(nnx.Module):
    """PPO's value network V(s) with the actor's trunk and one output. GRPO never builds or trains it;
    this script instantiates it only to count the parameters (and memory) that GRPO saves (`param_table`)."""

    def __init__(self, hidden_size: int, *, rngs: nnx.Rngs, in_features: int = 784):
        self.fc1 = nnx.Linear(in_features, hidden_size, rngs=rngs)
        self.fc2 = nnx.Linear(hidden_size, hidden_size, rngs=rngs)
        self.out = nnx.Linear(hidden_size, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.fc2(nnx.relu(self.fc1(x)))))[..., 0]  # (B,)


# ---- Group advantages: the baseline is the group's own mean, so no critic is needed
def group_advantages(rewards: jax.Array, eps: float) -> jax.Array:
    """Real GRPO. rewards (B, G): row b holds the G answers to prompt b.
    A_bg = (r_bg − mean_g r_b·) / (std_g r_b· + ε); a group whose rewards are all equal gets A = 0."""
    mean = rewards.mean(axis=1, keepdims=True)  # (B, 1)
    std = rewards.std(axis=1, keepdims=True)  # (B, 1), population std
    return (rewards - mean) / (std + eps)


def batch_advantages(rewards: jax.Array, eps: float) -> jax.Array:
    """The original guide's variant: one baseline for the whole batch. A = (r − mean(all r)) / (std(all r) + ε)."""
    return (rewards - rewards.mean()) / (rewards.std() + eps)


# ---- KL to the frozen reference: exact over the ten answers, or the sampled k3 estimator
def exact_kl(logits: jax.Array, ref_logits: jax.Array) -> jax.Array:
    """KL(π_θ ‖ π_ref) = Σ_a π_θ(a) (log π_θ(a) − log π_ref(a)) per image, summed over all ten answers.
    logits, ref_logits (B, 10) -> (B,). Its gradient is the true ∇KL(π_θ ‖ π_ref)."""
    return tfd.Categorical(logits=logits).kl_divergence(tfd.Categorical(logits=ref_logits))


def k3_kl(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
    """Per-sample k3 estimate of KL(π_θ ‖ π_ref): π_ref/π − log(π_ref/π) − 1 (≥ 0, = 0 where π = π_ref).

    Its mean over a ~ π_θ is KL(π_θ ‖ π_ref), but its gradient on fixed samples has mean
    E_π[(1 − π_ref/π) ∇log π] = −Σ_a π_ref(a) ∇log π(a) = ∇KL(π_ref ‖ π_θ): the other direction."""
    log_r = logp_ref - logp
    return jnp.exp(log_r) - log_r - 1


# ---- The GRPO loss: the clipped surrogate plus β·KL (and cross-entropy for the supervised baseline)
def clipped_surrogate(logp: jax.Array, logp_old: jax.Array, adv: jax.Array, clip_eps: float):
    """PPO-clip objective to MAXIMISE, averaged over samples, and two shares of the samples.
    ρ = π_θ(a|s) / π_old(a|s) = exp(log π_θ − log π_old);  L = mean(min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)).

    clip_frac: where the clip binds (ρ > 1 + ε with A > 0, or ρ < 1 − ε with A < 0); there the clipped
    constant is the minimum and the sample's gradient is 0. outside_frac: |ρ − 1| > ε, whatever A's sign."""
    ratio = jnp.exp(logp - logp_old)
    objective = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    binds = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))
    outside = jnp.abs(ratio - 1) > clip_eps
    return objective.mean(), {"clip_frac": binds.mean(), "outside_frac": outside.mean()}


def grpo_loss(actor: Actor, x, actions, logp_old, adv, ref_logits, clip_eps: float, beta: float, kl: str):
    """Loss to minimise: −clipped surrogate + β·KL.  x (B, 784); actions, logp_old, adv (B, G); ref_logits (B, 10).

    kl="exact": mean over images of KL(π_θ ‖ π_ref) (`exact_kl`); kl="k3": mean of k3 over the sampled answers."""
    dist = actor(x)
    logp = dist.log_prob(actions.T).T  # (B, G): log π_θ of each sampled answer
    surrogate, clip_shares = clipped_surrogate(logp, logp_old, adv, clip_eps)
    if kl == "exact":
        kl_value = exact_kl(dist.logits, ref_logits).mean()
    else:
        logp_ref = tfd.Categorical(logits=ref_logits).log_prob(actions.T).T  # (B, G)
        kl_value = k3_kl(logp, logp_ref).mean()
    loss = -surrogate + beta * kl_value
    return loss, {"loss": loss, **clip_shares, "kl": kl_value}


def supervised_loss(actor: Actor, x, labels):
    """Cross-entropy: −mean log π_θ(label | x)."""
    loss = -actor(x).log_prob(labels).mean()
    return loss, {"loss": loss}


# ---- The compiled update: rollout, rewards, advantages, μ steps; a whole epoch is one lax.scan
@dataclass(frozen=True)
class GRPOConfig:
    """The static (compile-time) part of Args that the jitted epoch needs."""

    objective: str
    group_mode: str
    group_size: int
    batch_size: int
    inner_steps: int
    clip_eps: float
    beta: float
    kl: str
    adv_eps: float

    @classmethod
    def from_args(cls, args: Args) -> GRPOConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def grpo_update(actor: Actor, optimizer: nnx.Optimizer, reference: Actor, x, y, key, config: GRPOConfig) -> dict:
    """Rollout G answers per image from π_old, score them, then μ clipped-surrogate steps on that rollout."""
    dist_old = actor(x)  # π_old: the parameters before this rollout's μ steps
    actions = dist_old.sample(config.group_size, seed=key).T  # (B, G)
    logp_old = jax.lax.stop_gradient(dist_old.log_prob(actions.T).T)  # (B, G)
    rewards = (actions == y[:, None]).astype(jnp.float32)  # (B, G): 1 if the answer names the digit
    if config.group_mode == "prompt":
        adv = group_advantages(rewards, config.adv_eps)
        zero_signal = jnp.mean(rewards.std(axis=1) == 0)  # groups with all-equal rewards teach nothing
    else:
        adv = batch_advantages(rewards, config.adv_eps)
        zero_signal = (rewards.std() == 0).astype(jnp.float32)
    if config.beta > 0:
        ref_logits = reference(x).logits  # (B, 10), frozen π_ref
    else:
        ref_logits = dist_old.logits  # unused: β = 0 multiplies it away; skip the extra forward pass
    grad_fn = nnx.value_and_grad(grpo_loss, has_aux=True)
    step_metrics = []
    for _ in range(config.inner_steps):  # μ steps: after the first, ρ ≠ 1 and the clip can act
        (_, aux), grads = grad_fn(actor, x, actions, logp_old, adv, ref_logits, config.clip_eps, config.beta, config.kl)
        optimizer.update(actor, grads)
        step_metrics.append(aux)
    metrics = jax.tree.map(lambda *v: jnp.mean(jnp.stack(v)), *step_metrics)
    if config.beta == 0:
        del metrics["kl"]  # with β = 0 it compared π_θ with π_old, not with π_ref
    return {**metrics, "reward": rewards.mean(), "zero_signal": zero_signal}


def supervised_update(actor: Actor, optimizer: nnx.Optimizer, x, y, key) -> dict:
    """One cross-entropy step; also samples one answer per image so 'reward' is comparable with GRPO's."""
    reward = (actor(x).sample(seed=key) == y).astype(jnp.float32).mean()
    (_, aux), grads = nnx.value_and_grad(supervised_loss, has_aux=True)(actor, x, y)
    optimizer.update(actor, grads)
    return {**aux, "reward": reward}


def train_epoch(
    graphdef: nnx.GraphDef, ref_graphdef: nnx.GraphDef, config: GRPOConfig, state, ref_state, x_all, y_all, key
):
    """One pass over the shuffled training images, compiled as a single lax.scan over batches.

    `state` is nnx.state((actor, optimizer)), `ref_state` the frozen reference's. The NNX objects are rebuilt
    inside the traced function (nnx.merge), updated in place, and split back out, so Python and NNX
    bookkeeping run once at trace time, not once per batch."""
    n_batches = x_all.shape[0] // config.batch_size  # the last partial batch is dropped
    key, perm_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, x_all.shape[0])[: n_batches * config.batch_size]
    batches = order.reshape(n_batches, config.batch_size)  # (n_batches, B) image indices
    keys = jax.random.split(key, n_batches)
    reference = nnx.merge(ref_graphdef, ref_state)

    def one_batch(state, inputs):
        idx, batch_key = inputs
        actor, optimizer = nnx.merge(graphdef, state)
        x, y = x_all[idx], y_all[idx]  # (B, 784), (B,)
        if config.objective == "grpo":
            metrics = grpo_update(actor, optimizer, reference, x, y, batch_key, config)
        else:
            metrics = supervised_update(actor, optimizer, x, y, batch_key)
        return nnx.state((actor, optimizer)), metrics

    state, metrics = jax.lax.scan(one_batch, state, (batches, keys))
    return state, jax.tree.map(jnp.mean, metrics)


# ---- The training loop: compile the epoch once, run it, score validation after each epoch
def train(args: Args, data: Data) -> tuple[Actor, Actor, list[dict], dict]:
    """Build the actor, its frozen reference and Adam; run the epochs, scoring validation after each.
    Returns (actor, reference, history, timings). The test images are not touched here."""
    key = jax.random.key(args.seed)
    actor = Actor(args.hidden_size, rngs=nnx.Rngs(args.seed))
    reference = nnx.clone(actor)  # π_ref: the frozen initial policy
    optimizer = nnx.Optimizer(actor, optax.adam(args.learning_rate), wrt=nnx.Param)
    graphdef, state = nnx.split((actor, optimizer))
    actor_graphdef, ref_state = nnx.split(reference)
    x_train, y_train = jnp.asarray(data.x_train), jnp.asarray(data.y_train)
    x_val, y_val = jnp.asarray(data.x_val), jnp.asarray(data.y_val)

    t0 = time.perf_counter()
    run_epoch = jax.jit(partial(train_epoch, graphdef, actor_graphdef, GRPOConfig.from_args(args)))
    run_epoch = run_epoch.lower(state, ref_state, x_train, y_train, key).compile()  # compile once, up front
    score = jax.jit(partial(evaluate, actor_graphdef))
    compile_seconds = time.perf_counter() - t0

    def score_validation(state) -> dict:  # state[0]: the actor's part of (actor, optimizer)
        scores = {k: float(v) for k, v in score(state[0], ref_state, x_val, y_val).items()}
        return {
            "val_accuracy": scores["accuracy"],
            "val_sampled_accuracy": scores["sampled_accuracy"],
            "kl_ref": scores["kl_ref"],
        }

    history = [{"epoch": 0, **score_validation(state)}]
    print_progress(history[0], len(data.y_train))
    for epoch in range(1, args.epochs + 1):
        key, epoch_key = jax.random.split(key)
        t_epoch = time.perf_counter()
        state, metrics = run_epoch(state, ref_state, x_train, y_train, epoch_key)
        jax.block_until_ready(state)
        seconds = time.perf_counter() - t_epoch
        row = {
            "epoch": epoch,
            **score_validation(state),
            "train_reward": float(metrics["reward"]),
            "seconds": seconds,
            **{k: float(v) for k, v in metrics.items() if k != "reward"},
        }
        history.append(row)
        print_progress(row, len(data.y_train))
    actor, _ = nnx.merge(graphdef, state)
    timings = {
        "train_seconds": time.perf_counter() - t0,
        "compile_seconds": compile_seconds,
        "seconds_per_epoch": float(np.mean([h["seconds"] for h in history[1:]])),
    }
    return actor, reference, history, timings


# ---- Evaluation: greedy accuracy and KL to π_ref on held-out images; the test set once, at the end
def evaluate(graphdef: nnx.GraphDef, state, ref_state, x, y) -> dict:
    """On held-out images: the greedy (argmax) accuracy; the sampled accuracy, i.e. the expected reward of one
    answer drawn from π, mean π(y | x), exact without sampling; and the exact mean KL(π_θ ‖ π_ref).
    `graphdef` is the actor's; `state` and `ref_state` are the actor's and the frozen reference's."""
    actor, reference = nnx.merge(graphdef, state), nnx.merge(graphdef, ref_state)
    dist = actor(x)
    accuracy = jnp.mean(dist.mode() == y)
    kl_ref = jnp.mean(dist.kl_divergence(reference(x)))  # exact: only 10 actions to sum over
    return {"accuracy": accuracy, "sampled_accuracy": jnp.mean(dist.prob(y)), "kl_ref": kl_ref}


def score_test_set(actor: Actor, reference: Actor, data: Data) -> dict:
    """evaluate() on the held-out test images, called once, after training: test_accuracy, test_sampled_accuracy
    and test_kl_ref."""
    score = jax.jit(partial(evaluate, nnx.graphdef(actor)))
    scores = score(nnx.state(actor), nnx.state(reference), jnp.asarray(data.x_test), jnp.asarray(data.y_test))
    return {f"test_{name}": float(value) for name, value in scores.items()}


# =============================================================================================
# Plumbing: the command line, input checks, reading MNIST, the parameter table, checkpoints, the figure, main
# =============================================================================================
class InputError(Exception):
    """Bad input: a flag value, a missing or corrupt file, an unwritable folder, a mesh that does not fit."""


def reports_input_errors(main):
    """Turn an InputError raised anywhere below main() into one line on stderr and exit status 1."""

    @functools.wraps(main)
    def run(args):
        try:
            return main(args)
        except InputError as e:
            sys.exit(f"error: {e}")

    return run


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, exit status 1, instead of dumping the usage."""

    def error(self, message):
        sys.exit(f"error: {message} (see --help)")


def parse_args(argv=None) -> Args:
    p = OneLineParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in fields(Args):
        name = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            p.add_argument(
                name,
                type=type(f.default),
                default=f.default,
                help=f.metadata["help"],
                choices=f.metadata.get("choices"),
            )
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
    """Raise InputError (one line for the user) if the flags contradict each other or --out is not writable.
    Each flag's own range is checked first, by check_flags, from the bounds its flag() declares."""
    check_flags(args)
    if args.group_mode == "prompt" and args.objective == "grpo" and args.group_size < 2:
        # a group of one always has advantage 0: nothing to learn
        raise InputError(
            f"--group-size must be >= 2 with --group-mode prompt (a group of one always has advantage 0), "
            f"got {args.group_size}"
        )
    if args.dataset != "mnist" and args.data != "full":
        # the bundled digits are MNIST's; another tensorflow-datasets name needs its own files
        raise InputError(f"--dataset {args.dataset} needs --data full (the bundled digits are MNIST)")
    try:  # the output folder is checked before any work: a run that cannot save its results does not start
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, ".write_test"), "w"):
            pass
        os.remove(os.path.join(args.out, ".write_test"))
    except OSError as e:
        raise InputError(f"--out {args.out!r} is not a writable folder ({e.strerror or type(e).__name__})") from None


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


# ---- The parameter table: what dropping the critic saves
def count_params(model: nnx.Module) -> int:
    return sum(int(p.size) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


BYTES_PER_PARAM = 2 + 2 + 2 * 2  # bf16 weight + bf16 gradient + Adam's m and v in bf16 (the original guide's module 6)
LLM_ACTOR_PARAMS = 8e9  # the original guide's 8B example


def param_table(hidden_size: int) -> tuple[str, dict]:
    """Actor-only (GRPO) vs actor + critic (PPO), counted from the models and scaled to an 8B actor."""
    actor = count_params(Actor(hidden_size, rngs=nnx.Rngs(0)))
    critic = count_params(Critic(hidden_size, rngs=nnx.Rngs(0)))
    scale = LLM_ACTOR_PARAMS / actor  # an 8B actor; its critic has the same trunk and a 1-unit head
    rows = [("actor only (GRPO)", actor), ("critic V(s) (PPO only)", critic), ("actor + critic (PPO)", actor + critic)]
    lines = [f"{'model':<24}{'params here':>13}{'scaled to 8B actor':>20}{'train state, 8 B/param':>25}"]
    for name, n in rows:
        lines.append(f"{name:<24}{n:>13,}{n * scale / 1e9:>19.2f}B{n * scale * BYTES_PER_PARAM / 1e9:>22.1f} GB")
    saved = critic / (actor + critic)
    lines.append(
        f"GRPO drops the critic: {saved:.1%} of PPO's parameters, "
        f"{critic * scale * BYTES_PER_PARAM / 1e9:.1f} GB of training state at the 8B scale"
    )
    return "\n".join(lines), {"params_actor": actor, "params_critic": critic, "critic_share": saved}


# ---- Checkpoints and the figure
def flatten_dict(tree: dict, prefix: str) -> dict[str, np.ndarray]:
    """{'fc1': {'kernel': a}} under prefix 'actor' -> {'actor/fc1/kernel': a}."""
    flat = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(flatten_dict(v, f"{prefix}/{k}"))
        else:
            flat[f"{prefix}/{k}"] = np.asarray(v)
    return flat


def fill_pure_dict(template: dict, arrays: dict, prefix: str, path: str) -> dict:
    """`template` (a pure dict) with each leaf replaced by arrays['prefix/…/leaf'], checked for presence and shape."""
    filled = {}
    for k, v in template.items():
        key = f"{prefix}/{k}"
        if isinstance(v, dict):
            filled[k] = fill_pure_dict(v, arrays, key, path)
            continue
        if key not in arrays or arrays[key].shape != v.shape:
            found = "not in the file" if key not in arrays else f"{arrays[key].shape} in the file, {v.shape} here"
            raise InputError(
                f"{path}: parameter {key} is missing or of the wrong shape ({found}); "
                f"was it saved with another --hidden-size?"
            )
        filled[k] = jnp.asarray(arrays[key])
    return filled


def save_checkpoint(path: str, parts: dict) -> None:
    """parts: name -> nnx.Module (its nnx.Param state) or np.ndarray. One .npz, keys 'name/…/leaf', no pickle."""
    arrays = {}
    for name, part in parts.items():
        if isinstance(part, nnx.Module):
            arrays.update(flatten_dict(nnx.to_pure_dict(nnx.state(part, nnx.Param)), name))
        else:
            arrays[name] = np.asarray(part)
    np.savez(path, **arrays)


def load_checkpoint(path: str, parts: dict) -> dict:
    """Fill every Module in `parts` in place from `path` (nnx.replace_by_pure_dict); return the arrays stored
    for the non-Module entries. Raises InputError on a missing, corrupt or mismatched file."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as e:
        raise InputError(f"cannot read checkpoint file {path} ({type(e).__name__}: {e})") from None
    loaded = {}
    for name, part in parts.items():
        if not isinstance(part, nnx.Module):
            if name not in arrays:
                raise InputError(f"{path}: array {name} is missing")
            loaded[name] = arrays[name]
            continue
        state = nnx.state(part, nnx.Param)
        nnx.replace_by_pure_dict(state, fill_pure_dict(nnx.to_pure_dict(state), arrays, name, path))
        nnx.update(part, state)
    return loaded


def plot_curve(path: str, history: list[dict], test_accuracy: float | None, title: str) -> None:
    """Per epoch: accuracy and sampled reward (%); for GRPO, the clip and zero-signal shares (%); the KL to
    π_ref (nats). The test score is one star at the end, drawn only if the test set was scored."""
    epochs = [h["epoch"] for h in history]
    trained = [h for h in history if h["epoch"] > 0]
    trained_epochs = [h["epoch"] for h in trained]
    grpo = "clip_frac" in trained[0]  # the supervised objective has no clip and no groups
    fig, axes = plt.subplots(1, 3 if grpo else 2, figsize=(15 if grpo else 10, 3.8))
    accuracy, kl_axis = axes[0], axes[-1]
    accuracy.plot(epochs, [100 * h["val_accuracy"] for h in history], "o-", label="greedy validation accuracy")
    sampled = [100 * h["val_sampled_accuracy"] for h in history]
    accuracy.plot(epochs, sampled, "d-", label="sampled validation accuracy, mean π(label | x)")
    accuracy.plot(trained_epochs, [100 * h["train_reward"] for h in trained], "s--", label="sampled train reward")
    if test_accuracy is not None:
        accuracy.plot([epochs[-1]], [100 * test_accuracy], "k*", ms=12, label="test accuracy (scored once, at the end)")
    accuracy.set(xlabel="epoch", ylabel="%", title="accuracy and reward")
    if grpo:
        shares = axes[1]
        for key, style, text in (
            ("clip_frac", "o-", "clip binds (clip_frac)"),
            ("outside_frac", "x--", "ratio outside [1 − ε, 1 + ε] (outside_frac)"),
            ("zero_signal", "s-", "groups with all-equal rewards (zero_signal)"),
        ):
            shares.plot(trained_epochs, [100 * h[key] for h in trained], style, label=text)
        shares.set(xlabel="epoch", ylabel="% of samples / groups", title="clip and zero-signal shares")
    kl_axis.plot(epochs, [h["kl_ref"] for h in history], "^-", label="KL(π ‖ π_ref) on validation")
    if "kl" in trained[0]:
        kl_axis.plot(trained_epochs, [h["kl"] for h in trained], "v--", label="KL term of the loss (--kl), training")
    kl_axis.set(xlabel="epoch", ylabel="nats", title="KL to the initial policy π_ref")
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)  # epochs are whole numbers
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- main: check the flags, load the data, train, score the test set once, save
def print_progress(row: dict, n_train: int) -> None:
    """One grep-able line per epoch; GRPO adds the clip shares, the zero-signal share and the loss's KL term."""
    line = f"epoch={row['epoch']} val_acc={row['val_accuracy']:.4f} val_sampled={row['val_sampled_accuracy']:.4f}"
    if row["epoch"] == 0:
        print(f"{line} kl_ref={row['kl_ref']:.4f} (untrained)", flush=True)
        return
    extra = "".join(f" {k}={row[k]:.4f}" for k in ("clip_frac", "outside_frac", "zero_signal", "kl") if k in row)
    print(
        f"{line} train_reward={row['train_reward']:.4f} loss={row['loss']:.4f}{extra} kl_ref={row['kl_ref']:.4f} "
        f"sec={row['seconds']:.2f} img/s={n_train / row['seconds']:.0f}",
        flush=True,
    )


def run_label(args: Args) -> str:
    if args.objective == "supervised":
        return "supervised"
    kl = f"β={args.beta}, kl {args.kl}" if args.beta > 0 else "β=0"
    return f"grpo, group-mode {args.group_mode}, G={args.group_size}, μ={args.inner_steps}, {kl}"


def print_header(args: Args, data: Data, label: str) -> dict:
    """Print the data, the run and the parameter table (GRPO vs PPO); return the counts for metrics.json."""
    print(f"data: {data.source}", flush=True)
    print(
        f"run: {label}, batch {args.batch_size}, learning rate {args.learning_rate}, {args.epochs} epochs, "
        f"seed {args.seed}",
        flush=True,
    )
    table, param_counts = param_table(args.hidden_size)
    print(table, flush=True)
    return param_counts


def save_outputs(args: Args, results: dict, actor: Actor, title: str) -> None:
    """metrics.json, learning_curve.png and the actor's checkpoint actor.npz, all in --out."""
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(results, f, indent=2)
    plot_curve(os.path.join(args.out, "learning_curve.png"), results["history"], results.get("test_accuracy"), title)
    save_checkpoint(os.path.join(args.out, "actor.npz"), {"actor": actor})


def print_summary(args: Args, results: dict, label: str) -> None:
    print("---- summary ----")
    print(f"data:              {results['data']}")
    print(f"objective:         {label}")
    print(f"val_accuracy:      {results['val_accuracy']:.4f}  (greedy, validation split, after epoch {args.epochs})")
    print(f"val_sampled_acc:   {results['val_sampled_accuracy']:.4f}  (mean π(label | x): one sampled answer)")
    if "test_accuracy" in results:
        print(f"test_accuracy:     {results['test_accuracy']:.4f}  (greedy, held-out test set, scored once)")
        print(f"test_sampled_acc:  {results['test_sampled_accuracy']:.4f}  (mean π(label | x): one sampled answer)")
    else:
        print("test_accuracy:     not scored (--no-score-test)")
    print(f"train_reward:      {results['train_reward']:.4f}  (sampled, last epoch)")
    if "clip_frac" in results:
        binds = "ρ > 1+ε with A > 0, or ρ < 1−ε with A < 0"
        print(f"clip_frac:         {results['clip_frac']:.4f}  (last epoch; the clip binds: {binds})")
        print(f"outside_frac:      {results['outside_frac']:.4f}  (last epoch; |ρ − 1| > ε, whatever the sign of A)")
    print(
        f"seconds_per_epoch: {results['seconds_per_epoch']:.2f}  ({results['seconds_per_epoch_at_60k']:.2f} s "
        f"scaled to 60,000 images; compile {results['compile_seconds']:.1f} s, total "
        f"{results['train_seconds']:.1f} s)"
    )
    print(f"outputs:           {args.out}/metrics.json, learning_curve.png, actor.npz", flush=True)


def use_compile_cache(folder: str) -> None:
    """Keep every compiled XLA program on disk, so the next run with the same shapes skips compilation.
    Must run before the first compilation. The numbers do not change, only the start-up time."""
    if folder:
        jax.config.update("jax_compilation_cache_dir", os.path.expanduser(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default: only programs > 1 s
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@reports_input_errors
def main(args: Args) -> dict:
    validate(args)  # flag values and the output folder, before any work
    use_compile_cache(args.compile_cache)
    data = load_data(args)
    if not args.score_test:  # the test images are dropped before training: nothing below can read them
        data = data._replace(x_test=None, y_test=None)
    if args.batch_size > len(data.y_train):
        raise InputError(f"--batch-size {args.batch_size} exceeds the {len(data.y_train)} training images")
    label = run_label(args)
    param_counts = print_header(args, data, label)

    actor, reference, history, timings = train(args, data)
    results = {k: history[-1][k] for k in ("val_accuracy", "val_sampled_accuracy")}
    if args.score_test:  # the held-out test set is scored once, here, after every choice was made on validation
        results.update(**score_test_set(actor, reference, data), test_images=len(data.y_test))
    last = history[-1]
    results.update(
        {
            "train_reward": last["train_reward"],
            **{k: last[k] for k in ("clip_frac", "outside_frac") if k in last},
            "epochs": args.epochs,
            **timings,
            "train_images": len(data.y_train),
            "val_images": len(data.y_val),
            "seconds_per_epoch_at_60k": timings["seconds_per_epoch"] * 60_000 / len(data.y_train),
            "data": data.source,
            **param_counts,
            "history": history,
            "args": asdict(args),
        }
    )
    title = f"{label} | train {len(data.y_train)} / validation {len(data.y_val)} images"
    save_outputs(args, results, actor, title)
    print_summary(args, results, label)
    return results


if __name__ == "__main__":
    main(parse_args())
