"""Shard a small transformer over a (data, model) device mesh by logical-axis rules; check it against one device.

Every weight carries logical axis names (`vocab`, `embed`, `heads`, `mlp`, ...) from `nnx.with_partitioning`. A rule
set, an ordered sequence of (logical name, mesh axis) pairs as in MaxText's `logical_axis_rules`, turns those names
into a `PartitionSpec` per weight. `--axis-types explicit` makes the shardings part of the arrays' types and lays out
the activations by the same rules. The file reads in the order it runs:

1. the mesh axes, the four rule sets and `Args`;
2. devices and mesh (`make_mesh`), then logical axes -> mesh axes (`logical_to_mesh_axes`, `analytic_bytes`), and
   by the same resolution the 8B example's bytes per device (`big_model_memory`);
3. the model (`batch_layout`, `TinyLM`) and its state's layout (`state_shardings`, `flax_shardings`, `init_sharded`);
4. data, loss and the compiled step (`make_batches`, `place_batch`, `loss_fn`, `train_step`, `compile_step`, `train`);
5. measuring the bytes each device holds (`measured_bytes`, `state_bytes`, `weight_table`) and the compiled step's
   (`compiled_memory`), then showing the layout (`print_weight_table`, `show_layout`, `show_types`);
6. the check against one device (`train_single_device`, `equivalence_check`), and `run_rule_set`, which does 3-6
   for one rule set.
Each record a function returns (`TrainRun`, `StateBytes`, `Reference`, `RuleSetResult`, ...) sits just above it.

Below the `# Plumbing` banner: the run's folder and the command line, starting the devices (faked CPU devices,
several hosts), input checks, printing each rule set's result, the 8B table, the summary, the plot and `main`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from operator import ge, gt, le
from pathlib import Path
from typing import NamedTuple

if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load waits for main(), which reports it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
# Importing JAX does not start its backends; they start at the first jax.devices() or computation.
# That is why `--host-devices` can still set jax_num_cpu_devices in `start_devices`, after argument parsing.
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

# MaxText's config has one mesh axis per kind of parallelism (its mesh_axes: data, fsdp, tensor, ...), sized by
# ici_data_parallelism, ici_fsdp_parallelism, ici_tensor_parallelism, ...; here FSDP folds into 'data' and
# tensor parallelism into 'model'. Its activation names (activation_batch, ...) play the role of 'batch'.
MESH_AXES = ("data", "model")

# Rule sets in MaxText's `logical_axis_rules` form: an ordered sequence of (logical name, mesh axis)
# pairs, not a dict (a name may appear twice, as a fallback). A logical name that no rule assigns
# is replicated (None). `batch` names the first dimension of the input tokens.
RULE_SETS: dict[str, tuple[tuple[str, str | tuple[str, ...] | None], ...]] = {
    # data parallelism: split the batch along 'data'; no weight name is mentioned, so all are replicated
    "dp": (("batch", "data"),),
    # tensor (model) parallelism: split the wide weight dims along 'model'; the batch is replicated
    "tp": (("vocab", "model"), ("heads", "model"), ("mlp", "model")),
    # both: the batch along 'data', the wide weight dims along 'model'
    "dp_tp": (("batch", "data"), ("vocab", "model"), ("heads", "model"), ("mlp", "model")),
    # FSDP (ZeRO-3) + TP, MaxText's default style: 'data' splits the batch AND every weight's embed dim
    "fsdp": (("batch", "data"), ("embed", "data"), ("vocab", "model"), ("heads", "model"), ("mlp", "model")),
}


def flag(default, help: str, *, choices=None, min=None, max=None, gt=None):
    """A dataclass field that is also a command-line flag, with the bounds check_flags tests."""
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max, "gt": gt})


@dataclass
class Args:
    seed: int = flag(0, "seeds everything: nnx.Rngs for the weights and NumPy's Generator for the batches", min=0)
    host_devices: int = flag(
        -1,
        "fake N CPU devices (set before JAX starts); 0 = the devices there are; -1 = 8 on a CPU-only host, else 0",
        min=-1,
    )
    distributed: bool = flag(False, "call jax.distributed.initialize() first: one process per host in a multi-host run")
    coordinator_address: str = flag("", "with --distributed: host:port of process 0; empty = auto-detect")
    num_processes: int = flag(0, "with --distributed: how many processes in all; 0 = auto-detect", min=0)
    process_id: int = flag(-1, "with --distributed: this process's rank, 0..num_processes-1; -1 = auto-detect", min=-1)
    perturb: float = flag(0.0, "add this to one sharded weight before the check, to see it FAIL (0 = off)")
    mesh: str = flag("", "device mesh as DATAxMODEL, e.g. 4x2; empty = model 2 if the device count is even, else 1")
    axis_types: str = flag(
        "auto", "mesh axes: auto (GSPMD lays out activations) or explicit", choices=("auto", "explicit")
    )
    rules: str = flag("all", "logical-axis rule set to run", choices=(*RULE_SETS, "all"))
    steps: int = flag(40, "Adam steps per rule set (at least 2: the check repeats the last step)", min=2)
    batch_size: int = flag(32, "sequences in the global batch, split along the 'data' mesh axis", min=1)
    seq_len: int = flag(16, "tokens per input sequence", min=1)
    vocab: int = flag(64, "vocabulary size (logical axis 'vocab')", min=1)
    embed: int = flag(64, "model width (logical axis 'embed')", min=1)
    heads: int = flag(8, "attention heads (logical axis 'heads')", min=1)
    head_dim: int = flag(8, "width of one head (logical axis 'kv')", min=1)
    mlp: int = flag(256, "hidden width of the MLP (logical axis 'mlp')", min=1)
    learning_rate: float = flag(1e-2, "Adam learning rate", gt=0)
    tolerance: float = flag(1e-5, "largest |sharded - single device| allowed in the check", gt=0)
    donate: bool = flag(
        True,
        "donate the training state to the compiled step, which writes the new state into its buffers; "
        "--no-donate: every step holds the old and the new state at once",
    )
    hbm_gb: float = flag(80.0, "memory of one chip, in GB, for the 8B example", gt=0)
    memory_count: str = flag(
        "mixed",
        "bytes per trained parameter in the 8B example: mixed = mixed-precision Adam, 16 (bf16 weight and gradient, "
        "fp32 master weight, m and v); bf16 = all in bf16, 8 (too few: a common miscount)",
        choices=("mixed", "bf16"),
    )
    log_every: int = flag(10, "print a progress line every this many steps", min=1)
    visualize: bool = flag(True, "draw the mlp_in kernel's layout with jax.debug.visualize_array_sharding")
    out: str = flag(
        "runs/sharding_mesh", "each run writes metrics.json and loss_curve.png into a folder of its own here"
    )
    compile_cache: str = flag(
        "~/.cache/jax-rl-course", "JAX's persistent compilation cache: later runs skip compiling ('' turns it off)"
    )


# ---------------------------------------------------------------- devices and mesh


def make_mesh(shape: tuple[int, int], devices: list, axis_types: str = "auto") -> jax.sharding.Mesh:
    """A (data, model) grid of devices. Auto axes: we place the weights and the batch, and the compiler (GSPMD)
    propagates shardings to everything computed from them. Explicit axes: every array's sharding is part of its
    type (jax.typeof prints f32[64@data,256@model]), and an operation whose result layout is ambiguous must be told."""
    kind = AxisType.Explicit if axis_types == "explicit" else AxisType.Auto
    return jax.make_mesh(shape, MESH_AXES, axis_types=(kind,) * 2, devices=devices)


# ---------------------------------------------------------------- logical axes -> mesh axes


def logical_to_mesh_axes(logical_axes, rules, mesh_axes=MESH_AXES) -> tuple:
    """Resolve one array's logical axis names into mesh axes, the way MaxText and flax.linen do.

    Walk the rules in order. A rule (name, target) applies to the dimension called `name` if that
    dimension is still unassigned and none of the mesh axes in `target` is already used by another
    dimension of the same array. A dimension that no rule assigns is replicated: None.
    """
    result: list = [None] * len(logical_axes)
    assigned = [False] * len(logical_axes)
    used: set[str] = set()
    for name, target in rules:
        if name not in logical_axes:
            continue
        i = list(logical_axes).index(name)
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        unknown = [t for t in targets if t not in mesh_axes]
        if unknown:
            raise ValueError(f"rule ({name!r}, {target!r}) names mesh axes {unknown} not in the mesh {mesh_axes}")
        if assigned[i] or used & set(targets):
            continue  # dimension already placed, or that mesh axis is taken: try the next rule
        result[i], assigned[i] = target, True
        used |= set(targets)
    return tuple(result)


def axis_size(entry, mesh_sizes: dict[str, int]) -> int:
    """How many pieces one PartitionSpec entry cuts a dimension into (None -> 1)."""
    targets = (entry,) if isinstance(entry, str) else tuple(entry or ())
    return math.prod(mesh_sizes[t] for t in targets)


def shard_shape(shape, spec, mesh_sizes: dict[str, int]) -> tuple[int, ...]:
    """Per-device block of an array of `shape` laid out by `spec` (dims must divide evenly)."""
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    return tuple(dim // axis_size(s, mesh_sizes) for dim, s in zip(shape, spec))


def analytic_bytes(shape, itemsize: int, spec, mesh_sizes: dict[str, int]) -> int:
    """bytes/device = itemsize · Π_i (dim_i / pieces_i)."""
    return itemsize * math.prod(shard_shape(shape, spec, mesh_sizes))


# Llama-3.1-8B's weights: (name, shape, logical axes, how many). 8,030,261,248 parameters.
# Its 8 key/value heads are named 'heads' too, so they split like the query heads.
LLAMA_8B = (
    ("token_embed", (128256, 4096), ("vocab", "embed"), 1),
    ("attn_norm", (4096,), ("norm",), 32),
    ("query", (4096, 32, 128), ("embed", "heads", "kv"), 32),
    ("key", (4096, 8, 128), ("embed", "heads", "kv"), 32),
    ("value", (4096, 8, 128), ("embed", "heads", "kv"), 32),
    ("attn_out", (32, 128, 4096), ("heads", "kv", "embed"), 32),
    ("mlp_norm", (4096,), ("norm",), 32),
    ("mlp_gate", (4096, 14336), ("embed", "mlp"), 32),
    ("mlp_up", (4096, 14336), ("embed", "mlp"), 32),
    ("mlp_down", (14336, 4096), ("mlp", "embed"), 32),
    ("final_norm", (4096,), ("norm",), 1),
    ("unembed", (4096, 128256), ("embed", "vocab"), 1),
)
# Bytes and dtypes per trained parameter of (weight, gradient, fp32 master weight, Adam m + v), by --memory-count.
# Mixed-precision Adam computes with bf16 weights and gradients but updates an fp32 master copy with fp32 moments:
# 2 + 2 + 4 + 8 = 16 (fp32 throughout, 4 + 4 + 0 + 8, is 16 too). All in bf16 gives 8, half of what such a run keeps.
MEMORY_COUNTS = {
    "mixed": ((2, 2, 4, 8), ("bf16", "bf16", "fp32", "fp32")),
    "bf16": ((2, 2, 0, 4), ("bf16", "bf16", "no", "bf16")),
}


def big_model_memory(rules, mesh_sizes: dict[str, int], widths=MEMORY_COUNTS["mixed"][0]) -> dict[str, float]:
    """GB (1e9 bytes) per device of weights, grads, fp32 master weights and Adam state, by the same rule resolution."""
    values = sum(
        math.prod(shard_shape(shape, logical_to_mesh_axes(names, rules), mesh_sizes)) * count
        for _, shape, names, count in LLAMA_8B
    )
    gb = dict(zip(("params_gb", "grads_gb", "master_gb", "adam_gb"), (values * width / 1e9 for width in widths)))
    return {**gb, "total_gb": sum(gb.values())}


# ---------------------------------------------------------------- the model


NORMAL_INIT = nnx.initializers.normal(0.02)  # N(0, 0.02²), the usual init of a small transformer


def with_axes(names: tuple[str, ...], init=NORMAL_INIT):
    """An initializer whose Variable carries logical axis names (metadata `out_sharding`). We place the arrays
    ourselves (out_shardings, device_put), so NNX's eager sharding, which would want a mesh and rules naming every
    logical axis at construction, is off."""
    return nnx.with_partitioning(init, names, eager_sharding=False)


def batch_layout(weight, names: tuple[str, ...], rules):
    """A weight that meets the batch-split x outside a matmul, laid out as if a batch dim came first: the batch's mesh
    axis is gathered (fsdp: embed off 'data', FSDP's all-gather written out); else XLA rematerializes (README)."""
    if rules is None:  # one device: nothing to lay out
        return weight
    spec = P(*logical_to_mesh_axes(("batch", *names), rules)[1:])
    explicit = jax.sharding.get_abstract_mesh().are_all_axes_explicit  # reshard changes the type; Auto: a constraint
    return jax.sharding.reshard(weight, spec) if explicit else jax.lax.with_sharding_constraint(weight, spec)


class TinyLM(nnx.Module):
    """Embedding -> one pre-norm transformer block (causal attention + MLP) -> unembedding."""

    def __init__(self, args: Args, rngs: nnx.Rngs):
        # V vocabulary, E width, H heads, K head width, F MLP width, L sequence length
        V, E, H, K, F, L = args.vocab, args.embed, args.heads, args.head_dim, args.mlp, args.seq_len
        self.token_embed = nnx.Embed(V, E, embedding_init=with_axes(("vocab", "embed")), rngs=rngs)
        self.pos_embed = nnx.Param(with_axes(("length", "embed"))(rngs.params(), (L, E)))
        norm = partial(nnx.RMSNorm, E, scale_init=with_axes(("norm",), nnx.initializers.ones), rngs=rngs)
        self.attn_norm, self.mlp_norm, self.final_norm = norm(), norm(), norm()
        qkv = partial(
            nnx.Einsum, "bld,dhk->blhk", (E, H, K), kernel_init=with_axes(("embed", "heads", "kv")), rngs=rngs
        )
        self.query, self.key, self.value = qkv(), qkv(), qkv()
        self.attn_out = nnx.Einsum(
            "blhk,hkd->bld", (H, K, E), kernel_init=with_axes(("heads", "kv", "embed")), rngs=rngs
        )
        self.mlp_in = nnx.Linear(E, F, use_bias=False, kernel_init=with_axes(("embed", "mlp")), rngs=rngs)
        self.mlp_out = nnx.Linear(F, E, use_bias=False, kernel_init=with_axes(("mlp", "embed")), rngs=rngs)
        self.unembed = nnx.Linear(E, V, use_bias=False, kernel_init=with_axes(("embed", "vocab")), rngs=rngs)

    def __call__(self, tokens, rules=None):  # (B, L) int32
        """rules=None: one device. With rules, Auto axes leave the activations' layouts to the compiler; Explicit axes
        resolve each activation's logical names to its `out_sharding`, as the weights' are. Both use batch_layout."""
        explicit = rules is not None and jax.sharding.get_abstract_mesh().are_all_axes_explicit

        def spec(*names):  # e.g. ('batch', 'length', 'embed') -> P('data', None, None) under fsdp
            return P(*logical_to_mesh_axes(names, rules)) if explicit else None

        L, by_token = tokens.shape[1], spec("batch", "length", "embed")
        table = batch_layout(self.token_embed.embedding[...], ("vocab", "embed"), rules)  # (V, E)
        position = batch_layout(self.pos_embed[...][:L], ("length", "embed"), rules)  # (L, E)
        x = table.at[tokens].get(out_sharding=by_token) + position  # (B, L, E): nnx.Embed's lookup, on this table
        h = self.attn_norm(x)
        by_head = spec("batch", "length", "heads", "kv")
        q, k, v = (layer(h, out_sharding=by_head) for layer in (self.query, self.key, self.value))  # (B, L, H, K)
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / jnp.sqrt(q.shape[-1])  # (B, H, L, L)
        causal = jnp.tril(jnp.ones((L, L), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = jnp.einsum("bhqs,bshk->bqhk", weights, v)  # (B, L, H, K)
        x = x + self.attn_out(attended, out_sharding=by_token)  # (B, L, E)
        hidden = jax.nn.gelu(self.mlp_in(self.mlp_norm(x), out_sharding=spec("batch", "length", "mlp")))
        x = x + self.mlp_out(hidden, out_sharding=by_token)
        # (B, L, V) logits, the whole vocabulary on each device: the loss picks each label's logit from it
        return self.unembed(self.final_norm(x), out_sharding=spec("batch", "length", None))


class TrainState(NamedTuple):
    """The model and its Adam state; nnx.state of a TrainState names its parts state["model"], state["optimizer"]."""

    model: TinyLM
    optimizer: nnx.Optimizer


def make_model_and_optimizer(args: Args) -> TrainState:
    model = TinyLM(args, nnx.Rngs(params=args.seed))
    # Adam's m and v copy each Param's metadata, logical axis names included, so they shard like it.
    return TrainState(model, nnx.Optimizer(model, optax.adam(args.learning_rate), wrt=nnx.Param))


def init_state(args: Args) -> nnx.State:
    """The TrainState's state as a pure pytree, for a jitted init."""
    return nnx.state(make_model_and_optimizer(args))


def abstract_state(args: Args):
    """graphdef + the state's shapes, dtypes and logical-axis metadata, without computing any value."""
    return nnx.split(nnx.eval_shape(lambda: make_model_and_optimizer(args)))


def mesh_specs(tree, rules, mesh_axes=MESH_AXES):
    """A PartitionSpec over mesh axes for every Variable of `tree`. nnx.get_partition_spec reads each one's
    logical names (the `out_sharding` metadata of with_axes; P() where there is none, as for Adam's step count),
    and `rules` resolve them. Call it outside nnx.logical_axis_rules: inside, Flax would resolve the names itself."""
    return jax.tree.map(
        lambda logical: P(*logical_to_mesh_axes(tuple(logical), rules, mesh_axes)), nnx.get_partition_spec(tree)
    )


def state_shardings(abstract, mesh, rules):
    """NamedSharding for every leaf, laid out by `rules` on `mesh` (like nnx.get_named_sharding, with our resolver)."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), mesh_specs(abstract, rules, mesh.axis_names))


def flax_shardings(abstract, mesh, rules):
    """The same layout by Flax's own path, nnx.logical_axis_rules + nnx.get_named_sharding. Flax looks each name up
    in the rules as in a dict (no fallback, no check that a mesh axis is used once per array) and keeps a name that
    no rule lists, so every name the state uses is listed here, None for the replicated ones."""
    names = {n for spec in jax.tree.leaves(nnx.get_partition_spec(abstract)) for n in spec if isinstance(n, str)}
    listed = {name for name, _ in rules}
    with nnx.logical_axis_rules((*rules, *((n, None) for n in sorted(names - listed)))):
        return nnx.get_named_sharding(abstract, mesh)


def same_specs(ours, theirs) -> bool:
    """Two trees of NamedSharding lay every leaf out alike (specs compared with trailing Nones dropped)."""

    def norm(spec):
        spec = tuple(spec)
        while spec and spec[-1] is None:
            spec = spec[:-1]
        return spec

    a, b = jax.tree.leaves(ours), jax.tree.leaves(theirs)
    return len(a) == len(b) and all(norm(x.spec) == norm(y.spec) for x, y in zip(a, b))


def init_sharded(args: Args, shardings) -> nnx.State:
    """Create model + Adam state directly in their shards: each device computes only its own pieces,
    so no device ever holds the full model (how MaxText initialises models too big for one chip)."""
    return jax.jit(partial(init_state, args), out_shardings=shardings)()


# ---------------------------------------------------------------- data, loss, compiled step


def make_batches(args: Args) -> np.ndarray:
    """Arithmetic sequences mod vocab, t_i = (start + stride·i) mod V with stride ∈ {1..4}: (steps, B, L+1) int32.

    Predicting t_{i+1} needs the last two tokens, so the model must learn to attend to the previous position.
    """
    rng = np.random.default_rng(args.seed)
    start = rng.integers(0, args.vocab, size=(args.steps, args.batch_size, 1))
    stride = rng.integers(1, 5, size=(args.steps, args.batch_size, 1))
    return ((start + stride * np.arange(args.seq_len + 1)) % args.vocab).astype(np.int32)


def place_batch(tokens: np.ndarray, mesh, rules) -> jax.Array:
    """Put one global batch on the mesh, split as the rules say for ('batch', 'length')."""
    sharding = NamedSharding(mesh, P(*logical_to_mesh_axes(("batch", "length"), rules, mesh.axis_names)))
    # Each device receives only its slice. Every host builds the same global batch from the same seed,
    # so this also works unchanged across hosts.
    return jax.make_array_from_callback(tokens.shape, sharding, lambda idx: tokens[idx])


def loss_fn(model: TinyLM, tokens, rules=None) -> jax.Array:
    """Next-token cross-entropy: predict tokens[:, 1:] from tokens[:, :-1]."""
    logits = model(tokens[:, :-1], rules)  # (B, L, V)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@dataclass(frozen=True)
class StepConfig:
    """What the compiled step needs at trace time besides the graphdef."""

    grad_shardings: nnx.State  # a NamedSharding per parameter: the model part of the state's shardings
    activation_rules: tuple | None = None  # the rules for TinyLM's batch_layout and (Explicit axes) its activations


def loss_and_grads(graphdef, config: StepConfig, state, tokens):
    """Loss and gradients; each gradient is laid out like its parameter (the compiler reduce-scatters)."""
    model = nnx.merge(graphdef, state).model
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, config.activation_rules)
    return loss, jax.lax.with_sharding_constraint(grads, config.grad_shardings)


def train_step(graphdef, config: StepConfig, state, tokens):
    """One Adam step on a pure pytree (split/merge pattern: jax.jit sees only arrays).

    It also returns the gradients, only so that the memory table can read their real shards; a production
    step would not keep them alive between steps. compile_step donates `state`: the caller never reads it again."""
    loss, grads = loss_and_grads(graphdef, config, state, tokens)
    train_state = nnx.merge(graphdef, state)
    train_state.optimizer.update(train_state.model, grads)  # θ ← θ − lr·m̂/(√v̂ + ε)
    return nnx.state(train_state), loss, grads


def compile_step(graphdef, shardings, activation_rules=None, donate: bool = True):
    """train_step compiled once for one layout: step(state, tokens) -> (state, loss, grads)."""
    # The model part of the state's shardings is the layout for the gradients.
    # out_shardings pins the updated state to the layout the rules chose, step after step.
    # donate_argnames: XLA writes the new state into the buffers of the old one, which the call deletes, so a
    # device holds one training state, not two (memory_analysis counts those bytes as `aliased`).
    config = StepConfig(grad_shardings=shardings["model"], activation_rules=activation_rules)
    return jax.jit(
        partial(train_step, graphdef, config),
        out_shardings=(shardings, None, config.grad_shardings),
        donate_argnames="state" if donate else (),
    )


def log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def to_host(tree):
    """Full NumPy copy of every leaf (gathers across hosts when the arrays span several). A copy, not np.asarray's
    view of a CPU buffer: a view would keep the step from donating that buffer."""

    def get(x):
        return np.array(x) if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)

    return jax.tree.map(get, tree)


class TrainRun(NamedTuple):
    state: nnx.State  # after the last step
    losses: list[float]  # one per step
    after_step1: nnx.State  # host copy after step 1
    before_last: nnx.State  # host copy before the last step


def train(args: Args, step, state, batches, mesh, rules, label: str) -> TrainRun:
    """Run every batch through `step`, printing a progress line every --log-every steps.

    `step` donates the state it is given, so each call's state is the previous call's output and nothing else
    reads it. The losses stay on the devices; only a progress line reads one (waiting for its step, so that
    steps/s counts finished steps), and all of them come to the host once, at the end."""
    losses, after_step1, before_last, t0 = [], None, None, time.perf_counter()
    for i, tokens in enumerate(batches, start=1):
        if i == len(batches):
            before_last = to_host(state)
        state, loss, _ = step(state, place_batch(tokens, mesh, rules))
        losses.append(loss)
        if i == 1:
            after_step1, t0 = to_host(state), time.perf_counter()  # steps/s excludes compilation
        if i % args.log_every == 0 or i == len(batches):
            log(
                f"rules={label} step={i} loss={float(loss):.4f} sps={(i - 1) / max(time.perf_counter() - t0, 1e-9):.0f}"
            )
    return TrainRun(state, [float(x) for x in jax.device_get(losses)], after_step1, before_last)


# ---------------------------------------------------------------- measuring


def measured_bytes(tree) -> int:
    """Bytes on the fullest local device, read from the arrays' addressable shards."""
    per_device: dict = {}
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return max(per_device.values())


class StateBytes(NamedTuple):
    params: int
    grads: int
    adam: int
    total: int

    @classmethod
    def of(cls, params: int, grads: int, adam: int) -> StateBytes:
        return cls(params, grads, adam, params + grads + adam)


def state_bytes(graphdef, state, grads, mesh, rules) -> tuple[StateBytes, StateBytes]:
    """Per-device bytes of params, grads and Adam state: (measured from the shards, analytic from the names)."""
    sizes = dict(mesh.shape)

    def analytic(tree) -> int:
        specs = jax.tree.leaves(mesh_specs(tree, rules, mesh.axis_names))
        return sum(
            analytic_bytes(x.shape, x.dtype.itemsize, spec, sizes) for x, spec in zip(jax.tree.leaves(tree), specs)
        )

    train_state = nnx.merge(graphdef, state)
    params, opt_state = nnx.state(train_state.model, nnx.Param), nnx.state(train_state.optimizer)
    measured = StateBytes.of(measured_bytes(params), measured_bytes(grads), measured_bytes(opt_state))
    return measured, StateBytes.of(analytic(params), analytic(params), analytic(opt_state))


class CompiledMemory(NamedTuple):
    """What XLA's compiled step reserves on one device (bytes), from `memory_analysis()`."""

    arguments: int  # the state and the batch shard passed in
    outputs: int  # the new state, the loss and the gradients returned
    aliased: int  # outputs written into donated arguments' buffers (the new state into the old): counted once
    temporaries: int  # activations and scratch buffers live inside the step
    peak: int  # XLA's own estimate of the most live at once


def compiled_memory(step, state, tokens) -> CompiledMemory | None:
    """Compile `step` for these inputs and read its per-device memory; None if the backend reports nothing.
    Lowering reads only shapes and shardings: it donates nothing."""
    m = step.lower(state, tokens).compile().memory_analysis()
    if m is None:
        return None
    return CompiledMemory(
        m.argument_size_in_bytes,
        m.output_size_in_bytes,
        m.alias_size_in_bytes,
        m.temp_size_in_bytes,
        m.peak_memory_in_bytes,
    )


class WeightRow(NamedTuple):
    name: str  # 'mlp_in/kernel'
    shape: tuple[int, ...]
    logical: tuple[str, ...]  # its logical axis names
    spec: tuple  # the PartitionSpec the rules give
    actual_spec: tuple  # the one the placed array holds (padded with None)
    shard_shape: tuple[int, ...]  # one device's block
    uniform: bool  # every local shard has that shape
    bytes: int  # measured on the fullest device
    analytic: int  # itemsize · Π(dim / pieces)


def weight_table(graphdef, state, mesh, rules) -> list[WeightRow]:
    """One row per parameter: shape, logical axes, spec, shard shape and bytes/device (measured + analytic)."""
    model = nnx.merge(graphdef, state).model
    sizes = dict(mesh.shape)
    rows = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        arr, names = var[...], var.out_sharding  # the array, and with_axes' logical names
        spec = logical_to_mesh_axes(names, rules, mesh.axis_names)
        rows.append(
            WeightRow(
                name="/".join(map(str, path)),
                shape=tuple(arr.shape),
                logical=tuple(names),
                spec=spec,
                actual_spec=tuple(arr.sharding.spec) + (None,) * (arr.ndim - len(arr.sharding.spec)),
                shard_shape=tuple(arr.addressable_shards[0].data.shape),
                uniform=len({shard.data.shape for shard in arr.addressable_shards}) == 1,
                bytes=measured_bytes(arr),
                analytic=analytic_bytes(arr.shape, arr.dtype.itemsize, spec, sizes),
            )
        )
    return rows


# ---------------------------------------------------------------- showing the layout


def fmt_spec(spec) -> str:
    return "P(" + ", ".join(repr(s) for s in spec) + ")"


def print_weight_table(rows, flax_agrees: bool) -> None:
    log(f"  {'weight':<22}{'shape':<14}{'logical axes':<26}{'PartitionSpec':<28}{'shard':<13}{'bytes/dev':>9}")
    for r in rows:
        log(
            f"  {r.name:<22}{str(r.shape):<14}{str(r.logical):<26}{fmt_spec(r.spec):<28}"
            f"{str(r.shard_shape):<13}{r.bytes:>9}"
        )
    log(f"  nnx.logical_axis_rules + nnx.get_named_sharding give the same specs for the whole state: {flax_agrees}")


def show_layout(graphdef, state) -> None:
    """Draw which devices hold which block of the mlp_in kernel (jax.debug.visualize_array_sharding)."""
    kernel = nnx.merge(graphdef, state).model.mlp_in.kernel[...]
    log(
        f"  mlp_in kernel {tuple(kernel.shape)}, logical ('embed', 'mlp') -> {fmt_spec(kernel.sharding.spec)}; "
        f"one box per distinct shard, naming the devices that hold it:"
    )
    jax.debug.visualize_array_sharding(kernel, use_color=False, scale=0.6, max_width=100)


def show_types(when: str, graphdef, state, tokens, rules, grads=None) -> None:
    """Explicit axes: print jax.typeof of one weight, the batch and (after a step) that weight's gradient."""
    model = nnx.merge(graphdef, state).model
    kernel = model.mlp_in.kernel[...]
    line = f"  types {when}: mlp_in kernel {jax.typeof(kernel)}, batch {jax.typeof(tokens)}"
    if grads is not None:
        line += f", its gradient {jax.typeof(grads['mlp_in']['kernel'][...])}"
    log(line)
    if grads is None:  # the layout changes inside TinyLM (batch_layout), done here on the real weights to print them
        for name, weight, names in (
            ("pos_embed", model.pos_embed[...], ("length", "embed")),
            ("token_embed", model.token_embed.embedding[...], ("vocab", "embed")),
        ):
            log(f"  reshard: {name} {jax.typeof(weight)} -> {jax.typeof(batch_layout(weight, names, rules))}")


# ---------------------------------------------------------------- the check against one device


class Reference(NamedTuple):
    """The single-device run, as host copies."""

    init: nnx.State  # the initial state, which every rule set starts from too
    losses: list[float]  # one per step
    after_step1: nnx.State
    before_last: nnx.State  # the state the check starts from
    final: nnx.State  # ... and the one it must reproduce


def train_single_device(args: Args, graphdef, abstract, batches) -> Reference:
    """The reference: the same init, the same batches, every step on one device."""
    mesh, rules = make_mesh((1, 1), [jax.local_devices()[0]]), RULE_SETS["dp"]
    shardings = state_shardings(abstract, mesh, rules)
    state = init_sharded(args, shardings)
    init = to_host(state)
    run = train(
        args, compile_step(graphdef, shardings, donate=args.donate), state, batches, mesh, rules, "single_device"
    )
    return Reference(init, run.losses, run.after_step1, run.before_last, to_host(run.state))


def max_abs_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def perturbed(state, delta: float):
    """The state with `delta` added to every value of its first weight matrix (--perturb); delta 0: unchanged."""
    if not delta:
        return state
    leaves, tree = jax.tree.flatten(state)
    i = next(k for k, x in enumerate(leaves) if x.ndim >= 2)
    return jax.tree.unflatten(tree, [*leaves[:i], leaves[i] + delta, *leaves[i + 1 :]])


def equivalence_check(step, shardings, reference: Reference, tokens, mesh, rules, perturb: float):
    """The same Adam step (the last one), from the same state (the single-device run's, resharded by these rules),
    on the same batch, must give the same loss and updated values as on one device.

    Returns the largest |sharded - single device|, and the sharded step's new state and gradients."""
    start = perturbed(jax.device_put(reference.before_last, shardings), perturb)
    state, loss, grads = step(start, place_batch(tokens, mesh, rules))
    diff = max(abs(float(loss) - reference.losses[-1]), max_abs_diff(to_host(state), reference.final))
    return diff, state, grads


class RuleSetResult(NamedTuple):
    rules: tuple
    bytes_per_device: StateBytes  # measured from the shards
    analytic_bytes_per_device: StateBytes  # counted from the names
    bytes_match_analytic: bool  # ... for the totals and every weight, with the specs as intended
    compiled: CompiledMemory | None  # what the compiled step reserves per device (XLA's memory_analysis)
    flax_rules_agree: bool  # nnx.logical_axis_rules + nnx.get_named_sharding give the same specs
    max_abs_diff_vs_single_device: float  # the check
    fresh_adam_step1_max_abs_diff: float  # reported, not checked
    loss_curve_max_abs_diff: float  # reported, not checked
    losses: list[float]
    weights: list[WeightRow]
    passed: bool  # the check is within --tolerance

    def to_json(self) -> dict:
        """Its record in metrics.json: each field, a record (NamedTuple) as a dict, the weights by name."""
        record = {k: v._asdict() if hasattr(v, "_asdict") else v for k, v in self._asdict().items()}
        return {**record, "weights": {w.name: w._asdict() for w in self.weights}}


def run_rule_set(args: Args, name: str, mesh, graphdef, abstract, batches, reference: Reference) -> RuleSetResult:
    """Place the model by one rule set, print its weight table, train it, count its bytes and check it."""
    rules = RULE_SETS[name]
    log(f"\n=== rule set {name}: {rules}")
    shardings = state_shardings(abstract, mesh, rules)
    agrees = same_specs(shardings, flax_shardings(abstract, mesh, rules))
    # Each device receives only its shards of the initial values: the same values init_sharded computes,
    # without compiling the initializer again for every layout.
    state = jax.device_put(reference.init, shardings)
    rows = weight_table(graphdef, state, mesh, rules)
    print_weight_table(rows, agrees)
    if args.visualize and jax.process_index() == 0:
        show_layout(graphdef, state)
    explicit = args.axis_types == "explicit"
    step = compile_step(graphdef, shardings, activation_rules=rules, donate=args.donate)
    if explicit:
        show_types("before the first step", graphdef, state, place_batch(batches[0], mesh, rules), rules)
    run = train(args, step, state, batches, mesh, rules, name)
    diff, check_state, grads = equivalence_check(step, shardings, reference, batches[-1], mesh, rules, args.perturb)
    if explicit:
        show_types("after the last step", graphdef, check_state, place_batch(batches[-1], mesh, rules), rules, grads)
    measured, analytic = state_bytes(graphdef, check_state, grads, mesh, rules)
    memory = compiled_memory(step, check_state, place_batch(batches[-1], mesh, rules))
    exact = measured == analytic and all(r.bytes == r.analytic and r.uniform and r.actual_spec == r.spec for r in rows)
    # Not the check, but reported: step 1 from a fresh Adam state, and the two whole loss curves.
    first = max(abs(run.losses[0] - reference.losses[0]), max_abs_diff(run.after_step1, reference.after_step1))
    curve = max(abs(a - b) for a, b in zip(run.losses, reference.losses))
    return RuleSetResult(
        rules, measured, analytic, exact, memory, agrees, diff, first, curve, run.losses, rows, diff <= args.tolerance
    )


# Plumbing: the run folder, the command line, starting the devices, input checks, printing, the plot and main.


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


def start_devices(args: Args) -> list:
    """Fake CPU devices and/or join a multi-host run, then return the devices to build the mesh from.

    jax_num_cpu_devices splits the CPU into that many devices; JAX reads it once, when it starts its CPU backend
    (the first jax.devices() call). --host-devices -1 (the default) asks for 8, unless XLA_FLAGS already sets
    --xla_force_host_platform_device_count; either only shapes the CPU backend, so on a GPU or TPU host the real
    accelerators are used. If JAX had already started (inside a test or a notebook), it keeps the devices it has:
    --host-devices N then stops with a one-line error, and a one-device run says that nothing is sharded.
    """
    auto = args.host_devices < 0
    want = 8 if auto else args.host_devices  # --host-devices -1: 8 faked devices on a CPU-only host
    counted = "--xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")  # a count set by hand
    if want > 0 and not (auto and counted):
        try:
            jax.config.update("jax_num_cpu_devices", want)
        except RuntimeError:  # JAX had already started: it keeps its devices
            local = len(jax.local_devices(backend="cpu"))
            if not auto and local != want:
                raise RunError(
                    f"--host-devices {want} came too late: JAX had already started with "
                    f"{local} CPU device(s); run the script from the command line"
                ) from None
    if args.distributed:
        # Every process runs this same script; the flags left empty are auto-detected (see the README).
        try:
            jax.distributed.initialize(
                coordinator_address=args.coordinator_address or None,
                num_processes=args.num_processes or None,
                process_id=None if args.process_id < 0 else args.process_id,
            )
        except Exception as e:  # noqa: BLE001 - any failure to join is a one-line error
            raise RunError(f"jax.distributed.initialize() failed: {str(e).splitlines()[0]}") from e
    if auto:
        devices = jax.devices()
        if devices[0].platform == "cpu":
            how = f"XLA_FLAGS={os.environ['XLA_FLAGS']}" if counted else f"jax_num_cpu_devices={want}"
            log(
                f"devices: this host has only a CPU, so the script fakes {len(jax.local_devices())} CPU devices "
                f"({how}); --host-devices 0 uses the one real device"
            )
        return devices
    return jax.devices("cpu") if args.host_devices else jax.devices()  # every process's devices


def parse_mesh(text: str) -> tuple[int, int]:
    """'4x2' -> (4, 2); anything else raises RunError."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(s.isdigit() and int(s) > 0 for s in parts):
        raise RunError(f"--mesh must look like DATAxMODEL with positive integers, e.g. 4x2, got {text!r}")
    return int(parts[0]), int(parts[1])


def mesh_shape(args: Args, n_devices: int) -> tuple[int, int]:
    """(data, model) sizes: --mesh if given (it must use every device), else model 2 when it divides."""
    if args.mesh:
        data, model = parse_mesh(args.mesh)
        if data * model != n_devices:
            raise RunError(
                f"--mesh {args.mesh} needs {data * model} devices but there are {n_devices}; "
                f"DATA x MODEL must equal the device count"
            )
        return data, model
    model = 2 if n_devices % 2 == 0 else 1
    return n_devices // model, model


def validate(args: Args) -> None:
    """Every flag's own bounds, --mesh's form and the relations between flags, before any work."""
    check_flags(args)
    if args.mesh:
        parse_mesh(args.mesh)
    if args.num_processes and args.process_id >= args.num_processes:  # a rank names one of the processes
        raise RunError(
            f"--process-id {args.process_id} is not a rank of --num-processes {args.num_processes}: "
            f"ranks run 0..{args.num_processes - 1}"
        )


def check_splits(args: Args, rule_sets, mesh) -> None:
    """Every dimension a rule set splits must split into equal parts on `mesh`; else raise RunError."""
    sizes = dict(mesh.shape)
    for name in rule_sets:
        for logical in ("batch", "vocab", "embed", "heads", "mlp"):  # the flag of each: --batch-size, --vocab, ...
            flag_name = "batch_size" if logical == "batch" else logical
            dim = getattr(args, flag_name)
            pieces = axis_size(logical_to_mesh_axes((logical,), RULE_SETS[name])[0], sizes)
            if dim % pieces:
                raise RunError(
                    f"--{flag_name.replace('_', '-')} {dim} does not split into {pieces} equal parts, as rule set "
                    f"{name!r} on mesh {sizes['data']}x{sizes['model']} needs; pick a multiple of {pieces}"
                )


def verdict(passed: bool, mesh) -> str:
    """PASS / FAIL, or n/a when the mesh holds one device: then both runs are the same run and prove nothing."""
    if mesh.devices.size == 1:
        return "n/a (nothing is sharded: the mesh holds one device)"
    return "PASS" if passed else "FAIL"


def print_rule_set_result(args: Args, name: str, result: RuleSetResult, mesh, seconds: float) -> None:
    measured, analytic = result.bytes_per_device, result.analytic_bytes_per_device
    log(
        f"  bytes/device: params={measured.params} grads={measured.grads} adam={measured.adam} "
        f"total={measured.total} (analytic {analytic.total}) analytic_match={result.bytes_match_analytic}"
    )
    if result.compiled is None:
        log("  compiled step per device: this backend's memory_analysis() reports nothing")
    else:
        c = result.compiled
        log(
            f"  compiled step per device: arguments={c.arguments} outputs={c.outputs} aliased={c.aliased} "
            f"temporaries={c.temporaries} peak={c.peak} (XLA memory_analysis)"
        )
    log(
        f"check rules={name} step_max_abs_diff={result.max_abs_diff_vs_single_device:.2e} tol={args.tolerance:.0e} "
        f"{verdict(result.passed, mesh)} (fresh_adam_step1_diff={result.fresh_adam_step1_max_abs_diff:.2e} "
        f"loss_curve_diff={result.loss_curve_max_abs_diff:.2e}) seconds={seconds:.1f}"
    )


def report_8b(hbm_gb: float, count: str = "mixed") -> dict:
    """Print and return the 8B example's memory per device on a 4x2 mesh for every rule set, counted as `count`."""
    mesh_sizes = {"data": 4, "model": 2}
    n_params = sum(math.prod(shape) * k for _, shape, _, k in LLAMA_8B)
    widths, dtypes = MEMORY_COUNTS[count]
    parts = " + ".join(
        f"{t} {part} {w}" for t, part, w in zip(dtypes, ("weight", "gradient", "master", "adam"), widths)
    )
    log(
        f"\n=== 8B example ({n_params:,} parameters) on a 4x2 mesh, GB per device; fits = total <= {hbm_gb:g} GB "
        f"(activations not counted)\n  bytes per parameter (--memory-count {count}): {parts} = {sum(widths)}"
    )
    table: dict = {}
    for name in RULE_SETS:
        memory = big_model_memory(RULE_SETS[name], mesh_sizes, widths)
        table[name] = {**memory, "fits": memory["total_gb"] <= hbm_gb}
        log(
            f"  {name:<7} params={memory['params_gb']:6.2f} grads={memory['grads_gb']:6.2f} "
            f"master={memory['master_gb']:6.2f} adam={memory['adam_gb']:6.2f} total={memory['total_gb']:7.2f} "
            f"fits={table[name]['fits']}"
        )
    return dict(memory_count=count, bytes_per_param=sum(widths), rule_sets=table)


def plot_curve(path: str, curves: dict[str, list[float]]) -> None:
    """Left: every rule set's loss curve over the single-device one (they coincide, so each gets its own marker).
    Right: each rule set's gap to the single-device curve, |sharded - single device| per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    single = np.asarray(curves["single device"])
    steps = np.arange(1, len(single) + 1)
    fig, (ax_loss, ax_gap) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_loss.plot(steps, single, color="black", lw=6, alpha=0.2, label="single device")
    markers = "os^Dv<>p"
    for k, (label, losses) in enumerate((lbl, c) for lbl, c in curves.items() if lbl != "single device"):
        every = (k, max(len(single) // 8, 1))  # staggered markers, so curves that coincide stay visible
        ax_loss.plot(steps, losses, lw=1, marker=markers[k % len(markers)], markevery=every, ms=5, label=label)
        gap = np.abs(np.asarray(losses) - single)
        ax_gap.plot(steps, np.where(gap > 0, gap, np.nan), marker=markers[k % len(markers)], ms=3, lw=1, label=label)
    for ax, ylabel, title in (
        (ax_loss, "train loss (cross-entropy)", "loss: the sharded curves lie on the single-device one"),
        (ax_gap, "|sharded - single device| loss", "the gap, float32 rounding (0 not drawn)"),
    ):
        ax.set(xlabel="Adam step", ylabel=ylabel, yscale="log", title=title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_summary(args: Args, results: dict[str, RuleSetResult], metrics: dict, mesh) -> None:
    log("\n=== summary per device: bytes of the state (from its shards) and of the compiled step (memory_analysis)")
    columns = ("state", "arguments", "outputs", "aliased", "temporaries", "peak", "final_loss", "max_abs_diff")
    log(f"{'rules':<7}" + "".join(f"{c:>13}" for c in columns))
    for name, r in results.items():
        compiled = "".join(f"{v:>13}" for v in r.compiled) if r.compiled else f"{'(memory_analysis: none)':>65}"
        log(
            f"{name:<7}{r.bytes_per_device.total:>13}{compiled}{r.losses[-1]:>13.4f}"
            f"{r.max_abs_diff_vs_single_device:>13.2e}"
        )
    log(
        f"max_abs_diff_vs_single_device={metrics['max_abs_diff_vs_single_device']:.2e} tol={args.tolerance:.0e} "
        f"check={verdict(metrics['check_passed'], mesh)} seconds={metrics['seconds']}"
    )


def run_metrics(args: Args, devices, mesh, results, reference: Reference, memory_8b, t_start) -> dict:
    """metrics.json: the devices and mesh, each rule set's result (`check_passed`: all of them pass the check and the
    byte count; None on one device), the single-device losses and the 8B table (main adds the flags under 'args')."""
    ok = all(r.passed and r.bytes_match_analytic for r in results.values())
    return dict(
        devices=len(devices),
        platform=devices[0].platform,
        processes=jax.process_count(),
        mesh=dict(mesh.shape),
        axis_types=args.axis_types,
        rules=list(results),
        tolerance=args.tolerance,
        max_abs_diff_vs_single_device=max(r.max_abs_diff_vs_single_device for r in results.values()),
        check_passed=ok if mesh.devices.size > 1 else None,
        bytes_per_device={name: r.bytes_per_device.total for name, r in results.items()},
        rule_sets={name: r.to_json() for name, r in results.items()},
        single_device_losses=reference.losses,
        llama_8b_4x2=memory_8b,
        seconds=round(time.perf_counter() - t_start, 2),
    )


class SelfCheckError(RunError):
    """The sharded runs failed the script's own check: a sharded step computed something else than the one-device
    step, or a device holds other bytes than the rules say."""


def self_check(args: Args, results: dict[str, RuleSetResult]) -> None:
    """Raise SelfCheckError naming each rule set that failed, and how."""
    failed = [
        f"rule set {name}'s last step differs from the single-device one by {r.max_abs_diff_vs_single_device:.2e} "
        f"(more than --tolerance {args.tolerance:g})"
        if not r.passed
        else f"rule set {name}'s bytes per device differ from the analytic count"
        for name, r in results.items()
        if not (r.passed and r.bytes_match_analytic)
    ]
    if failed:
        raise SelfCheckError("self-check failed: " + "; ".join(failed))


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
    run = None if args.distributed else Run(args)  # this run's own folder under --out
    use_compile_cache(args.compile_cache)
    t_start = time.perf_counter()
    devices = start_devices(args)  # with --distributed, this process joins the others here
    if args.distributed and jax.process_index() == 0:  # only process 0 writes
        run = Run(args)
    mesh = make_mesh(mesh_shape(args, len(devices)), devices, args.axis_types)
    names = list(RULE_SETS) if args.rules == "all" else [args.rules]
    check_splits(args, names, mesh)
    log(
        f"devices={len(devices)} platform={devices[0].platform} processes={jax.process_count()} "
        f"mesh=data:{mesh.shape['data']}xmodel:{mesh.shape['model']} axes={args.axis_types} rules={','.join(names)}"
    )

    batches, (graphdef, abstract) = make_batches(args), abstract_state(args)  # abstract: shapes and names, no values
    reference = train_single_device(args, graphdef, abstract, batches)
    results = {}
    with jax.set_mesh(mesh):  # the mesh every sharding and jax.sharding.reshard below refers to
        for name in names:
            t0 = time.perf_counter()
            results[name] = run_rule_set(args, name, mesh, graphdef, abstract, batches, reference)
            print_rule_set_result(args, name, results[name], mesh, seconds=time.perf_counter() - t0)
    curves = {"single device": reference.losses, **{n: r.losses for n, r in results.items()}}
    if run:  # from here on a stop keeps the loss curves
        run.save("loss_curve.png", plot_curve, curves)
    metrics = run_metrics(args, devices, mesh, results, reference, report_8b(args.hbm_gb, args.memory_count), t_start)
    print_summary(args, results, metrics, mesh)
    if run:
        run.finish({**metrics, "args": asdict(args)})
        print(f"outputs: {run.folder} (metrics.json, loss_curve.png)", flush=True)
    if args.distributed:  # one_line ends the process with os._exit, which skips the shutdown JAX does at exit
        jax.distributed.shutdown()
    self_check(args, results)  # a failed check is an error too, once its numbers are printed and saved
    return metrics


if __name__ == "__main__":
    main()
