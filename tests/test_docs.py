"""Keep every README true to its code, in both languages.

The checks read the scripts with ``ast`` (no imports, no jax), so they run in milliseconds:

- every ``python N_…/script.py --flag …`` command in a code block names a script that exists and
  flags that its ``Args`` dataclass defines;
- every relative link and image resolves;
- every README.md has a README_ch.md twin with the same heading structure;
- every backticked name that looks like code (``compute_gae``, ``pendulum.py``, ``--gamma``) exists
  in the module the README belongs to (the top-level README may name any module's code).

Each check is a plain function that returns a list of problems, so the last tests can run it on a
deliberately broken copy and prove that it fails.
"""
from __future__ import annotations

import ast
import re
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
MODULE_DIR = re.compile(r"^\d_[A-Za-z0-9_]+$")

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+\S")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG_TAG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"", re.IGNORECASE)
COMMAND = re.compile(r"python3?\s+(?:-\S+\s+)*((?:\./)?(\d_[A-Za-z0-9_]+)/([A-Za-z0-9_]+\.py))(.*)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*(\(\))?$")
CLI_FLAG = re.compile(r"^--[a-z][a-z0-9-]*$")
FILE_NAME = re.compile(r"^[\w./-]+\.py$")


def readmes(root: Path = REPO) -> list[Path]:
    """README.md and README_ch.md at the top and in every numbered module folder."""
    found = [p for p in (root / "README.md", root / "README_ch.md") if p.exists()]
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and MODULE_DIR.match(folder.name):
            found += [p for p in (folder / "README.md", folder / "README_ch.md") if p.exists()]
    return found


def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code-block lines) of a markdown text."""
    prose, code, in_code = [], [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        (code if in_code else prose).append(line)
    return prose, code


@lru_cache(maxsize=None)
def script_flags(script: Path) -> frozenset[str]:
    """The CLI flags of a script: one ``--kebab-name`` (and ``--no-kebab-name``) per ``Args`` field."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    flags = {"--help"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    name = item.target.id.replace("_", "-")
                    flags |= {f"--{name}", f"--no-{name}"}
    return frozenset(flags)


@lru_cache(maxsize=None)
def script_words(script: Path) -> frozenset[str]:
    """Every identifier-like word in a script's source (defs, variables, dict keys, strings)."""
    return frozenset(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", script.read_text(encoding="utf-8")))


def module_scripts(readme: Path, root: Path) -> list[Path]:
    """The scripts a README speaks for: its own folder's, or every module's for the top README."""
    if readme.parent == root:
        return sorted(root.glob("[0-9]_*/*.py"))
    return sorted(readme.parent.glob("*.py"))


def check_commands(readme: Path, root: Path = REPO) -> list[str]:
    """Commands in code blocks must name existing scripts and flags their Args define."""
    problems = []
    _, code = split_markdown(readme.read_text(encoding="utf-8"))
    for line in code:
        for match in COMMAND.finditer(line):
            script = root / match.group(1)
            if not script.exists():
                problems.append(f"{readme}: `{match.group(0).strip()}` names a missing script {match.group(1)}")
                continue
            rest = re.split(r"[|;&#]|>", match.group(4))[0]
            for token in rest.split():
                flag = token.split("=")[0]
                if flag.startswith("--") and flag not in script_flags(script):
                    problems.append(f"{readme}: `{line.strip()}` uses {flag}, which {match.group(1)} does not define")
    return problems


def check_links(readme: Path) -> list[str]:
    """Every relative link and image must resolve."""
    problems = []
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    for line in prose:
        line = INLINE_CODE.sub("", line)
        for target in LINK.findall(line) + IMG_TAG.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # web link, mailto or in-page anchor
            path = target.split("#")[0]
            if path and not (readme.parent / path).exists():
                problems.append(f"{readme}: link {target} does not resolve")
    return problems


def headings(readme: Path) -> list[int]:
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    return [len(m.group(1)) for m in map(HEADING.match, prose) if m]


def check_twin(readme: Path) -> list[str]:
    """README.md needs a README_ch.md beside it with the same heading levels in the same order."""
    twin = readme.with_name("README_ch.md")
    if not twin.exists():
        return [f"{readme}: no README_ch.md twin"]
    ours, theirs = headings(readme), headings(twin)
    if ours != theirs:
        return [f"{readme}: heading levels {ours} differ from {twin.name}'s {theirs}"]
    return []


def check_code_names(readme: Path, root: Path = REPO) -> list[str]:
    """Backticked code-like names must exist in the module(s) the README speaks for."""
    problems = []
    scripts = module_scripts(readme, root)
    words = frozenset().union(*(script_words(s) for s in scripts)) if scripts else frozenset()
    flags = frozenset().union(*(script_flags(s) for s in scripts)) if scripts else frozenset()
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    for line in prose:
        for token in INLINE_CODE.findall(line):
            token = token.strip()
            if FILE_NAME.match(token):
                candidates = [readme.parent / token, root / token] + [s.parent / token for s in scripts]
                if not any(c.exists() for c in candidates):
                    problems.append(f"{readme}: `{token}` names a file that does not exist")
            elif CLI_FLAG.match(token):
                if flags and token not in flags:
                    problems.append(f"{readme}: `{token}` is not a flag of {[s.name for s in scripts]}")
            elif IDENTIFIER.match(token) and ("_" in token.strip("_") or token.endswith("()")):
                name = token.removesuffix("()")
                if name not in words:
                    problems.append(f"{readme}: `{token}` is not in {[s.name for s in scripts]}")
    return problems


# ------------------------------------------------------------------------------------------------
# The real READMEs

ALL = readmes()
ENGLISH = [p for p in ALL if p.name == "README.md"]
IDS = [str(p.relative_to(REPO)) for p in ALL]


def test_every_module_has_both_readmes():
    modules = [d for d in REPO.iterdir() if d.is_dir() and MODULE_DIR.match(d.name)]
    assert modules, "no numbered module folders found"
    for d in modules:
        assert (d / "README.md").exists() and (d / "README_ch.md").exists(), d


@pytest.mark.parametrize("readme", ALL, ids=IDS)
def test_commands_use_real_scripts_and_flags(readme):
    assert check_commands(readme) == []


@pytest.mark.parametrize("readme", ALL, ids=IDS)
def test_links_resolve(readme):
    assert check_links(readme) == []


@pytest.mark.parametrize("readme", ENGLISH, ids=[str(p.relative_to(REPO)) for p in ENGLISH])
def test_twins_have_same_headings(readme):
    assert check_twin(readme) == []


@pytest.mark.parametrize("readme", ALL, ids=IDS)
def test_backticked_code_exists(readme):
    assert check_code_names(readme) == []


# ------------------------------------------------------------------------------------------------
# The checks fail on a deliberately broken copy

@pytest.fixture
def broken_repo(tmp_path):
    """A tiny copy of the course's shape: one module with a script, a README and a twin."""
    module = tmp_path / "9_Demo"
    module.mkdir()
    (module / "demo.py").write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass Args:\n    gamma: float = 0.99\n    use_double: bool = True\n"
        "def compute_target(r):\n    return r\n",
        encoding="utf-8",
    )
    (module / "curve.png").write_bytes(b"png")
    good = (
        "# Demo\n\n## Run\n\n```bash\npython 9_Demo/demo.py --gamma 0.9 --no-use-double\n```\n\n"
        "`compute_target` in `demo.py` reads `--gamma`. ![curve](curve.png)\n"
    )
    (module / "README.md").write_text(good, encoding="utf-8")
    (module / "README_ch.md").write_text(good.replace("Run", "執行"), encoding="utf-8")
    return tmp_path, module


def test_checks_pass_on_the_good_copy(broken_repo):
    root, module = broken_repo
    readme = module / "README.md"
    assert check_commands(readme, root) == []
    assert check_links(readme) == []
    assert check_twin(readme) == []
    assert check_code_names(readme, root) == []


def test_a_wrong_flag_in_a_command_fails(broken_repo):
    root, module = broken_repo
    readme = module / "README.md"
    readme.write_text(readme.read_text().replace("--gamma 0.9", "--discount 0.9"))
    assert any("--discount" in p for p in check_commands(readme, root))


def test_a_missing_script_fails(broken_repo):
    root, module = broken_repo
    readme = module / "README.md"
    readme.write_text(readme.read_text().replace("9_Demo/demo.py", "9_Demo/gone.py"))
    assert any("missing script" in p for p in check_commands(readme, root))


def test_a_broken_link_fails(broken_repo):
    _, module = broken_repo
    (module / "curve.png").unlink()
    assert check_links(module / "README.md") != []


def test_a_missing_heading_in_the_twin_fails(broken_repo):
    _, module = broken_repo
    twin = module / "README_ch.md"
    twin.write_text(twin.read_text().replace("## 執行\n", "執行\n"))
    assert check_twin(module / "README.md") != []


def test_a_renamed_function_fails(broken_repo):
    root, module = broken_repo
    script = module / "demo.py"
    script.write_text(script.read_text().replace("compute_target", "td_target"))
    script_words.cache_clear()
    assert any("compute_target" in p for p in check_code_names(module / "README.md", root))


def test_a_missing_twin_fails(broken_repo):
    _, module = broken_repo
    shutil.copy(module / "README.md", module / "README.bak")
    (module / "README_ch.md").unlink()
    assert check_twin(module / "README.md") != []
