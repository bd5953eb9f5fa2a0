"""Each script reads as the lesson first: docstring, imports, Args, then the algorithm in the order it runs; one
banner line starting with `# Plumbing`; below it the command line, checks, checkpoints, plots and main."""

from __future__ import annotations

import ast

import pytest
from conftest import REPO

pytestmark = pytest.mark.unit

SCRIPTS = sorted(str(p.relative_to(REPO)) for p in REPO.glob("[0-9]_*/*.py"))
# The lesson part (docstring to banner): about 450 lines; 3_Pendulum has two backends, 4_GRPO_MNIST two tasks
# with token-level decoding and 5_Sharding_Mesh the batch layout of the weights that meet the residual stream
# without a matmul, so they get a little more (each also pays a few lines for Ctrl-C: the guard around the imports).
LESSON_MAX_LINES = {"3_Pendulum": 480, "4_GRPO_MNIST": 506, "5_Sharding_Mesh": 470}
LESSON_MAX_DEFAULT = 450
# Plumbing: whichever of these a script defines must sit below the banner.
PLUMBING = {
    "InputError",
    "reports_input_errors",
    "OneLineParser",
    "parse_args",
    "bounds_text",
    "check_flags",
    "validate",
    "save_checkpoint",
    "load_checkpoint",
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
    limit = LESSON_MAX_LINES.get(script.split("/")[0], LESSON_MAX_DEFAULT)
    assert banner <= limit, f"{script}: the lesson runs {banner} lines (at most {limit})"


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
