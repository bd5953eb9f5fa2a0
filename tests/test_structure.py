"""Each script reads as the lesson first: docstring, imports, Args, then the algorithm in the order it runs; one
banner line starting with `# Plumbing`; below it the command line, checks, checkpoints, plots and main."""

from __future__ import annotations

import ast

import pytest
from conftest import REPO

pytestmark = pytest.mark.unit

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))
# Plumbing: whichever of these a script defines must sit below the banner.
PLUMBING = {
    "RunError",
    "Run",
    "stop",
    "one_line",
    "parse_args",
    "check_flags",
    "validate",
    "save_checkpoint",
    "load_checkpoint",
    "save_params",
    "load_params",
    "save_policy",
    "load_policy",
    "plot_curve",
    "save_metrics",
    "use_compile_cache",
    "main",
}


def banner_line(source: str) -> int:
    lines = [i for i, line in enumerate(source.splitlines(), 1) if line.startswith("# Plumbing")]
    assert len(lines) == 1, f"want exactly one '# Plumbing' banner line, found {len(lines)}"
    return lines[0]


def top_level(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def is_module(node: ast.AST) -> bool:
    return isinstance(node, ast.ClassDef) and any(ast.unparse(b) in ("nnx.Module", "Module") for b in node.bases)


@pytest.mark.parametrize("script", SCRIPTS)
def test_lesson_above_the_banner_plumbing_below(script):
    source = (REPO / script).read_text()
    banner = banner_line(source)
    tree = ast.parse(source)
    assert ast.get_docstring(tree), f"{script}: no module docstring"
    defs = top_level(tree)
    above = {name for name, n in defs.items() if n.lineno < banner}
    below = {name for name, n in defs.items() if n.lineno > banner}
    assert "Args" in above and "flag" in above, f"{script}: Args (and flag, which builds it) belong to the lesson"
    modules = {name for name, n in defs.items() if is_module(n)}
    losses = {name for name in defs if "loss" in name and isinstance(defs[name], ast.FunctionDef)}
    assert modules <= above, f"{script}: nnx.Modules below the banner: {sorted(modules - above)}"
    assert losses <= above, f"{script}: losses below the banner: {sorted(losses - above)}"
    assert {"main", "parse_args", "check_flags"} <= below, f"{script}: main / parse_args / check_flags above the banner"
    misplaced = (PLUMBING & set(defs)) - below
    assert not misplaced, f"{script}: plumbing above the banner: {sorted(misplaced)}"


def defined_lines(tree: ast.Module) -> dict[str, int]:
    """Every top-level name and the line that defines it: functions, classes, module-level assignments."""
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            lines.setdefault(node.name, node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in (n for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
                lines.setdefault(name.id, node.lineno)
    return lines


def used_before_defined(source: str) -> dict[str, int]:
    """Names used above the banner (in code or annotations) that are defined only below it: {name: first use}."""
    banner, tree = banner_line(source), ast.parse(source)
    below = {name for name, line in defined_lines(tree).items() if line > banner}
    early: dict[str, int] = {}
    for node in (n for n in tree.body if n.lineno < banner):
        for name in (n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in below):
            early.setdefault(name.id, name.lineno)
    return early


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_lesson_reads_top_to_bottom(script):
    """A learner reading down to the banner meets no name that only the plumbing below defines. The lesson may
    grow; it must read in order."""
    early = used_before_defined((REPO / script).read_text())
    assert not early, f"{script}: used above the banner, defined below it: {early}"


def test_a_lesson_name_defined_below_the_banner_fails():
    """Catches: a lesson function calling a helper that sits in the plumbing, also through an annotation."""
    lesson = "def train(data: Data):\n    return helper(data)\n\n\n# Plumbing\n"
    assert set(used_before_defined(lesson + "class Data: ...\n\n\ndef helper(d): ...\n")) == {"Data", "helper"}
    assert used_before_defined("class Data: ...\n\n\ndef helper(d): ...\n\n\n" + lesson) == {}


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_lesson_has_modules_and_losses(script):
    """The check above must not pass vacuously: each deep-RL script has a network and a loss above the banner."""
    if script.startswith("1_"):
        pytest.skip("the Q-table has no network and no loss function")
    source = (REPO / script).read_text()
    banner = banner_line(source)
    defs = top_level(ast.parse(source))
    assert any(is_module(n) and n.lineno < banner for n in defs.values()), script
    assert any("loss" in name and n.lineno < banner for name, n in defs.items()), script


# Size is a feature: each script's budget in lines (`wc -l`), the whole file and each side of the banner. The part
# above the banner is the lesson; below it, the plumbing.
BUDGETS = {  # script: (whole file, above the banner, below it)
    "1_Q_Learning/Q_Learning.py": (600, 444, 400),
    "2_Cart_Pole_DQN/cart_pole_dqn.py": (1100, 704, 400),
    "3_Pendulum/pendulum.py": (1100, 780, 400),
    # GRPO runs across processes (--distributed): above the banner, `feed` and the padded evaluation prompts (≈30
    # lines); below it, joining, `watch` and `leave`, so that a process that stops or dies ends the others in one line
    "4_GRPO_MNIST/grpo_mnist.py": (1190, 700, 490),
    "5_Sharding_Mesh/sharding_mesh.py": (1100, 728, 400),
}


def sizes(source: str) -> tuple[int, int, int]:
    """(lines, lines up to and with the banner, lines after it), as `wc -l` and `head -n BANNER` count them."""
    total, banner = source.count("\n"), banner_line(source)
    return total, banner, total - banner


def over(have: tuple[int, ...], most: tuple[int, ...]) -> list[str]:
    return [f"{part} {n} > {m}" for part, n, m in zip(("lines", "above", "below"), have, most) if n > m]


def test_every_script_has_a_budget():
    assert sorted(BUDGETS) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_keeps_its_line_budget(script):
    """Catches: a script that grew past its budget, in all or on either side of the banner."""
    too_long = over(sizes((REPO / script).read_text()), BUDGETS[script])
    assert not too_long, f"{script}: {', '.join(too_long)}"


def test_sizes_counts_as_wc_does():
    """The counter is not vacuous: a file of 3 lines with the banner on line 2 is (3, 2, 1)."""
    assert sizes("a\n# Plumbing\nb\n") == (3, 2, 1)
    assert over((601, 400, 201), BUDGETS["1_Q_Learning/Q_Learning.py"]) == ["lines 601 > 600"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_is_at_most_40_lines(script):
    """main() only wires the run together (check, load, train, save); the steps live in the functions it calls.
    Catches a main() that grew back into the lesson or the plumbing it calls."""
    (main,) = [n for n in ast.parse((REPO / script).read_text()).body if getattr(n, "name", "") == "main"]
    lines = main.end_lineno - main.lineno + 1 + len(main.decorator_list)
    assert lines <= 40, f"{script}: main() is {lines} lines"
