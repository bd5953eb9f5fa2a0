"""Every script, run as a user runs it: --help works, and a malformed flag or an output folder that cannot be
written is one line on stderr, not a usage dump or a traceback, before any work."""

from __future__ import annotations

import ast
from dataclasses import fields

import pytest
from conftest import REPO, load_script, run_script

pytestmark = pytest.mark.smoke

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))


def test_there_are_five_scripts():
    assert len(SCRIPTS) == 5, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_flags(script, capsys):
    """--help through the parser a user's command goes through, in this process: it prints every flag of Args with
    its default and exits with status 0."""
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(["--help"])
    assert exit_.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    assert "--seed" in shown and "--out" in shown and "(default: 0)" in shown
    missing = [f.name for f in fields(module.Args) if "--" + f.name.replace("_", "-") not in shown]
    assert not missing, missing


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    "argv, names",
    [(["--seed", "abc"], "--seed"), (["--no-such-flag"], "--no-such-flag")],
    ids=["bad-value", "unknown-flag"],
)
def test_malformed_flag_is_one_line(script, argv, names, tmp_path):
    """The parser a user's command goes through, run in this process. A malformed or unknown flag ends the parse with
    one line: sys.exit(message) prints it to stderr and exits with status 1. Caught: an argparse usage dump (several
    lines), a traceback."""
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.parse_args([*argv, "--out", str(tmp_path / "out")])
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    assert names in message
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_flag_out_of_its_bounds_is_one_line_before_any_work(script, tmp_path, capsys):
    """main() checks every flag against the bounds its flag() declares before any work: one line on stderr, exit
    status 1, no output folder. Caught: a bound nobody checks (the run starts), a traceback."""
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.main(module.parse_args(["--seed", "-1", "--out", str(tmp_path / "out")]))
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.err == "error: --seed must be >= 0, got -1; nothing written\n" and captured.out == ""
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script", ["1_Q_Learning/Q_Learning.py", "4_GRPO_MNIST/grpo_mnist.py"])
def test_unwritable_out_is_one_line_before_any_work(script, tmp_path):
    """From the command line, as a user types it: --out under /proc cannot be created. One line on stderr, exit
    status 1, no traceback and no progress line. (The same check runs in this process for every script below; the
    command line's path through the shared block is the same text in all five: NumPy only, and the largest script.)"""
    r = run_script(script, "--out", "/proc/nope", cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out '/proc/nope' is not a writable folder"), r.stderr
    assert r.stdout.strip() == ""  # refused before the first progress line


@pytest.mark.parametrize("script", SCRIPTS)
def test_out_under_a_file_is_one_line_before_any_work(script, tmp_path, capsys):
    """main() itself, in this process: an --out below a file cannot be created; refused before any work."""
    (tmp_path / "file").write_text("a file, not a folder")
    module = load_script(script)
    with pytest.raises(SystemExit) as exit_:
        module.main(module.parse_args(["--out", str(tmp_path / "file" / "run")]))
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --out") and captured.err.count("\n") == 1, captured.err
    assert captured.out.strip() == ""  # refused before the first progress line


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


# The block every script shares, in three parts: the two lines that hold a stop back while the libraries load (in
# the imports), flag() (above Args), and the run folder, the one-line stops and the parser (first below the banner).
HOLD = (
    'if __name__ == "__main__":  # Ctrl-C or SIGTERM while the libraries below load waits for main(), '
    "which reports it\n"
    "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
)
SHARED_BELOW = ("RunError", "Run", "stop", "one_line", "parse_args", "check_flags")


def _definitions(script: str, names: tuple[str, ...]) -> dict[str, str]:
    """The source text of each top-level definition of `names` in `script`."""
    source = (REPO / script).read_text()
    lines = source.splitlines(keepends=True)
    return {
        node.name: "".join(lines[node.lineno - 1 : node.end_lineno])
        for node in ast.parse(source).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names
    }


# 3_Pendulum's --preset: a preset changes the defaults, and flags given explicitly are parsed on top of it (so
# `--preset untuned --bootstrap-truncated` wins over the preset even where the flag equals the plain default).
PRESET_LINES = (
    "    first, _ = p.parse_known_args(argv)\n",
    '    if first.preset == "untuned":  # a preset changes the defaults; explicit flags are parsed on top\n',
    "        p.set_defaults(**UNTUNED_PRESET)\n",
    '    if first.algo.startswith("reinforce"):  # G_t needs whole episodes: the reinforce rungs\' own rollout size\n',
    "        p.set_defaults(**WHOLE_EPISODES)\n",
)


def _shared(script: str) -> dict[str, str]:
    """The shared definitions of `script`, with 3_Pendulum's --preset lines taken out of its parse_args."""
    found = _definitions(script, ("flag", *SHARED_BELOW))
    if script.startswith("3_Pendulum") and "parse_args" in found:
        for line in PRESET_LINES:
            assert line in found["parse_args"], f"{script}: parse_args lost its preset line {line!r}"
            found["parse_args"] = found["parse_args"].replace(line, "")
    return found


def test_the_shared_block_is_identical_in_every_script():
    """flag() and the plumbing's shared definitions are the same text in all five scripts (3_Pendulum's parse_args
    adds its --preset lines), and every script holds a stop back with the same two lines, before its first
    third-party import."""
    blocks = {script: _shared(script) for script in SCRIPTS}
    reference = blocks[SCRIPTS[0]]
    assert sorted(reference) == sorted(("flag", *SHARED_BELOW)), reference.keys()
    for script, block in blocks.items():
        assert block == reference, f"{script}: {[n for n in reference if block.get(n) != reference[n]]} differ"
        source = (REPO / script).read_text()
        assert HOLD in source, f"{script}: no hold while the libraries load"
        first_library = min(source.index(f"\nimport {m}") for m in ("numpy", "jax") if f"\nimport {m}" in source)
        assert source.index(HOLD) < first_library, script


def shared_lines(scripts: dict[str, list[str]], first: str, run: int = 6) -> int:
    """The non-blank lines of `first` that lie inside runs of `run` or more identical consecutive non-blank lines
    found in every other script: the block the scripts repeat."""
    lines = [line for line in scripts[first] if line.strip()]
    others = [{tuple(o[i : i + run]) for i in range(len(o) - run + 1)} for name, o in scripts.items() if name != first]
    shared = [False] * len(lines)
    for i in range(len(lines) - run + 1):
        if all(tuple(lines[i : i + run]) in other for other in others):
            shared[i : i + run] = [True] * run
    return sum(shared)


def test_the_shared_block_is_at_most_80_lines():
    """Counted as Q_Learning.py's lines inside runs of six or more identical lines found in all four other scripts.
    Catches a shared block that grows back into machinery."""
    scripts = {s: [line for line in (REPO / s).read_text().splitlines() if line.strip()] for s in SCRIPTS}
    count = shared_lines(scripts, SCRIPTS[0])
    assert 60 <= count <= 80, count  # at least the block itself: the count is not vacuous


@pytest.mark.unit
def test_shared_lines_counts_runs_of_six_found_in_every_other_script():
    """The counter itself: a run of six shared by all counts, a run of five or one missing from a script does not."""
    six = [f"line {i}" for i in range(6)]
    scripts = {"a": ["x", *six, "y"], "b": [*six], "c": ["z", *six]}
    assert shared_lines(scripts, "a") == 6
    assert shared_lines({**scripts, "c": six[:5]}, "a") == 0
    assert shared_lines({"a": six[:5], "b": six[:5]}, "a") == 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_reports_stops_and_errors_and_nothing_else_exits(script):
    """One error style: code raises RunError; only the shared block calls sys.exit or os._exit (and GRPO's watch
    thread, through `end`); main is wrapped by
    one_line and the command line calls main() with no arguments."""
    source = (REPO / script).read_text()
    tree = ast.parse(source)
    exits = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and ast.unparse(sub.func) in ("sys.exit", "os._exit")
    }
    # and GRPO's `end`: in a --distributed run its watch thread ends the process while the main thread may be stuck in
    # a collective whose peer has died, where no exception can reach it
    assert exits <= {"one_line", "run", "parse_args", *(["end"] if script.startswith("4_") else [])}, (script, exits)
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"][0]
    assert [ast.unparse(d) for d in main.decorator_list] == ["one_line"], script
    last = tree.body[-1]  # if __name__ == "__main__": ... main()
    assert ast.unparse(last.test) == "__name__ == '__main__'" and ast.unparse(last.body[-1]) == "main()", script


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
