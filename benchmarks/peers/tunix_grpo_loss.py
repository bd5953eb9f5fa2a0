"""Tunix's GRPO loss and advantages beside 4_GRPO_MNIST/grpo_mnist.py's, on the same fixed tensors.

Tunix (google-tunix 0.1.7) keeps its GRPO math in `tunix/rl/algo_core.py`: the loss `grpo_loss_fn`, reached as
`function_registry.get_policy_loss_fn("grpo")`, and the advantages `get_advantage_estimator("grpo")` (the
group's sample std) and `("drgrpo")` (no std); `tunix/rl/common.py` holds the KL estimators
(`compute_kl_divergence`), the aggregations (`aggregate_loss`) and `compute_per_token_logps`, which turns a
model's logits into the log-probabilities of the completion tokens. Tunix's loss takes a model: here a stand-in
whose logits are one parameter array z (answers × positions × vocabulary), so `compute_per_token_logps` computes
the log-probabilities from z as it would from a language model's output. The course's `grpo_loss` gets the same
z through a stand-in `Policy`. Both sides get the same completion tokens and masks, the same log-probabilities
of the rollout policy π_old and of π_ref, and the same advantages; both losses and their gradients with respect
to z are compared, in every case below:

- two rollouts of B = 5 prompts × G = 8 answers, N = 4 positions, 11 tokens: ragged answers (the completion mask
  ends at the first EOS), and the same with the all-equal group's answers masked out (`--drop-zero-var`);
- the advantages of `--adv-norm std` and `none` (from the course's `group_advantages`), fed to both sides;
- β = 0, and β = 0.04 with k1 (Tunix: `kl_loss_mode="kl"`) and k3 (`"low_var_kl"`);
- the three aggregations: `seq-mean-token-mean`, `token-mean`, `dr-grpo` (Tunix: `"sequence-mean-token-mean"`,
  `"token-mean"`, `"sequence-mean-token-scale"`).

The ratios π/π_old range over about e^±0.6, so many tokens lie outside 1 ± ε and the clip binds on some. Then the
advantages themselves: the course's `group_advantages` against Tunix's estimators on the same rewards.

    python3 -m venv /work/venv_tunix && /work/venv_tunix/bin/pip install -r benchmarks/peers/requirements_tunix.txt
    python tools/capture.py tunix_grpo_loss -- python benchmarks/peers/tunix_grpo_loss.py \
        --tunix-python /work/venv_tunix/bin/python

Run with a Python that has no Tunix (the course's), it starts itself again under --tunix-python.

`cases()` and `course_side()` need no Tunix: tests/test_grpo.py checks the results file against them.
"""

from __future__ import annotations

import sys
from itertools import product
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "tools"))
from course import load_script  # noqa: E402

g = load_script("4_GRPO_MNIST/grpo_mnist.py")

B, G, N, V = 5, 8, 4, g.VOCAB
PAD = -1  # Tunix's pad id: no token here is padding (the completion mask says which tokens count)
BETA, EPS = 0.04, 0.2
# rewards of the five groups: one right of eight, three right, four right, partial credit, all equal (all wrong)
REWARDS = np.array(
    [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0],
        [0, 1, 1, 0, 1, 0, 1, 0],
        [1, 2 / 3, 1 / 3, 0, 1 / 3, 2 / 3, 0, 1 / 3],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ],
    np.float32,
)
AGGS = {
    "seq-mean-token-mean": "sequence-mean-token-mean",
    "token-mean": "token-mean",
    "dr-grpo": "sequence-mean-token-scale",
}
KLS = {"β=0": (0.0, "k3"), "k1": (BETA, "k1"), "k3": (BETA, "k3")}
TUNIX_KL = {"k1": "kl", "k3": "low_var_kl"}


class Tensors(NamedTuple):
    z: np.ndarray  # (S, N, V) the policy's logits: the parameter both losses are differentiated by
    tokens: np.ndarray  # (S, N) completion tokens, EOS = 10 ends an answer
    logp_old: np.ndarray  # (S, N) log π_old of each token
    ref_logits: np.ndarray  # (S, N, V) π_ref's logits


class Case(NamedTuple):
    rollout: str  # "ragged" or "dropped" (the all-equal group masked out)
    adv_norm: str  # "std" or "none"
    kl: str  # "β=0", "k1", "k3"
    agg: str  # the course's --loss-agg

    @property
    def name(self) -> str:
        return f"{self.rollout:<8} {self.adv_norm:<5} {self.kl:<4} {self.agg}"


def tensors() -> Tensors:
    """Fixed inputs from NumPy's generator, seed 0: the same on every machine."""
    rng = np.random.default_rng(0)
    S = B * G
    z = rng.normal(0, 1.5, (S, N, V)).astype(np.float32)
    tokens = rng.integers(0, 10, (S, N))
    eos_at = rng.integers(0, N + 1, S)  # an answer of 0 … N−1 digits and EOS, or N digits and no EOS
    for i, t in enumerate(eos_at):
        if t < N:
            tokens[i, t] = g.EOS
    logp = np.asarray(g.token_logp(jnp.asarray(z), jnp.asarray(tokens)))
    logp_old = (logp + rng.uniform(-0.6, 0.6, (S, N))).astype(np.float32)  # ρ = π/π_old in about [0.55, 1.8]
    ref_logits = (z + rng.normal(0, 0.7, (S, N, V))).astype(np.float32)
    return Tensors(z, tokens, logp_old, ref_logits)


def masks(t: Tensors) -> dict[str, np.ndarray]:
    answer = np.asarray(g.completion_mask(jnp.asarray(t.tokens)))
    keep = np.repeat(np.asarray(g.has_signal(jnp.asarray(REWARDS))), G)[:, None]
    return {"ragged": answer, "dropped": answer * keep}


def advantages(norm: str) -> np.ndarray:
    """The course's group advantages of REWARDS, one per answer, (S,)."""
    return np.asarray(g.group_advantages(jnp.asarray(REWARDS), g.Args().adv_eps, norm)).reshape(-1)


def cases() -> list[Case]:
    return [Case(*c) for c in product(("ragged", "dropped"), ("std", "none"), KLS, AGGS)]


class CoursePolicy(nnx.Module):
    """grpo_loss's policy, reduced to its logits: encode gives one zero feature per prompt, __call__ returns z."""

    def __init__(self, z):
        self.z = nnx.Param(jnp.asarray(z))

    def encode(self, images, slots):
        return jnp.zeros((images.shape[0], 1))

    def __call__(self, prompt, tokens):
        return self.z[...]


def course_side(t: Tensors, case: Case) -> dict:
    """The course's grpo_loss on these tensors: the loss, its gradient with respect to z, clip_frac and kl."""
    beta, kl = KLS[case.kl]
    config = g.Args(
        group_size=G, batch_size=B, clip_eps=EPS, beta=beta, kl=kl, loss_agg=case.agg, adv_norm=case.adv_norm
    )
    strips = g.Strips(jnp.zeros((B, 1, 1)), jnp.zeros((B, 1)), jnp.zeros((B, 1), jnp.int32))
    rollout = g.Rollout(
        jnp.asarray(t.tokens),
        jnp.asarray(masks(t)[case.rollout]),
        jnp.asarray(t.logp_old),
        jnp.asarray(advantages(case.adv_norm))[:, None],
        jnp.asarray(t.ref_logits) if beta > 0 else None,
    )
    policy = CoursePolicy(t.z)
    (loss, metrics), grads = nnx.value_and_grad(g.grpo_loss, has_aux=True)(policy, strips, rollout, config)
    return {
        "loss": float(loss),
        "grad": np.asarray(grads["z"][...]),
        "clip_frac": float(metrics["clip_frac"]),
        "kl": float(metrics.get("kl", 0.0)),
    }


# ----------------------------------------------------------------------------- Tunix's side (needs google-tunix)
class TunixModel(nnx.Module):
    """A stand-in for Tunix's language model: prompt + completion tokens in, logits out. Tunix keeps the logits at
    positions P−1 … P+N−2 (each predicts the next token), so with a prompt of P = 1 token they are z."""

    def __init__(self, z):
        self.z = nnx.Param(jnp.asarray(z))

    def __call__(self, input_tokens, positions=None, cache=None, attention_mask=None):
        z = self.z[...]
        return jnp.concatenate([z, jnp.zeros_like(z[:, :1])], axis=1), None


def tunix_side(t: Tensors, case: Case) -> dict:
    from tunix.rl import common, function_registry
    from tunix.rl.grpo import grpo_learner

    beta, kl = KLS[case.kl]
    config = grpo_learner.GRPOConfig(
        num_generations=G, beta=beta, epsilon=EPS, loss_agg_mode=AGGS[case.agg], kl_loss_mode=TUNIX_KL[kl]
    )
    config.temperature = 1.0  # GrpoLearner sets it from the rollout config
    model = TunixModel(t.z)
    ref_logps = None
    if beta > 0:
        ref_logps = common.compute_per_token_logps(
            *nnx.split(TunixModel(t.ref_logits)),
            prompt_tokens=jnp.zeros((B * G, 1), jnp.int32),
            completion_tokens=jnp.asarray(t.tokens),
            pad_id=PAD,
            eos_id=g.EOS,
        )
    example = grpo_learner.TrainExample(
        prompt_ids=jnp.zeros((B * G, 1), jnp.int32),
        prompt_mask=jnp.ones((B * G, 1), jnp.int32),
        completion_ids=jnp.asarray(t.tokens),
        completion_mask=jnp.asarray(masks(t)[case.rollout]),
        advantages=jnp.asarray(advantages(case.adv_norm)),
        ref_per_token_logps=ref_logps,
        old_per_token_logps=jnp.asarray(t.logp_old),
    )
    loss_fn = function_registry.get_policy_loss_fn("grpo")
    (loss, aux), grads = nnx.value_and_grad(lambda m: loss_fn(m, example, config, PAD, g.EOS), has_aux=True)(model)
    return {
        "loss": float(loss),
        "grad": np.asarray(grads["z"][...]),
        "clip_frac": float(aux["pg_clipfrac"]),
        "kl": float(aux["kl"]) if beta > 0 else 0.0,
    }


def tunix_advantages() -> dict[str, np.ndarray]:
    from tunix.rl import function_registry

    flat = REWARDS.reshape(-1)
    return {name: np.asarray(function_registry.get_advantage_estimator(name)(flat, G)) for name in ("grpo", "drgrpo")}


def main(argv=None) -> None:
    """Run both sides here if this Python has Tunix; else start this file again under --tunix-python."""
    import argparse
    import importlib.util
    import os
    from importlib import metadata

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tunix-python", default="", help="a Python with google-tunix (used when this one has none)")
    a = p.parse_args(argv)
    if importlib.util.find_spec("tunix") is None:
        if not a.tunix_python:
            p.exit(1, "error: this Python has no google-tunix; pass --tunix-python PATH (requirements_tunix.txt)\n")
        if not os.access(a.tunix_python, os.X_OK):
            p.exit(1, f"error: --tunix-python {a.tunix_python!r} is not an executable\n")
        sys.stdout.flush()
        os.execv(a.tunix_python, [a.tunix_python, __file__])  # the same process: its output is this command's

    t = tensors()
    answer = masks(t)["ragged"] > 0
    ratio = np.exp(np.asarray(g.token_logp(jnp.asarray(t.z), jnp.asarray(t.tokens))) - t.logp_old)
    adv = advantages("std").reshape(-1, 1)
    binds = ((ratio > 1 + EPS) & (adv > 0)) | ((ratio < 1 - EPS) & (adv < 0))
    print(
        f"google-tunix {metadata.version('google-tunix')}, jax {jax.__version__}, flax {metadata.version('flax')}; "
        f"B={B} prompts × G={G} answers, N={N} positions, {V} tokens, ε={EPS}, β={BETA} where > 0"
    )
    print(
        f"answer tokens {answer.sum()} of {answer.size} (lengths {sorted(set(answer.sum(1).tolist()))}); "
        f"ρ in [{ratio[answer].min():.2f}, {ratio[answer].max():.2f}], "
        f"|ρ − 1| > ε on {(np.abs(ratio - 1) > EPS)[answer].sum()}, "
        f"the clip binds on {binds[answer].sum()} (--adv-norm std)"
    )
    print("\nthe loss and its gradient with respect to the logits, course (grpo_loss) against Tunix (grpo_loss_fn):")
    heads = ("course loss", "|Δ loss|", "max |Δ ∇|", "max |∇|", "|Δ clip_frac|", "|Δ kl|")
    print(f"{'rollout  adv   KL   --loss-agg':<42}" + "".join(f"{h:>14}" for h in heads))
    worst = {"loss": 0.0, "grad": 0.0, "clip_frac": 0.0, "kl": 0.0}
    for case in cases():
        ours, theirs = course_side(t, case), tunix_side(t, case)
        diff = {k: float(np.max(np.abs(np.asarray(ours[k]) - np.asarray(theirs[k])))) for k in worst}
        # clip_frac: Tunix counts over the mask it is given, the course over every answer token (dropped ones too)
        same_mask = case.rollout == "ragged"
        for k, v in diff.items():
            worst[k] = max(worst[k], v) if (k != "clip_frac" or same_mask) else worst[k]
        cells = (
            f"{ours['loss']:.9f}",
            f"{diff['loss']:.1e}",
            f"{diff['grad']:.1e}",
            f"{np.abs(ours['grad']).max():.4f}",
        )
        cells += (f"{diff['clip_frac']:.1e}" if same_mask else "–", f"{diff['kl']:.1e}")
        print(f"{case.name:<42}" + "".join(f"{c:>14}" for c in cells))
    print("\nthe advantages of the same rewards: the course's group_advantages against Tunix's estimators")
    ours_std, ours_none, theirs = advantages("std"), advantages("none"), tunix_advantages()
    print(f"{'group rewards':<42} {'course / Tunix (std)':>21} {'max |Δ| (none, drgrpo)':>24}")
    quotients, drgrpo = [], float(np.max(np.abs(ours_none - theirs["drgrpo"])))
    for b in range(B):
        rows = slice(b * G, (b + 1) * G)
        nonzero = np.abs(theirs["grpo"][rows]) > 0
        quotient = ours_std[rows][nonzero] / theirs["grpo"][rows][nonzero]
        quotients += quotient.tolist()
        shown = f"{quotient.min():.4f}…{quotient.max():.4f}" if nonzero.any() else "both 0 (all equal)"
        rewards = " ".join(f"{r:.2g}" for r in REWARDS[b])
        print(f"{rewards:<42} {shown:>21} {np.max(np.abs(ours_none[rows] - theirs['drgrpo'][rows])):>24.1e}")
    equal = ~np.asarray(g.has_signal(jnp.asarray(REWARDS)))
    both_zero = bool((ours_std.reshape(B, G)[equal] == 0).all() and (theirs["grpo"].reshape(B, G)[equal] == 0).all())

    print(
        f"\nloss: the largest difference over the {len(cases())} cases is {worst['loss']:.1e} in the loss, "
        f"{worst['grad']:.1e} in the gradient, {worst['clip_frac']:.1e} in clip_frac (ragged), {worst['kl']:.1e} in kl"
    )
    print(
        f"advantages, --adv-norm std / Tunix's grpo: {min(quotients):.4f}…{max(quotients):.4f} in every group with "
        f"signal, √(G/(G−1)) = {np.sqrt(G / (G - 1)):.4f} at G = {G}: population std (ddof 0) + {g.Args().adv_eps:g} "
        "here, sample std (ddof 1) + 1e-6 there"
    )
    print(
        f"advantages, --adv-norm none against Tunix's drgrpo: largest difference {drgrpo:.1e}; the all-equal group: "
        f"{'0 on both sides' if both_zero else 'NOT 0 on both sides'}"
    )


if __name__ == "__main__":
    main()
