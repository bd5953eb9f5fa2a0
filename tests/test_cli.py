"""Every script, run as a user runs it: --help works, and a malformed flag or an output folder that cannot be
written is one line on stderr, not a usage dump or a traceback, before any work."""

from __future__ import annotations

import pytest
from conftest import REPO, load_script, run_script

pytestmark = pytest.mark.smoke

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))


def test_there_are_five_scripts():
    assert len(SCRIPTS) == 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_flags(script, capsys):
    """--help through the parser a user's command goes through, in this process: it prints every flag and exits
    with status 0 (the subprocess run of an unwritable --out below shows the exit path from the command line)."""
    with pytest.raises(SystemExit) as exit_:
        load_script(script).parse_args(["--help"])
    assert exit_.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    assert "--seed" in shown and "--out" in shown
    assert "must be >= 0 (default: 0)" in shown  # --seed's bound (flag(min=0)) and default


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "argv, names",
    [(["--seed", "abc"], "--seed"), (["--no-such-flag"], "--no-such-flag"), (["--seed", "-1"], "--seed must be >= 0")],
    ids=["bad-value", "unknown-flag", "out-of-bounds"],
)
def test_malformed_flag_is_one_line(script, argv, names, tmp_path):
    """The parser a user's command goes through, run in this process (the subprocess runs of --help and of an
    unwritable --out below show the same exit path from the command line). A malformed, unknown or out-of-bounds
    flag ends the parse with one line: sys.exit(message) prints it to stderr and exits with status 1. Caught: an
    argparse usage dump (several lines), a bound that only main() checks (no exit here), a traceback."""
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.parse_args([*argv, "--out", str(tmp_path / "out")])
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    assert names in message
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize("script", SCRIPTS)
def test_unwritable_out_is_one_line_before_any_work(script, tmp_path):
    """From the command line, as a user types it: --out under /proc cannot be created. One line on stderr, a
    non-zero exit, no traceback and no progress line."""
    r = run_script(script, "--out", "/proc/nope", cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out"), r.stderr
    assert r.stdout.strip() == ""  # refused before the first progress line


@pytest.mark.parametrize("script", SCRIPTS)
def test_out_under_a_file_is_one_line_before_any_work(script, tmp_path, capsys):
    """main() itself, in this process: an --out below a file is refused by the write probe before any work."""
    (tmp_path / "file").write_text("a file, not a folder")
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.main(module.parse_args(["--out", str(tmp_path / "file" / "run")]))
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith("error: --out") and "\n" not in message, message
    assert capsys.readouterr().out.strip() == ""  # refused before the first progress line


def _warn_from(module_name: str) -> None:
    """Raise a DeprecationWarning whose origin is a module called `module_name` (as for a loaded course script)."""
    namespace = {"__name__": module_name}
    exec(compile("import warnings\nwarnings.warn('old API', DeprecationWarning)\n", module_name, "exec"), namespace)


def test_deprecations_from_course_code_fail_the_tests():
    # pytest.ini: error::DeprecationWarning:course_.* — the scripts load as course_<name> (conftest.load_script).
    with pytest.raises(DeprecationWarning, match="old API"):
        _warn_from("course_cart_pole_dqn")
    with pytest.warns(DeprecationWarning):  # from a library it is reported, not fatal
        _warn_from("some_library")


SHARED_BLOCK = (
    "flag",
    "InputError",
    "reports_input_errors",
    "OneLineParser",
    "parse_args",
    "bounds_text",
    "check_flags",
)
PRESET_LINES = (
    "    first, _ = p.parse_known_args(argv)\n",
    '    if first.preset == "untuned":  # a preset changes the defaults; explicit flags are parsed on top\n',
    "        p.set_defaults(**UNTUNED_PRESET)\n",
    '    if first.algo.startswith("reinforce"):  # G_t needs whole episodes: the reinforce rungs\' own rollout size\n',
    "        p.set_defaults(**WHOLE_EPISODES)\n",
)


def _definitions(script: str, names: tuple[str, ...]) -> dict[str, str]:
    """The source text of each top-level definition of `names` in `script`."""
    import ast

    source = (REPO / script).read_text()
    lines = source.splitlines(keepends=True)
    return {
        node.name: "".join(lines[node.lineno - 1 : node.end_lineno])
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names
    }


def _shared_block(script: str) -> dict[str, str]:
    """The source text of each shared CLI definition in `script` (3_Pendulum's --preset lines left out)."""
    found = _definitions(script, SHARED_BLOCK)
    if script.startswith("3_Pendulum") and "parse_args" in found:
        for line in PRESET_LINES:
            assert line in found["parse_args"], f"{script}: parse_args lost its preset line {line!r}"
            found["parse_args"] = found["parse_args"].replace(line, "")
    return found


def test_the_shared_cli_block_is_identical_in_every_script():
    blocks = {script: _shared_block(script) for script in SCRIPTS}
    reference = blocks[SCRIPTS[0]]
    assert sorted(reference) == sorted(SHARED_BLOCK), reference.keys()
    for script, block in blocks.items():
        for name in SHARED_BLOCK:
            assert block.get(name) == reference[name], f"{script}: {name} differs from {SCRIPTS[0]}'s"


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_reports_input_errors_and_nothing_else_exits(script):
    """One error style: helpers raise InputError; only the shared block calls sys.exit; main is decorated."""
    import ast

    tree = ast.parse((REPO / script).read_text())
    exits = [
        f"{node.name}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and ast.unparse(sub.func) == "sys.exit"
    ]
    assert set(exits) <= {"reports_input_errors", "run", "OneLineParser", "error"}, (script, exits)
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"][0]
    assert [ast.unparse(d) for d in main.decorator_list] == ["reports_input_errors"], script


CHECKPOINT_CODE = ("save_checkpoint", "load_checkpoint", "checkpoint_key")


def test_one_checkpoint_format_and_code_in_dqn_ppo_and_grpo():
    """DQN, PPO and GRPO save and load the same way (one flat .npz of nnx.Param arrays, no pickle): the code is
    the same text in all three; each passes its own hint naming the flags that change the arrays."""
    scripts = [s for s in SCRIPTS if s[0] in "234"]
    blocks = {script: _definitions(script, CHECKPOINT_CODE) for script in scripts}
    for script, block in blocks.items():
        assert sorted(block) == sorted(CHECKPOINT_CODE), (script, sorted(block))
        assert block == blocks[scripts[0]], f"{script}: the checkpoint code differs from {scripts[0]}'s"
        assert load_script(script).LOAD_HINT.endswith("?")


def test_one_over_seeds_in_dqn_and_ppo():
    """The two compiled RL runs put their seeds on the devices the same way: over_seeds is the same text in both."""
    scripts = [s for s in SCRIPTS if s[0] in "23"]
    blocks = {script: _definitions(script, ("over_seeds",)) for script in scripts}
    assert all(block and block == blocks[scripts[0]] for block in blocks.values()), blocks


def test_one_compile_cache_helper_and_flag_in_every_jax_script():
    """Every script that compiles keeps its programs with the same use_compile_cache and the same --compile-cache."""
    from dataclasses import fields

    scripts = [s for s in SCRIPTS if not s.startswith("1_")]
    helpers = {script: _definitions(script, ("use_compile_cache",)) for script in scripts}
    assert all(h == helpers[scripts[0]] and h for h in helpers.values()), helpers
    flags = {s: {f.name: f for f in fields(load_script(s).Args)}["compile_cache"] for s in scripts}
    assert len({(f.default, f.metadata["help"]) for f in flags.values()}) == 1
