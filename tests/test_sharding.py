"""Tests for 5_Sharding_Mesh/sharding_mesh.py: rule resolution, byte counts, the CLI on faked 8- and 4-device hosts."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import REPO, load_script, run_script

SCRIPT = "5_Sharding_Mesh/sharding_mesh.py"
sm = load_script(SCRIPT)

# Logical axes of the weights in the script's TinyLM, by the name the metrics use.
WEIGHT_AXES = {
    "token_embed/embedding": ("vocab", "embed"),
    "pos_embed": ("length", "embed"),
    "query/kernel": ("embed", "heads", "kv"),
    "attn_out/kernel": ("heads", "kv", "embed"),
    "mlp_in/kernel": ("embed", "mlp"),
    "mlp_out/kernel": ("mlp", "embed"),
    "unembed/kernel": ("embed", "vocab"),
    "attn_norm/scale": ("norm",),
}

# Hand-written expected PartitionSpecs for named weights (and the batch) under every rule set.
EXPECTED = {
    "dp": {
        "mlp_in/kernel": (None, None),
        "token_embed/embedding": (None, None),
        "attn_norm/scale": (None,),
        "batch": ("data", None),
    },
    "tp": {
        "mlp_in/kernel": (None, "model"),
        "mlp_out/kernel": ("model", None),
        "token_embed/embedding": ("model", None),
        "attn_out/kernel": ("model", None, None),
        "query/kernel": (None, "model", None),
        "attn_norm/scale": (None,),
        "batch": (None, None),
    },
    "dp_tp": {
        "mlp_in/kernel": (None, "model"),
        "unembed/kernel": (None, "model"),
        "pos_embed": (None, None),
        "batch": ("data", None),
    },
    "fsdp": {
        "mlp_in/kernel": ("data", "model"),
        "mlp_out/kernel": ("model", "data"),
        "token_embed/embedding": ("model", "data"),
        "query/kernel": ("data", "model", None),
        "pos_embed": (None, "data"),
        "attn_norm/scale": (None,),
        "batch": ("data", None),
    },
}


def _axes(name):
    return ("batch", "length") if name == "batch" else WEIGHT_AXES[name]


# ---------------------------------------------------------------- unit: rule resolution


@pytest.mark.unit
@pytest.mark.parametrize("rule_set", list(EXPECTED))
def test_partition_specs_of_named_weights(rule_set):
    for name, spec in EXPECTED[rule_set].items():
        assert sm.logical_to_mesh_axes(_axes(name), sm.RULE_SETS[rule_set]) == spec, (rule_set, name)


@pytest.mark.unit
def test_resolution_order_fallback_and_unmentioned_names():
    # 'mlp' takes 'model' first, so the later ('embed', 'model') finds the mesh axis used: embed stays None.
    assert sm.logical_to_mesh_axes(("embed", "mlp"), (("mlp", "model"), ("embed", "model"))) == (None, "model")
    # a name may appear twice: the second rule is a fallback when the first one's mesh axis is taken
    rules = (("mlp", "model"), ("embed", "model"), ("embed", "data"))
    assert sm.logical_to_mesh_axes(("embed", "mlp"), rules) == ("data", "model")
    # (name, None) pins the dimension to replicated; later rules for that name are skipped
    assert sm.logical_to_mesh_axes(("embed",), (("embed", None), ("embed", "data"))) == (None,)
    # a tuple target splits one dimension over several mesh axes
    assert sm.logical_to_mesh_axes(("batch", "length"), (("batch", ("data", "model")),)) == (("data", "model"), None)
    # names no rule mentions, and unnamed dimensions, are replicated
    assert sm.logical_to_mesh_axes(("norm", None), sm.RULE_SETS["fsdp"]) == (None, None)
    with pytest.raises(ValueError, match="not in the mesh"):
        sm.logical_to_mesh_axes(("embed",), (("embed", "fsdp"),))


@pytest.mark.unit
def test_resolver_agrees_with_flax_linen():
    import flax.linen as nn

    cases = [*WEIGHT_AXES.values(), ("batch", "length"), ("embed", "heads", "kv"), ("norm",)]
    extra = [
        (("mlp", "model"), ("embed", "model"), ("embed", "data")),
        (("batch", ("data", "model")),),
        (("embed", None), ("embed", "data"), ("mlp", "data")),
    ]
    for rules in [*sm.RULE_SETS.values(), *extra]:
        for axes in cases:
            assert tuple(nn.logical_to_mesh_axes(axes, rules)) == sm.logical_to_mesh_axes(axes, rules), (rules, axes)


@pytest.mark.unit
def test_flax_logical_axis_rules_give_the_same_shardings_as_the_resolver():
    """Beside the hand-written resolver: nnx.logical_axis_rules + nnx.get_named_sharding lay out the whole
    (model, Adam) state alike under every rule set (flax_shardings lists the unmentioned names with None)."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    _, abstract = sm.abstract_state(sm.Args())
    mesh = sm.make_mesh((1, 1), jax.devices()[:1])
    flax = {name: sm.flax_shardings(abstract, mesh, rules) for name, rules in sm.RULE_SETS.items()}
    for name, rules in sm.RULE_SETS.items():
        assert sm.same_specs(sm.state_shardings(abstract, mesh, rules), flax[name]), name
    assert nnx.to_pure_dict(flax["fsdp"])["model"]["mlp_in"]["kernel"].spec == P("data", "model")
    assert nnx.to_pure_dict(flax["fsdp"])["optimizer"]["opt_state"][0]["nu"]["pos_embed"].spec == P(None, "data")
    # the comparison can fail: different rule sets, or a tree with a leaf missing, are not the same layout
    assert not sm.same_specs(sm.state_shardings(abstract, mesh, sm.RULE_SETS["tp"]), flax["fsdp"])
    assert not sm.same_specs(flax["fsdp"], jax.tree.leaves(flax["fsdp"])[:-1])
    # where they differ: Flax looks names up one by one, ours skips a mesh axis already used by the same array
    with nnx.logical_axis_rules((*sm.RULE_SETS["fsdp"], ("length", None))):
        from flax.core.spmd import from_sharding_rules, get_logical_axis_rules

        flax_activation = from_sharding_rules(("batch", "length", "embed"), get_logical_axis_rules())
    assert tuple(flax_activation) == ("data", None, "data")  # 'data' twice: not a valid PartitionSpec
    assert sm.logical_to_mesh_axes(("batch", "length", "embed"), sm.RULE_SETS["fsdp"]) == ("data", None, None)


@pytest.mark.smoke
def test_a_run_reports_when_flax_and_the_resolver_disagree_and_a_stop_keeps_its_loss_curves(
    monkeypatch, tmp_path, capsys
):
    """The printed agreement is computed, not assumed: make Flax's path resolve fsdp's names by tp's rules. The same
    run is stopped (Ctrl-C) once trained, in the 8B table: its folder keeps the loss curves, says so, and is not
    `latest` (a stop during training keeps nothing: tests/test_interrupt.py)."""
    flax_shardings, print_result, seen = sm.flax_shardings, sm.print_rule_set_result, []
    monkeypatch.setattr(
        sm, "flax_shardings", lambda abstract, mesh, rules: flax_shardings(abstract, mesh, sm.RULE_SETS["tp"])
    )
    monkeypatch.setattr(sm, "print_rule_set_result", lambda *a, **k: seen.append(a[2]) or print_result(*a, **k))

    def stop(*args):  # Ctrl-C, once the run is trained
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler raises KeyboardInterrupt here

    monkeypatch.setattr(sm, "report_8b", stop)
    with pytest.raises(SystemExit) as e:
        sm.main(sm.Args(rules="fsdp", steps=2, host_devices=0, visualize=False, out=str(tmp_path)))
    assert seen[0].flax_rules_agree is False and seen[0].to_json()["flax_rules_agree"] is False
    assert e.value.code == 130
    out, err = capsys.readouterr()
    assert "give the same specs for the whole state: False" in out
    (folder,) = tmp_path.iterdir()
    assert [p.name for p in folder.iterdir()] == ["loss_curve.png"]
    assert err == f"interrupted; kept in {folder}: loss_curve.png (not complete: no metrics.json)\n"


@pytest.mark.unit
def test_nnx_eager_sharding_needs_every_logical_name_in_the_rules():
    """Flax NNX 0.12.8's own path passes an unmentioned name through unchanged, so it must be listed (→ None)."""
    import jax
    from flax import nnx

    mesh = sm.make_mesh((1, 1), jax.devices()[:1])
    init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("embed", "mlp"))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(sm.RULE_SETS["tp"]):
        with pytest.raises(ValueError, match="embed"):
            nnx.Linear(8, 16, use_bias=False, kernel_init=init, rngs=nnx.Rngs(0))
    completed = (*sm.RULE_SETS["tp"], ("embed", None))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(completed):
        layer = nnx.Linear(8, 16, use_bias=False, kernel_init=init, rngs=nnx.Rngs(0))
        nnx_spec = tuple(nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(layer)))["kernel"])
    assert nnx_spec == sm.logical_to_mesh_axes(("embed", "mlp"), sm.RULE_SETS["tp"]) == (None, "model")


@pytest.mark.unit
def test_the_original_guides_dict_of_rules_fails_on_both_flax_paths():
    """Common bug 1 of the README: rules written as a dict."""
    import flax.linen as nn
    from flax import nnx

    rules = {"embed": "data", "mlp": "model"}
    with pytest.raises(ValueError, match="Unknown axis rule specification type"):
        nn.logical_to_mesh_axes(("embed", "mlp"), rules)
    init = nnx.with_partitioning(nnx.initializers.normal(0.02), ("embed", "mlp"))
    with jax.set_mesh(sm.make_mesh((1, 1), jax.devices()[:1])), nnx.logical_axis_rules(rules):
        with pytest.raises(ValueError, match="too many values to unpack"):
            nnx.Linear(8, 16, use_bias=False, kernel_init=init, rngs=nnx.Rngs(0))
    # the same rules as a sequence of pairs resolve
    assert sm.logical_to_mesh_axes(("embed", "mlp"), tuple(rules.items())) == ("data", "model")


@pytest.mark.unit
def test_a_linear_without_with_partitioning_is_replicated_by_every_rule_set():
    """Common bug 2 of the README: a plain nnx.Linear carries no logical names, so no rule splits its kernel."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    plain = nnx.Linear(64, 256, use_bias=False, rngs=nnx.Rngs(0))
    named = nnx.Linear(64, 256, use_bias=False, kernel_init=sm.with_axes(("embed", "mlp")), rngs=nnx.Rngs(0))
    sizes = {"data": 4, "model": 2}
    for rules in sm.RULE_SETS.values():
        assert nnx.to_pure_dict(sm.mesh_specs(nnx.state(plain), rules))["kernel"] == P()
    spec = nnx.to_pure_dict(sm.mesh_specs(nnx.state(named), sm.RULE_SETS["fsdp"]))["kernel"]
    assert spec == P("data", "model")
    assert sm.analytic_bytes((64, 256), 4, (), sizes) == 65_536  # the README's numbers
    assert sm.analytic_bytes((64, 256), 4, spec, sizes) == 8_192


@pytest.mark.unit
@pytest.mark.parametrize(
    "rules, names, spec, expected",
    [
        ("fsdp", ("vocab", "embed"), ("model", "data"), ("model", None)),  # the token table keeps 'model'
        ("fsdp", ("length", "embed"), (None, "data"), (None, None)),  # pos_embed comes whole
        ("tp", ("vocab", "embed"), ("model", None), ("model", None)),  # no 'data' to gather: unchanged
        ("dp", ("length", "embed"), (None, None), (None, None)),
    ],
)
def test_batch_layout_gathers_only_the_mesh_axis_the_batch_uses(rules, names, spec, expected):
    """The weights TinyLM adds to or looks up in the batch-split x lose the batch's mesh axis ('data') and keep the
    rest. Read from the types on an Explicit 1x1 mesh: the layout itself, whatever XLA prints about it."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = sm.make_mesh((1, 1), jax.devices()[:1], "explicit")
    with jax.set_mesh(mesh):
        weight = jax.device_put(jnp.zeros((64, 64)), NamedSharding(mesh, P(*spec)))
        gathered = sm.batch_layout(weight, names, sm.RULE_SETS[rules])
    assert tuple(jax.typeof(gathered).sharding.spec) == expected


# ---------------------------------------------------------------- unit: bytes


@pytest.mark.unit
def test_shard_shape_and_analytic_bytes():
    sizes = {"data": 4, "model": 2}
    assert sm.shard_shape((64, 256), ("data", "model"), sizes) == (16, 128)
    assert sm.shard_shape((64, 256), (None, "model"), sizes) == (64, 128)
    assert sm.shard_shape((8, 8, 64), (("data", "model"),), sizes) == (1, 8, 64)
    assert sm.analytic_bytes((64, 256), 4, ("data", "model"), sizes) == 16 * 128 * 4
    assert sm.analytic_bytes((64,), 4, (None,), sizes) == 256
    assert sm.analytic_bytes((), 4, (), sizes) == 4


@pytest.mark.unit
def test_8b_example_arithmetic():
    n = sum(math.prod(shape) * k for _, shape, _, k in sm.LLAMA_8B)
    assert n == 8_030_261_248
    norms = 4096 * (2 * 32 + 1)  # replicated under every rule set
    sizes = {"data": 4, "model": 2}
    mixed, bf16 = sm.MEMORY_COUNTS["mixed"][0], sm.MEMORY_COUNTS["bf16"][0]
    assert mixed == (2, 2, 4, 8) and sum(mixed) == 16 and sum(bf16) == 8  # bytes per trained parameter
    dp = sm.big_model_memory(sm.RULE_SETS["dp"], sizes)  # mixed-precision Adam is the default count
    assert dp["params_gb"] == pytest.approx(n * 2 / 1e9) and dp["master_gb"] == pytest.approx(n * 4 / 1e9)
    assert dp["adam_gb"] == pytest.approx(n * 8 / 1e9) and dp["total_gb"] == pytest.approx(n * 16 / 1e9)
    assert dp["total_gb"] == pytest.approx(128.48, abs=0.01)  # plain data parallelism does not fit an 80 GB chip
    tp = sm.big_model_memory(sm.RULE_SETS["tp"], sizes)  # every non-norm weight has vocab/heads/mlp
    assert tp["total_gb"] == pytest.approx(((n - norms) / 2 + norms) * 16 / 1e9) and tp["total_gb"] < 80
    fsdp = sm.big_model_memory(sm.RULE_SETS["fsdp"], sizes)
    assert fsdp["total_gb"] == pytest.approx(((n - norms) / 8 + norms) * 16 / 1e9)
    # counted all in bf16, half as much: plain data parallelism seems to fit
    assert sm.big_model_memory(sm.RULE_SETS["dp"], sizes, bf16)["total_gb"] == pytest.approx(64.24, abs=0.01)


@pytest.mark.unit
def test_report_8b_flags_what_fits_and_prints_its_count(capsys):
    big = sm.report_8b(80.0)
    assert big["memory_count"] == "mixed" and big["bytes_per_param"] == 16
    assert list(big["rule_sets"]) == list(sm.RULE_SETS)
    assert big["rule_sets"]["dp"]["fits"] is False and big["rule_sets"]["tp"]["fits"] is True
    assert big["rule_sets"]["dp"]["total_gb"] == pytest.approx(128.48, abs=0.01)
    assert list(big["rule_sets"]["fsdp"]) == ["params_gb", "grads_gb", "master_gb", "adam_gb", "total_gb", "fits"]
    out = capsys.readouterr().out
    parts = "bf16 weight 2 + bf16 gradient 2 + fp32 master 4 + fp32 adam 8 = 16"
    assert f"  bytes per parameter (--memory-count mixed): {parts}\n" in out
    miscount = sm.report_8b(80.0, "bf16")
    assert miscount["bytes_per_param"] == 8 and miscount["rule_sets"]["dp"]["fits"] is True
    assert (
        "(--memory-count bf16): bf16 weight 2 + bf16 gradient 2 + no master 0 + bf16 adam 4 = 8\n"
        in capsys.readouterr().out
    )


# ---------------------------------------------------------------- unit: shardings of the whole state


@pytest.mark.unit
def test_state_shardings_follow_the_logical_names_for_params_and_adam():
    """state_shardings reads each Variable's names with nnx.get_partition_spec; Adam's m and v shard like their
    parameter, Adam's step count (no names) is replicated."""
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    _, abstract = sm.abstract_state(sm.Args())
    mesh = sm.make_mesh((1, 1), jax.devices()[:1])
    shardings = sm.state_shardings(abstract, mesh, sm.RULE_SETS["fsdp"])
    pure = nnx.to_pure_dict(shardings)
    model, opt = pure["model"], pure["optimizer"]
    assert model["mlp_in"]["kernel"].spec == P("data", "model")
    assert model["token_embed"]["embedding"].spec == P("model", "data")
    assert model["attn_norm"]["scale"].spec == P(None)
    assert opt["opt_state"][0]["mu"]["mlp_in"]["kernel"].spec == P("data", "model")
    assert opt["opt_state"][0]["count"].spec == P() and opt["step"].spec == P()
    assert all(s.mesh == mesh for s in jax.tree.leaves(shardings))


@pytest.mark.smoke
def test_the_step_donates_the_state_and_host_copies_leave_it_donatable():
    """compile_step donates `state`: after a call every array of the state it was given is deleted (XLA wrote the new
    state into its buffers), and the host copy taken before still holds the old values. Catches a jit without
    donate_argnames, and a to_host that returns np.asarray's view of a CPU buffer: the view keeps that buffer alive,
    so XLA silently does not donate it."""
    args = sm.Args()
    graphdef, abstract = sm.abstract_state(args)
    mesh, rules = sm.make_mesh((1, 1), jax.devices()[:1]), sm.RULE_SETS["dp"]
    shardings = sm.state_shardings(abstract, mesh, rules)
    state = sm.init_sharded(args, shardings)
    before = sm.to_host(state)
    step = sm.compile_step(graphdef, shardings)
    new, _, _ = step(state, sm.place_batch(sm.make_batches(sm.Args(steps=2))[0], mesh, rules))
    assert all(x.is_deleted() for x in jax.tree.leaves(state))
    assert not any(x.is_deleted() for x in jax.tree.leaves(new))
    assert sm.max_abs_diff(before, sm.to_host(sm.init_sharded(args, shardings))) == 0  # the copy kept its values
    kept = sm.compile_step(graphdef, shardings, donate=False)  # --no-donate: the step leaves its input alone
    newer, _, _ = kept(new, sm.place_batch(sm.make_batches(sm.Args(steps=2))[1], mesh, rules))
    assert not any(x.is_deleted() for x in jax.tree.leaves(new))


@pytest.mark.unit
def test_the_step_config_is_frozen():
    import dataclasses

    assert dataclasses.is_dataclass(sm.StepConfig) and sm.StepConfig.__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        sm.StepConfig(grad_shardings=None).activation_rules = ()


# ---------------------------------------------------------------- unit: mesh and input errors


@pytest.mark.unit
def test_default_mesh_fits_the_device_count():
    args = sm.Args()
    assert [sm.mesh_shape(args, n) for n in (1, 2, 4, 6, 8)] == [(1, 1), (1, 2), (2, 2), (3, 2), (4, 2)]
    assert sm.mesh_shape(sm.Args(mesh="8x1"), 8) == (8, 1)
    with pytest.raises(sm.RunError, match="needs 16 devices"):
        sm.mesh_shape(sm.Args(mesh="4x4"), 8)
    with pytest.raises(sm.RunError, match="^--mesh must look like DATAxMODEL"):
        sm.parse_mesh("4by2")


@pytest.mark.unit
@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(steps=1), "--steps must be >= 2"),
        (dict(host_devices=-2), "--host-devices must be >= -1"),
        (dict(num_processes=-1), "--num-processes must be >= 0"),
        (dict(batch_size=0), "--batch-size must be >= 1"),
        (dict(tolerance=0.0), "--tolerance must be > 0"),
        (dict(learning_rate=-1e-3), "--learning-rate must be > 0"),
        (dict(mesh="0x2"), "--mesh must look like DATAxMODEL"),
        (dict(num_processes=2, process_id=2), "--process-id 2 is not a rank of --num-processes 2"),
    ],
)
def test_bad_flags_raise_run_error(bad, message, tmp_path):
    with pytest.raises(sm.RunError, match="^" + re.escape(message)) as e:
        sm.validate(sm.Args(**bad, out=str(tmp_path)))
    assert not str(e.value).startswith("error:")  # one_line adds the prefix, once


@pytest.mark.unit
def test_a_flag_outside_its_choices_is_one_line(capsys):
    with pytest.raises(SystemExit, match=r"^error: argument --rules: invalid choice: 'zero3' .*\(see --help\)$"):
        sm.parse_args(["--rules", "zero3"])
    assert sm.parse_args(["--rules", "fsdp", "--no-donate"]) == sm.Args(rules="fsdp", donate=False)


@pytest.mark.unit
def test_a_failed_self_check_is_its_own_error_naming_what_failed():
    """Not bad input: SelfCheckError (a RunError, so one line and exit status 1) says which rule set failed, how."""
    from types import SimpleNamespace as Result

    good = Result(passed=True, bytes_match_analytic=True, max_abs_diff_vs_single_device=1e-7)
    sm.self_check(sm.Args(), {"dp": good, "fsdp": good})
    off = Result(passed=False, bytes_match_analytic=True, max_abs_diff_vs_single_device=2.5e-3)
    bytes_off = Result(passed=True, bytes_match_analytic=False, max_abs_diff_vs_single_device=1e-7)
    with pytest.raises(sm.SelfCheckError) as e:
        sm.self_check(sm.Args(tolerance=1e-4), {"dp": good, "tp": off, "fsdp": bytes_off})
    assert issubclass(sm.SelfCheckError, sm.RunError) and str(e.value) == (
        "self-check failed: rule set tp's last step differs from the single-device one by 2.50e-03 "
        "(more than --tolerance 0.0001); rule set fsdp's bytes per device differ from the analytic count"
    )


@pytest.mark.unit
def test_good_flags_pass_validate(tmp_path):
    # the edges of each bound are allowed: validate must not refuse a run that the flags' help promises
    edges = dict(steps=2, host_devices=-1, num_processes=2, process_id=1, batch_size=1, mesh="1x1", rules="all")
    sm.validate(sm.Args(**edges, out=str(tmp_path)))
    sm.validate(sm.Args(num_processes=0, process_id=5, out=str(tmp_path)))  # auto-detected count: no relation


@pytest.mark.unit
def test_a_dimension_that_does_not_split_is_an_input_error():
    mesh = sm.make_mesh((1, 1), jax.devices()[:1])
    sm.check_splits(sm.Args(batch_size=3, vocab=7), list(sm.RULE_SETS), mesh)  # a 1x1 mesh splits nothing

    class Mesh3x2:  # check_splits only reads the mesh's axis sizes
        shape = {"data": 3, "model": 2}

    with pytest.raises(sm.RunError, match="--batch-size 32 does not split into 3 equal parts, as rule set 'dp'"):
        sm.check_splits(sm.Args(), ["dp"], Mesh3x2())
    with pytest.raises(sm.RunError, match="--vocab 63 does not split into 2 equal parts, as rule set 'tp'"):
        sm.check_splits(sm.Args(vocab=63), ["tp"], Mesh3x2())


@pytest.mark.unit
def test_host_devices_too_late_is_a_clean_error(tmp_path, capsys):
    import jax

    jax.devices()  # this process's JAX has started with its 1 CPU device: jax_num_cpu_devices can no longer change
    with pytest.raises(SystemExit) as e:
        sm.main(sm.Args(host_devices=3, out=str(tmp_path)))
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --host-devices 3 came too late") and err.endswith("; nothing written\n")
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


# ---------------------------------------------------------------- smoke: the CLI on faked devices


def _param_values():
    """Parameter count per weight of the default TinyLM, computed here from its shapes."""
    V, E, H, K, F, L = 64, 64, 8, 8, 256, 16
    return {
        "token_embed": V * E,
        "pos_embed": L * E,
        "norms": 3 * E,
        "qkv": 3 * E * H * K,
        "attn_out": H * K * E,
        "mlp": 2 * E * F,
        "unembed": E * V,
    }


@pytest.mark.integration
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_cli_8_devices_every_rule_set(tmp_path, axis_types):
    flags = ("--host-devices", "8", "--steps", "3", "--axis-types", axis_types)
    res = run_script(SCRIPT, *flags, "--out", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    m = json.loads((tmp_path / "latest" / "metrics.json").read_text())
    assert m["axis_types"] == axis_types
    for rule_set in sm.RULE_SETS:  # the batch is split 4 ways along 'data', except under tp
        _assert_compiled_memory(m, rule_set, batch_rows=32 if rule_set == "tp" else 32 // 4)
    assert m["devices"] == 8 and m["mesh"] == {"data": 4, "model": 2} and m["rules"] == ["dp", "tp", "dp_tp", "fsdp"]
    assert m["check_passed"] and m["max_abs_diff_vs_single_device"] <= 1e-5
    # partition specs of named weights, as the real arrays hold them
    for rule_set, expected in EXPECTED.items():
        weights = m["rule_sets"][rule_set]["weights"]
        for name, spec in expected.items():
            if name != "batch":
                assert tuple(weights[name]["spec"]) == spec, (rule_set, name)
    # measured bytes per device == analytic, and == the count done here by hand (float32, 4 bytes)
    v = _param_values()
    total = sum(v.values())
    split_model = total - v["pos_embed"] - v["norms"]  # every other weight has vocab/heads/mlp
    per_device_values = {
        "dp": total,
        "tp": split_model / 2 + v["pos_embed"] + v["norms"],
        "dp_tp": split_model / 2 + v["pos_embed"] + v["norms"],
        "fsdp": split_model / 8 + v["pos_embed"] / 4 + v["norms"],
    }
    for rule_set, values in per_device_values.items():
        r = m["rule_sets"][rule_set]
        params = int(values) * 4
        assert r["bytes_per_device"] == r["analytic_bytes_per_device"]
        assert r["bytes_per_device"]["params"] == params == r["bytes_per_device"]["grads"]
        assert r["bytes_per_device"]["adam"] == 2 * params + 8  # m and v, plus two 4-byte step counters
        assert m["bytes_per_device"][rule_set] == 4 * params + 8
    assert "CPU 0,2,4,6" in res.stdout  # visualize_array_sharding under tp
    assert (tmp_path / "latest" / "loss_curve.png").stat().st_size > 0


# Both axis modes of the fsdp run on 4 faked devices, one after the other in one fresh process (faked devices must be
# asked for before JAX starts): one start of Python and JAX, and one single-device reference for the two. The
# reference does not depend on --axis-types (train_single_device trains on a one-device mesh of its own, with Auto
# axes), so the second run reuses the first one's; only --axis-types and --out differ between the two runs. Each run
# is main() with the flags parsed as the command line parses them (parse_args); the command line itself is run by the
# other tests here. A line "=== axis_types X" on stdout starts each run's output.
FSDP_4_FLAGS = ("--host-devices", "4", "--rules", "fsdp", "--steps", "3", "--no-visualize", "--compile-cache", "")
FSDP_4_RUNS = """
import sys
from dataclasses import replace
sys.path.insert(0, sys.argv[1])
from course import load_script
sm = load_script(sys.argv[2])
train_single_device, references = sm.train_single_device, []

def one_reference(args, *rest):
    flags = replace(args, axis_types="", out="")
    if not references:
        references.append((flags, train_single_device(args, *rest)))
    assert references[0][0] == flags, "the runs differ in more than --axis-types and --out"
    return references[0][1]

sm.train_single_device = one_reference
for axis_types in ("auto", "explicit"):
    print("=== axis_types", axis_types, flush=True)
    flags = [*sys.argv[4:], "--axis-types", axis_types, "--out", sys.argv[3] + "/" + axis_types]
    sm.main(sm.parse_args(flags))
"""


@pytest.fixture(scope="module")
def fsdp_4_devices(tmp_path_factory):
    """The fsdp run on 4 faked devices (2x2 mesh) under --axis-types auto and explicit, in one process:
    (the finished process, each mode's stdout, the folder that holds one --out folder per mode)."""
    out = tmp_path_factory.mktemp("fsdp_4")
    res = subprocess.run(
        [sys.executable, "-c", FSDP_4_RUNS, str(REPO / "tools"), SCRIPT, str(out), *FSDP_4_FLAGS],
        cwd=out,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    parts = res.stdout.split("=== axis_types ")
    stdout = {part.split("\n", 1)[0]: part for part in parts[1:]}
    return res, stdout, out


@pytest.mark.smoke
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_cli_fsdp_compiles_without_full_rematerialization(fsdp_4_devices, axis_types):
    """4 faked devices, fsdp on a 2x2 mesh, in both axis modes: the check passes, mlp_in's block and bytes, the compiled
    step's memory, and no rematerialization warning."""
    # Under fsdp 'data' splits the batch and every embed dim. Were the token table and pos_embed not gathered off
    # 'data' before the lookup and the add (batch_layout), XLA would have to switch x between batch-on-'data' and
    # embed-on-'data', which it does by replicating the whole array, and it says so on stderr ("Involuntary full
    # rematerialization"; jax 0.12 prints it three times under Auto axes, once under Explicit, on a 2x2 mesh).
    # XLA says it while it compiles, so the compilation cache is off: a program loaded from disk would say nothing.
    # Both modes share one process and its stderr: a warning from either fails both.
    res, stdout, out = fsdp_4_devices
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(stdout) == ["auto", "explicit"], res.stdout[-2000:]
    assert "rematerialization" not in res.stderr.lower(), res.stderr[-2000:]
    stdout = stdout[axis_types]
    assert "check rules=fsdp" in stdout and "PASS" in stdout
    m = json.loads((out / axis_types / "latest" / "metrics.json").read_text())
    assert m["devices"] == 4 and m["mesh"] == {"data": 2, "model": 2} and m["rules"] == ["fsdp"]
    assert m["max_abs_diff_vs_single_device"] <= 1e-5
    w = m["rule_sets"]["fsdp"]["weights"]["mlp_in/kernel"]
    assert tuple(w["spec"]) == ("data", "model") and tuple(w["shard_shape"]) == (32, 128)
    assert w["bytes"] == w["analytic"] == 32 * 128 * 4 and w["uniform"]
    _assert_compiled_memory(m, "fsdp", batch_rows=32 // 2)
    assert m["axis_types"] == axis_types and f"axes={axis_types}" in stdout
    assert ("types before" in stdout) == (axis_types == "explicit")


def _assert_compiled_memory(m, rule_set, batch_rows):
    """XLA's memory_analysis of the compiled step, per device, against the state measured from the shards:
    its arguments are exactly the weights + Adam state + this device's rows of the (B, L+1) int32 batch; its
    outputs hold the new state and the gradients (plus the loss and a few small buffers), the new state in the
    donated buffers of the old (catches a jit without donate_argnames: aliased 0); temporaries exist."""
    compiled, state = m["rule_sets"][rule_set]["compiled"], m["rule_sets"][rule_set]["bytes_per_device"]
    assert all(isinstance(v, int) and v > 0 for v in compiled.values()), compiled
    assert compiled["arguments"] == state["params"] + state["adam"] + batch_rows * 17 * 4
    assert state["total"] <= compiled["outputs"] <= state["total"] + 1024
    # the step donates its state: the new weights and Adam state are written into the old ones' buffers
    assert compiled["aliased"] == state["params"] + state["adam"]
    assert compiled["temporaries"] > 0 and compiled["peak"] >= compiled["arguments"]


@pytest.mark.integration
def test_cli_explicit_axes_4_devices_fsdp(tmp_path):
    """--axis-types explicit: shardings are part of the types, the activations follow the rules, batch_layout
    reshards pos_embed and the token table off 'data', and the same single-device check passes."""
    flags = ("--host-devices", "4", "--rules", "fsdp", "--steps", "3", "--no-visualize")
    res = run_script(SCRIPT, *flags, "--axis-types", "explicit", "--out", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    m = json.loads((tmp_path / "latest" / "metrics.json").read_text())
    assert m["axis_types"] == "explicit" and m["mesh"] == {"data": 2, "model": 2}
    assert m["check_passed"] and m["max_abs_diff_vs_single_device"] <= 1e-5
    assert "axes=explicit" in res.stdout and "check rules=fsdp" in res.stdout and "PASS" in res.stdout
    before = next(line for line in res.stdout.splitlines() if "types before the first step" in line)
    after = next(line for line in res.stdout.splitlines() if "types after the last step" in line)
    assert "mlp_in kernel float32[64@data,256@model]" in before and "batch int32[32@data,17]" in before
    assert "mlp_in kernel float32[64@data,256@model]" in after and "its gradient float32[64@data,256@model]" in after
    assert "reshard: pos_embed float32[16,64@data] -> float32[16,64]" in res.stdout
    assert "reshard: token_embed float32[64@model,64@data] -> float32[64@model,64]" in res.stdout
    assert "give the same specs for the whole state: True" in res.stdout
    _assert_compiled_memory(m, "fsdp", batch_rows=32 // 2)


@pytest.mark.smoke
@pytest.mark.parametrize(
    "flags, message",
    [
        (("--host-devices", "4", "--mesh", "4x2"), "needs 8 devices but there are 4"),
        (("--host-devices", "6", "--mesh", "3x2"), "does not split into 3 equal parts"),
    ],
)
def test_cli_mesh_that_does_not_fit(tmp_path, flags, message):
    res = run_script(SCRIPT, *flags, "--out", str(tmp_path), cwd=tmp_path)
    assert res.returncode != 0
    assert message in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_cli_default_fakes_8_devices_and_a_perturbed_state_fails_the_check(tmp_path):
    # No --host-devices on a CPU-only host: 8 faked devices, said in the first line. --perturb adds 0.001 to one
    # sharded weight before the equivalence check, which must then FAIL with a one-line error.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / SCRIPT),
            "--rules",
            "fsdp",
            "--steps",
            "3",
            "--no-visualize",
            "--perturb",
            "0.001",
            "--out",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    first = res.stdout.splitlines()[0]
    assert "fakes 8 CPU devices (jax_num_cpu_devices=8)" in first, res.stdout[:500]
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "check rules=fsdp" in res.stdout and "FAIL" in res.stdout and "PASS" not in res.stdout
    line = "error: self-check failed: rule set fsdp's last step differs from the single-device one by "
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith(line), res.stderr
    assert res.returncode == 1 and "(more than --tolerance 1e-05) once the run was complete; " in res.stderr
    m = json.loads((tmp_path / "latest" / "metrics.json").read_text())  # the results are saved before the error
    assert m["devices"] == 8 and m["check_passed"] is False and m["max_abs_diff_vs_single_device"] > 1e-4


@pytest.mark.integration
def test_cli_one_device_says_nothing_is_sharded(tmp_path):
    res = run_script(
        SCRIPT,
        "--host-devices",
        "1",
        "--rules",
        "dp",
        "--steps",
        "3",
        "--no-visualize",
        "--out",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "n/a (nothing is sharded" in res.stdout and "PASS" not in res.stdout
    assert json.loads((tmp_path / "latest" / "metrics.json").read_text())["check_passed"] is None


@pytest.mark.integration
def test_cli_two_processes_with_distributed(tmp_path):
    """--distributed for real: two processes on this machine, 2 CPU devices each, one 2x2 mesh over both."""
    from conftest import launch_processes

    flags = ["--host-devices", "2", "--rules", "fsdp", "--steps", "2", "--no-visualize"]
    procs = launch_processes(SCRIPT, flags, tmp_path, lambda i: tmp_path / f"p{i}")
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1500:] for _, err in outs]
    m = json.loads((tmp_path / "p0" / "latest" / "metrics.json").read_text())
    assert m["processes"] == 2 and m["devices"] == 4 and m["mesh"] == {"data": 2, "model": 2}
    assert m["check_passed"] and m["max_abs_diff_vs_single_device"] <= 1e-5
    assert m["rule_sets"]["fsdp"]["bytes_match_analytic"]
    assert not (tmp_path / "p1").exists()  # only process 0 writes
    assert all(err == "" for _, err in outs), [err[-1500:] for _, err in outs]  # both processes ended cleanly


# ---------------------------------------------------------------- learning: a short real run


@pytest.mark.learning
def test_training_lowers_the_loss(tmp_path):
    # host_devices=0: the devices this test process already has (one CPU), so nothing is sharded and the
    # equivalence check must say n/a rather than PASS; the sharded checks run in the subprocess tests above.
    m = sm.main(sm.Args(rules="dp", steps=40, visualize=False, host_devices=0, out=str(tmp_path)))
    losses = m["single_device_losses"]
    assert losses[0] > 3.5  # ≈ ln(64) = 4.16 at the start
    assert m["rule_sets"]["dp"]["losses"][-1] < 0.25 * losses[0]
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    saved = json.loads((tmp_path / "latest" / "metrics.json").read_text())
    assert saved["devices"] == len(jax.devices())
    if saved["devices"] == 1:
        assert saved["check_passed"] is None


# ---------------------------------------------------------------- the tool behind the README's bytes table


def _fake_metrics(devices, mesh, totals, diff):
    """The parts of a metrics.json that tools/mesh_bytes.py reads."""
    rule_sets = {
        name: dict(
            bytes_per_device=dict(params=t // 4, grads=t // 4, adam=t // 2, total=t),
            max_abs_diff_vs_single_device=diff,
            fresh_adam_step1_max_abs_diff=10 * diff,
        )
        for name, t in totals.items()
    }
    return dict(
        devices=devices,
        mesh=dict(zip(("data", "model"), mesh)),
        rules=list(totals),
        tolerance=1e-5,
        check_passed=None if devices == 1 else True,
        bytes_per_device=totals,
        rule_sets=rule_sets,
    )


@pytest.mark.unit
def test_mesh_bytes_tables_read_every_run():
    tool = load_script("tools/mesh_bytes.py")
    runs = [
        _fake_metrics(1, (1, 1), {"dp": 800, "fsdp": 800}, 0.0),
        _fake_metrics(8, (4, 2), {"dp": 800, "fsdp": 200}, 3e-8),
    ]
    lines = tool.tables(runs).splitlines()
    assert lines[0].startswith("total bytes per device")
    assert "1 (1x1)" in lines[1] and "8 (4x2)" in lines[1] and lines[1].endswith("vs dp")
    assert lines[3].split() == ["fsdp", "800", "200", "0.25"]  # the total on each mesh, vs dp on the largest
    assert lines[-2].split() == ["fsdp", "n/a", "[0.00e+00]", "3.00e-08", "[3.00e-07]"]  # n/a on one device
    assert "1: n/a, 8: True" in lines[-1]


@pytest.mark.unit
def test_mesh_answers_changes_match_the_script_and_the_fallback_moves_only_pos_embed(capsys):
    """tools/mesh_answers.py measures the exercises' answers on changed copies of the script: each change it makes
    (and the README shows as a diff) must match the script exactly once, or the answers went stale. Exercise 1's
    answer: the fallback ('embed', 'model') in tp changes pos_embed's spec only."""
    tool = load_script("tools/mesh_answers.py")
    source = (REPO / SCRIPT).read_text()
    for change, (piece, replacement) in tool.CHANGES.items():
        assert source.count(piece) == 1, change
        assert tool.changed_source(change) == source.replace(piece, replacement)
    assert set(tool.CATCHING_TEST) <= set(tool.CHANGES)
    tool.fallback()
    out = capsys.readouterr().out
    assert "weights whose spec changes: pos_embed\n" in out
    assert "pos_embed               ('length', 'embed')         P(None, None)           P(None, 'model')" in out
