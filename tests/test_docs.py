"""Keep every README true to its code, in both languages.

The checks read the scripts with ``ast`` (no imports, no jax), so they run in milliseconds:

- every ``python N_…/script.py --flag …`` command in a code block names a script that exists and
  flags that its ``Args`` dataclass defines;
- every relative link and image resolves, and so does every ``#anchor`` (GitHub's heading slugs), in the page or
  in the README it links; every section a README names in quotes ("X" after a cue such as 'section' or 'under';
  〈X〉 in Chinese) is a heading of the README it means;
- every README.md has a README_ch.md twin with the same heading structure;
- every backticked name that looks like code (``compute_gae``, ``pendulum.py``, ``--gamma``) exists
  in the module the README belongs to (the top-level README may name any module's code);
- every README_ch.md uses one Traditional Chinese term per concept (no retired variant such as 代理人,
  回歸, 無偏, 激活值, 截斷 for clip, or an English word such as epoch left untranslated in prose), has no
  paragraph hard-wrapped mid-sentence, and the top-level one has a 詞彙表 (glossary) table that maps each
  core English term to a single Chinese term;
- every ``jax.``, ``lax.``, ``nnx.`` and ``optax.`` name a script uses is named in the top README's primer or in the
  README of a module whose script uses it, in both languages, and the primer's prose leans on such a name no earlier
  than the section whose snippet shows it;
- no table header is cut mid-bracket (tools/results.py once cut 達標（≥ {bar}） at its first space).

Each check is a plain function that returns a list of problems, so the last tests can run it on a
deliberately broken copy and prove that it fails.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import tokenize
import unicodedata
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest
from conftest import load_script

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
    """README.md and README_ch.md at the top, in every numbered module folder and on the benchmarks page."""
    found = [p for p in (root / "README.md", root / "README_ch.md") if p.exists()]
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and (MODULE_DIR.match(folder.name) or folder.name == "benchmarks"):
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


@cache
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


@cache
def script_words(script: Path) -> frozenset[str]:
    """The names a script's code defines or uses, read from its syntax tree: functions, classes, arguments,
    variables, attributes, imports, keyword arguments, and identifier-like string constants (dict keys,
    flag choices, metrics.json keys). Comments and docstrings do not count: a name mentioned only there is
    not code."""
    return code_words(script.read_text(encoding="utf-8"))


def snippet_words(readme: Path) -> frozenset[str]:
    """The names that the ```python blocks of a README define or use (the top README's JAX primer)."""
    text = readme.read_text(encoding="utf-8")
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```", text, re.M | re.S)
    return frozenset().union(*(code_words(block) for block in blocks))


@cache
def code_words(source: str) -> frozenset[str]:
    """script_words of a piece of Python source."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.update((node.asname or node.name).split("."))
            names.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    return frozenset(names)


def module_scripts(readme: Path, root: Path) -> list[Path]:
    """The scripts a README speaks for: its own folder's; every module's for the top README; every module's, the
    tools' and the peers' for the benchmarks page."""
    if readme.parent == root:
        return sorted(root.glob("[0-9]_*/*.py"))
    if readme.parent.name == "benchmarks":
        return sorted([*root.glob("[0-9]_*/*.py"), *root.glob("tools/*.py"), *root.glob("benchmarks/peers/*.py")])
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
            rest = re.split(r"[|;&#\"']|>", match.group(4))[0]  # a quote closes a command given as a string
            for token in rest.split():
                flag = token.split("=")[0]
                if flag.startswith("--") and flag not in script_flags(script):
                    problems.append(f"{readme}: `{line.strip()}` uses {flag}, which {match.group(1)} does not define")
    return problems


def heading_text(line: str) -> str:
    """A heading's text as GitHub renders it: no #'s, no code ticks, emphasis, link targets or HTML tags."""
    text = re.sub(r"^#{1,6}\s+|\s+#+\s*$", "", line.strip())
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", text).strip()


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading: lowercase, every character that is not a letter, a mark, a digit, '-', '_' or
    a space dropped (CJK ideographs are letters and stay), then each space replaced by '-'."""
    kept = (c for c in text.lower() if unicodedata.category(c)[0] in "LMN" or c in "-_ ")
    return "".join(kept).replace(" ", "-")


def heading_texts(readme: Path) -> list[str]:
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    return [heading_text(line) for line in prose if HEADING.match(line)]


def heading_anchors(readme: Path) -> set[str]:
    """The anchor of every heading; a repeated slug gets -1, -2, … in order, as on GitHub."""
    anchors, seen = set(), {}
    for text in heading_texts(readme):
        slug = github_slug(text)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def check_links(readme: Path) -> list[str]:
    """Every relative link and image must resolve, and so must every #anchor: in the page itself, or in the markdown
    file the link names."""
    problems = []
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    for line in prose:
        line = INLINE_CODE.sub("", line)
        for target in LINK.findall(line) + IMG_TAG.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue  # web link or mailto
            path, _, anchor = target.partition("#")
            file = readme.parent / path if path else readme
            if path and not file.exists():
                problems.append(f"{readme}: link {target} does not resolve")
            elif anchor and file.suffix == ".md" and unquote(anchor) not in heading_anchors(file):
                problems.append(f"{readme}: link {target}: {file.name} has no heading with the anchor #{anchor}")
    return problems


# A section named in quotes: "X" after a cue word in English ('the module README's sections "X" and "Y"', 'under
# "X"'); 〈X〉 in Chinese, or 「X」 after a cue (見「結果」, README 的「常見的實作錯誤」).
SECTION_CUE_EN = re.compile(
    r"(?:\bsections?|\bunder|\bREADME(?:'s)?,?|\bends with|\bheadings?)\s+"
    r'((?:"[^"\n]+"(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)?)+)'
)
SECTION_CUE_ZH = re.compile(r"〈([^〉\n]+)〉|(?:見|列在|參見|README(?:_ch\.md)?\s*的|模組的)\s*「([^」\n]+)」")
SECTION_NUMBER = re.compile(r"^(?:\d+(?:\.\d+)*\.?|第.{1,3}章[：:]?)\s*")


def section_names(paragraph: str, chinese: bool) -> list[str]:
    """The section names a paragraph quotes."""
    text = re.sub(r"\s*\n\s*", " ", INLINE_CODE.sub(lambda m: m.group(0).strip("`"), paragraph))
    if chinese:
        return [a or b for a, b in SECTION_CUE_ZH.findall(text)]
    return [name for group in SECTION_CUE_EN.findall(text) for name in re.findall(r'"([^"]+)"', group)]


def names_a_heading(name: str, readme: Path) -> bool:
    """The quoted name is a heading of the README, or its start up to a colon, with or without its number."""
    for text in heading_texts(readme):
        for candidate in (text, SECTION_NUMBER.sub("", text)):
            if candidate == name or re.match(re.escape(name) + r"\s*[:：]", candidate):
                return True
    return False


def linked_readmes(text: str, readme: Path) -> list[Path]:
    targets = (readme.parent / t.split("#")[0] for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t))
    return [t.resolve() for t in targets if t.suffix == ".md" and t.name.startswith("README") and t.is_file()]


def check_section_names(readme: Path, root: Path = REPO) -> list[str]:
    """Every section a README names in quotes is a heading of the README it means: itself, a README its paragraph
    links, or one its level-2 section links; where neither links one, the top README and the benchmarks page may
    mean any module README in the same language."""
    problems = []
    chinese = readme.name == "README_ch.md"
    prose, _ = split_markdown(readme.read_text(encoding="utf-8"))
    sections = re.split(r"\n(?=## )", "\n".join(prose))
    for section in sections:
        in_section = linked_readmes(section, readme)
        for paragraph in re.split(r"\n\s*\n", section):
            names = section_names(paragraph, chinese)
            if not names:
                continue
            candidates = [readme.resolve(), *linked_readmes(paragraph, readme), *in_section]
            if len(set(candidates)) == 1 and not MODULE_DIR.match(readme.parent.name):
                candidates += sorted(root.glob(f"[0-9]_*/{readme.name}"))
            for name in names:
                if not any(names_a_heading(name, c) for c in candidates):
                    where = ", ".join(sorted({str(c.resolve().relative_to(root.resolve())) for c in candidates}))
                    problems.append(f'{readme}: the section "{name}" is not a heading of {where}')
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


# Backticked names that are not the course's code, and where they come from. Anything else in backticks
# that looks like a Python name must be defined or used in the code (not only in a comment or docstring).
NOT_OUR_CODE = {
    "python": "the interpreter's command",
    "pytest": "the test runner",
    "rich": "the terminal library behind jax.debug.visualize_array_sharding",
    "grep": "the shell command",
    "unit": "a pytest marker (pytest.ini)",
    "smoke": "a pytest marker (pytest.ini)",
    "learning": "a pytest marker (pytest.ini)",
    "integration": "a pytest marker (pytest.ini)",
    "ici_data_parallelism": "a MaxText config key",
    "ici_fsdp_parallelism": "a MaxText config key",
    "ici_tensor_parallelism": "a MaxText config key",
    "activation_batch": "a MaxText logical axis",
    "tensor": "a MaxText mesh axis",
    "null": "JSON's None in metrics.json",
    "deque": "the original guide's replay buffer (collections.deque)",
    "logical_axis_rules": "the MaxText config key and Flax API name the sharding module imitates",
}


def check_code_names(readme: Path, root: Path = REPO) -> list[str]:
    """Backticked code-like names must exist in the module(s) the README speaks for."""
    problems = []
    scripts = module_scripts(readme, root)
    words = frozenset().union(*(script_words(s) for s in scripts)) if scripts else frozenset()
    if readme.parent == root:  # the top README may also name what its own snippets (the JAX primer) use
        words |= snippet_words(readme)
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
            elif IDENTIFIER.match(token):
                name = token.removesuffix("()")
                if name not in words and name not in NOT_OUR_CODE:
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


@pytest.mark.parametrize("readme", ALL, ids=IDS)
def test_quoted_sections_are_headings(readme):
    assert check_section_names(readme) == []


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
    assert check_section_names(readme, root) == []
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


def test_github_slugs():
    cases = {
        "4 · GRPO": "4--grpo",
        "詞彙表（Glossary）": "詞彙表glossary",
        "3. A table cannot read the clock": "3-a-table-cannot-read-the-clock",
        "This script in Tunix's names": "this-script-in-tunixs-names",
        "The `--task digit` run": "the---task-digit-run",
        "Exploration: the ε schedule": "exploration-the-ε-schedule",
        "The ladder: REINFORCE → + baseline → A2C → PPO": "the-ladder-reinforce---baseline--a2c--ppo",
        "3. 表格讀不到時鐘": "3-表格讀不到時鐘",
        "**Bold** and [a link](x.md) <sub>tag</sub>": "bold-and-a-link-tag",
        "Why `token_kl` and _emphasis_": "why-token_kl-and-emphasis",
    }
    assert {text: github_slug(heading_text("## " + text)) for text in cases} == cases


def test_a_broken_anchor_fails(broken_repo):
    _, module = broken_repo
    readme, twin = module / "README.md", module / "README_ch.md"
    readme.write_text(
        "# Demo\n\n## Run\n\n### In the code\n\n## Run\n\n### In the code\n\n"
        "[a](#run) [b](#run-1) [c](#in-the-code-1) [d](README_ch.md#執行) [e](README_ch.md#%E5%9F%B7%E8%A1%8C) "
        "[f](https://example.com/#nowhere)\n",
        encoding="utf-8",
    )
    assert check_links(readme) == []
    for broken in ("[g](#run-2)", "[h](#In-the-code)", "[i](README_ch.md#run)", "[j](#what-it-shows)"):
        readme.write_text(readme.read_text(encoding="utf-8") + broken + "\n", encoding="utf-8")
        assert broken[4:-1] in check_links(readme)[-1]
    assert len(check_links(readme)) == 4
    assert twin.exists()


def test_a_quoted_section_that_is_no_heading_fails(broken_repo):
    root, module = broken_repo
    readme, twin = module / "README.md", module / "README_ch.md"
    readme.write_text(
        '# Demo\n\n## Run\n\n### 3. Fast JAX: split once\n\nThe sections "Run" and "Fast JAX" say it; under "In\n'
        'the code" there is more, and the module\'s README, "Gone", is gone. A "quote" is no section.\n',
        encoding="utf-8",
    )
    other = root / "8_Other"
    other.mkdir()
    (other / "README.md").write_text("# Other\n\n## Gone\n\n## In the code\n", encoding="utf-8")
    problems = check_section_names(readme, root)  # a module README means its own sections, not another module's
    assert [p.split('"')[1] for p in problems] == ["In the code", "Gone"], problems
    twin.write_text("# 示範\n\n## 執行\n\n見〈執行〉與〈不見了〉；見「結果」；「引號」不是章節。\n", encoding="utf-8")
    assert [p.split('"')[1] for p in check_section_names(twin, root)] == ["不見了", "結果"]
    # a README that links another one is checked against that one's headings
    top = root / "README.md"
    top.write_text('# Top\n\n## Ch\n\n[Demo](9_Demo/README.md): its section "Run" and "Lost".\n', encoding="utf-8")
    assert [p.split('"')[1] for p in check_section_names(top, root)] == ["Lost"]
    # the top README names a section without a link: any module README may hold it
    top.write_text('# Top\n\n## Ch\n\nEach module, under "Gone" and "Run"; not under "Lost".\n', encoding="utf-8")
    assert [p.split('"')[1] for p in check_section_names(top, root)] == ["Lost"]


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


def test_the_top_readme_may_name_what_its_snippets_use(broken_repo):
    """Catches: a name in the top README's prose that neither a script nor one of its own ```python blocks uses;
    and a module README borrowing names from its code blocks."""
    root, module = broken_repo
    top = root / "README.md"
    top.write_text("# Top\n\n`compute_target` and `in_axes`.\n", encoding="utf-8")
    assert [p.split("`")[1] for p in check_code_names(top, root)] == ["in_axes"]
    top.write_text(top.read_text() + "\n```python\njax.vmap(f, in_axes=0)\n```\n", encoding="utf-8")
    assert check_code_names(top, root) == []
    readme = module / "README.md"
    readme.write_text(readme.read_text() + "\n`in_axes`\n\n```python\njax.vmap(f, in_axes=0)\n```\n")
    assert any("in_axes" in p for p in check_code_names(readme, root))


def test_a_missing_twin_fails(broken_repo):
    _, module = broken_repo
    shutil.copy(module / "README.md", module / "README.bak")
    (module / "README_ch.md").unlink()
    assert check_twin(module / "README.md") != []


# ------------------------------------------------------------------------------------------------
# The Chinese READMEs: one Traditional Chinese term per concept, no hard wraps, a glossary

CHINESE = [p for p in ALL if p.name == "README_ch.md"]
CHINESE_IDS = [str(p.relative_to(REPO)) for p in CHINESE]

# Files whose prose is still hard-wrapped, exempt from the hard-wrap check until they are rewrapped.
# The test below fails (strict xfail) as soon as one of them is clean, so the entry gets removed.
HARD_WRAP_PENDING: set[str] = set()

# A retired variant → the one term of the glossary in README_ch.md (詞彙表).
RETIRED_TERMS = {
    "代理人": "智慧體 (agent)",
    "回歸": "迴歸 (regression)",
    "無偏": "不偏 (unbiased)",
    "一階動量": "一階動差 (Adam's first moment)",
    "二階動量": "二階動差 (Adam's second moment)",
    "兩個動量": "兩個動差 (Adam's two moments)",
    "參數旗標": "旗標 (a command-line flag)",
    "基準線": "基線 (baseline)",
    "代理目標": "替代目標 (surrogate objective)",
    "機率比值": "機率比 (probability ratio)",
    "分佈": "分布 (distribution)",
    "抽樣": "取樣 (sample)",
    "自助": "自舉 (bootstrap)",
    "四分位距平均": "四分位間平均數 (interquartile mean; 四分位距 is the interquartile range)",
    "過擬合": "過度擬合 (overfitting)",
    "前向傳遞": "前向傳播 (forward pass)",
    "環狀緩衝區": "環形緩衝區 (ring buffer)",
    "重播緩衝區": "回放緩衝區 (replay buffer)",
    "規格書": "（不寫）: learners do not have the document the course was built from",
    "課程指南": "（不寫）: learners do not have the document the course was built from",
    "建置機器": "（不寫）: learners have no build machine",
    "議題": "（不寫）: learners have no issue tracker",
    # 截斷 is only truncation by the time limit; clip and clipping are 裁剪
    "截斷比率": "裁剪機率比 (clip the ratio)",
    "比率截斷": "機率比裁剪 (ratio clipping)",
    "截斷機率比": "裁剪機率比 (clip the ratio)",
    "機率比截斷": "機率比裁剪 (ratio clipping)",
    "梯度截斷": "梯度裁剪 (gradient clipping)",
    "截斷梯度": "裁剪梯度 (clip the gradient)",
    "截斷的目標": "裁剪的目標 (clipped objective)",
    "截斷目標": "裁剪目標 (clipped objective)",
    "截斷替代目標": "裁剪替代目標 (clipped surrogate)",
    "截斷損失": "裁剪損失 (clipped loss)",
    "截斷項": "裁剪項 (the clip term)",
    "截斷更新": "裁剪更新 (clipped update)",
    "截斷範圍": "裁剪範圍 (clip range)",
    "截斷的 ε": "裁剪的 ε (clip ε)",
    "激活": "活化值 (activation, Taiwan usage)",
    "效能評測頁": "基準測試頁 (the benchmarks page)",
    "效能量測頁": "基準測試頁 (the benchmarks page)",
    "提交": "commit (not translated)",
    "數字任務": "個位數任務 (`--task digit`) or 多位數任務 (`--task number`): 數字 is both digit and number",
    "優化器": "最佳化器 (optimizer)",
    "純函數": "純函式 (a pure function in code; 函數 is a function in math)",
    "會打滑": "易滑 (slippery FrozenLake)",
}
RETIRED_PATTERNS = [
    (
        re.compile(r"截斷[^。；，]{0,12}clip|clip[^。；，]{0,12}截斷", re.IGNORECASE),
        "裁剪 near clip (截斷 is only truncation)",
    ),
    (re.compile(r"機率比[^。；]{0,10}截斷|截斷[^。；]{0,4}機率比"), "裁剪 near the ratio (截斷 is only truncation)"),
    (re.compile(r"Adam\W{0,2}(?:的)?(?:兩個)?動量"), "動差 for Adam's moments (動量 is momentum)"),
    (re.compile(r"^\|\s*參數\s*\|\s*預設"), "旗標 as the header of a table of flags"),
    (re.compile(r"(?<!裝置)網格(?!世界)"), "網格世界 (grid world) or 裝置網格 (device mesh), never bare 網格"),
    (re.compile(r"指南"), "nothing: learners do not have the document the course was built from"),
]
# Checked on the prose without inline code: English left untranslated, and words whose meaning needs a qualifier.
RETIRED_IN_PROSE = [
    (re.compile(r"(?<!均勻)隨機策略"), "隨機性策略 (a stochastic policy) or 均勻隨機策略 (a random policy)"),
    (re.compile(r"(?<!局部)(?<!窮舉)搜尋"), "掃描 for a sweep (搜尋 only in 局部搜尋, 窮舉搜尋)"),
    (
        re.compile(r"(?<![（「])\b(?:ε-greedy|epochs?|temporaries|arguments|outputs|off-policy|on-policy)\b", re.I),
        "the glossary's Chinese term (the English word only as a gloss in （…）)",
    ),
]
NAMED_AS_RETIRED = re.compile(r"不用「[^」]*」")  # how the glossary names a retired variant

CJK = "\u3400-\u4dbf\u4e00-\u9fff\u3000-\u303f\uff00-\uffef"  # ideographs, CJK and full-width punctuation
ENDS_CJK = re.compile(rf"[{CJK}][*_]*$")
STARTS_CJK = re.compile(rf"^[*_\[]*[{CJK}]")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")

GLOSSARY_HEADING = re.compile(r"^##\s+詞彙表")
# English term (matched as words in the table's first column) → the Chinese term its row must give
GLOSSARY_REQUIRED = {
    "agent": "智慧體",
    "environment": "環境",
    "state": "狀態",
    "action": "動作",
    "reward": "獎勵",
    "return": "回報",
    "episode": "回合",
    "truncation": "截斷",
    "termination": "終止",
    "clip": "裁剪",
    "policy": "策略",
    "value function": "價值函數",
    "replay buffer": "回放緩衝區",
    "target network": "目標網路",
    "discount factor": "折扣因子",
    "advantage": "優勢",
    "baseline": "基線",
    "actor": "演員",
    "critic": "評論家",
    "bootstrap": "自舉",
    "statistical bootstrap": "拔靴法",
    "seed": "種子",
    "learning rate": "學習率",
    "gradient": "梯度",
    "regression": "迴歸",
    "unbiased": "不偏",
    "flag": "旗標",
    "hyperparameter": "超參數",
    "moment": "一階動差",
    "sharding": "分片",
    "device mesh": "裝置網格",
    "grid world": "網格世界",
    "activation": "活化值",
    "stochastic policy": "隨機性策略",
    "random policy": "均勻隨機策略",
    "ε-greedy": "ε-貪婪",
    "on-policy": "同策略",
    "off-policy": "離策略",
    "epoch": "訓練週期",
    "sweep": "掃描",
    "benchmarks page": "基準測試頁",
    "commit": "commit",
    "digit task": "個位數任務",
    "number task": "多位數任務",
    "supervised fine-tuning": "監督式微調",
    "mode-seeking": "尋找眾數",
    "collective": "集體通訊",
    "high-bandwidth memory": "高頻寬記憶體",
    "arguments": "引數",
    "temporaries": "暫存記憶體",
    "pytree": "pytree",
    "tracing": "追蹤",
    "pure function": "純函式",
    "static argument": "靜態引數",
    "PRNG key": "PRNG 金鑰",
    "carry": "carry",
    "optimizer": "最佳化器",
    "slippery": "易滑",
}


def numbered_prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line; code blocks, fences and $$ math blocks read as blank."""
    out, in_code, in_math = [], False, False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if FENCE.match(s):
            in_code = not in_code
            out.append((n, ""))
        elif in_code:
            out.append((n, ""))
        elif in_math or s.startswith("$$"):
            closes = s.endswith("$$") and (in_math or len(s) > 2)
            in_math = not closes
            out.append((n, ""))
        else:
            out.append((n, line))
    return out


def check_terms(readme: Path) -> list[str]:
    """Chinese prose must use the glossary's term, not a retired variant (code is not checked)."""
    problems, in_glossary = [], False
    for n, line in numbered_prose(readme.read_text(encoding="utf-8")):
        if HEADING.match(line):
            in_glossary = bool(GLOSSARY_HEADING.match(line))
        line = NAMED_AS_RETIRED.sub("", line)
        words = INLINE_CODE.sub("", line)
        for old, new in RETIRED_TERMS.items():
            if old in words:
                problems.append(f"{readme}:{n}: {old} is retired, write {new}")
        for pattern, fix in RETIRED_PATTERNS:
            if pattern.search(line):
                problems.append(f"{readme}:{n}: '{pattern.search(line).group(0)}': write {fix}")
        if in_glossary:
            words = re.sub(r"^\|[^|]*\|", "|", words)  # the glossary's first column is the English term
        for pattern, fix in RETIRED_IN_PROSE:
            if pattern.search(words):
                problems.append(f"{readme}:{n}: '{pattern.search(words).group(0)}': write {fix}")
    return problems


def prose_kind(line: str) -> str:
    s = line.strip()
    if not s:
        return "blank"
    if s[0] in "#|><" or s.startswith("$$"):
        return "block"  # heading, table row, blockquote, HTML, display math
    return "list" if LIST_ITEM.match(line) else "text"


def check_hard_wraps(readme: Path) -> list[str]:
    """A paragraph or list item must be one line: a wrap mid-sentence renders as a stray space in Chinese."""
    problems = []
    lines = numbered_prose(readme.read_text(encoding="utf-8"))
    for (n, line), (_, nxt) in zip(lines, lines[1:]):
        if prose_kind(line) not in ("text", "list") or prose_kind(nxt) != "text":
            continue
        if line.endswith(("  ", "\\", "<br>")):
            continue  # an explicit line break
        if ENDS_CJK.search(line.rstrip()) or STARTS_CJK.match(nxt.strip()):
            problems.append(f"{readme}:{n}: hard wrap before '{nxt.strip()[:20]}…'; join the lines")
    return problems


def glossary_rows(readme: Path) -> list[tuple[str, str]]:
    """(English, 中文) cells of the table in the 詞彙表 section of a README_ch.md."""
    rows, inside = [], False
    for _, line in numbered_prose(readme.read_text(encoding="utf-8")):
        if HEADING.match(line):
            inside = bool(GLOSSARY_HEADING.match(line))
        elif inside and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and not set(cells[0]) <= set("-: "):
                rows.append((cells[0], cells[1]))
    return rows[1:]  # without the header row


def check_glossary(readme: Path) -> list[str]:
    """The 詞彙表 maps every core term to its Chinese term, and no Chinese term to two concepts."""
    rows = glossary_rows(readme)
    if not rows:
        return [f"{readme}: no 詞彙表 (glossary) section with a table"]
    problems = []
    for english, chinese in GLOSSARY_REQUIRED.items():
        found = [zh for en, zh in rows if re.search(rf"\b{re.escape(english)}\b", en, re.IGNORECASE)]
        if not any(chinese in zh for zh in found):
            problems.append(f"{readme}: the glossary has no row mapping '{english}' to {chinese}")
    seen: dict[str, str] = {}
    for english, chinese in rows:
        for term in re.split(r"[／、,，]", re.sub(r"（[^）]*）", "", chinese)):
            term = term.strip()
            if term and term in seen and seen[term] != english:
                problems.append(f"{readme}: {term} translates both '{seen[term]}' and '{english}'")
            seen.setdefault(term, english)
    return problems


@pytest.mark.parametrize("readme", CHINESE, ids=CHINESE_IDS)
def test_chinese_uses_one_term_per_concept(readme):
    assert check_terms(readme) == []


@pytest.mark.parametrize(
    "readme",
    [
        pytest.param(
            p,
            marks=pytest.mark.xfail(
                strict=True, reason="still hard-wrapped: rewrap it, then remove it from HARD_WRAP_PENDING"
            ),
        )
        if str(p.relative_to(REPO)) in HARD_WRAP_PENDING
        else p
        for p in CHINESE
    ],
    ids=CHINESE_IDS,
)
def test_chinese_prose_is_not_hard_wrapped(readme):
    assert check_hard_wraps(readme) == []


def test_glossary_gives_one_term_per_concept():
    assert check_glossary(REPO / "README_ch.md") == []


def test_a_retired_term_fails(tmp_path):
    readme = tmp_path / "README_ch.md"
    readme.write_text(
        "# 測試\n\n智慧體用迴歸擬合回報。不用「代理人」。\n\n"
        "```python\nx = '代理人'  # code is not checked\n```\n\n"
        "代理人學會了。評論家以回歸擬合回報，`clip_frac` 顯示截斷（clip）。\n\n"
        "| 參數 | 預設 | 意義 |\n| --- | --- | --- |\n\n"
        "每次 rollout 做梯度截斷，Adam 的兩個動量是 m 與 v。\n",
        encoding="utf-8",
    )
    problems = check_terms(readme)
    assert [p.split(":")[1] for p in problems] == ["9", "9", "9", "11", "14", "14", "14"]
    named = " ".join(problems)
    assert all(word in named for word in ("代理人", "回歸", "clip_frac` 顯示截斷", "參數", "梯度截斷", "動量"))


def test_a_hard_wrap_fails(tmp_path):
    readme = tmp_path / "README_ch.md"
    good = (
        "# 標題\n\n一整段只有一行。\n\n- 一個項目。\n- 另一個項目。\n  | 表格 | 內含 |\n\n"
        "```text\n程式碼可以\n換行\n```\n\n$$\nx = 1\n，\n$$\n\n| 表 |\n| 格 |\n"
    )
    readme.write_text(good, encoding="utf-8")
    assert check_hard_wraps(readme) == []
    wrapped = "\n這一段在句子中間\n換了行。\n\n- 清單項目也不能\n  換行。\n\n英文結尾 `x`\n中文開頭也算。\n"
    readme.write_text(good + wrapped, encoding="utf-8")
    assert [p.split(":")[1] for p in check_hard_wraps(readme)] == ["22", "25", "28"]


def test_a_missing_or_ambiguous_glossary_fails(tmp_path):
    readme = tmp_path / "README_ch.md"
    readme.write_text("# 標題\n\n## 測試\n\n沒有詞彙表。\n", encoding="utf-8")
    assert check_glossary(readme) != []
    good = (REPO / "README_ch.md").read_text(encoding="utf-8")
    readme.write_text(good, encoding="utf-8")
    assert check_glossary(readme) == []
    readme.write_text(good.replace("| clip, clipping | 裁剪 |", "| clip, clipping | 截斷 |"), encoding="utf-8")
    problems = check_glossary(readme)
    assert any("'clip' to 裁剪" in p for p in problems) and any("截斷 translates both" in p for p in problems)


def test_a_name_only_in_a_comment_or_docstring_fails(broken_repo):
    # The names check reads the syntax tree: a name that survives only in a comment or docstring, or a
    # plain name without an underscore, is caught.
    root, module = broken_repo
    script = module / "demo.py"
    script.write_text(
        '"""Docstring that mentions evaluate_policy."""\n' + script.read_text() + "# train_loop used to live here\n",
        encoding="utf-8",
    )
    script_words.cache_clear()
    readme = module / "README.md"
    readme.write_text(
        readme.read_text() + "\nSee `evaluate_policy`, `train_loop` and `rollout`; `gamma` is fine.\n", encoding="utf-8"
    )
    problems = " ".join(check_code_names(readme, root))
    assert "`evaluate_policy`" in problems and "`train_loop`" in problems and "`rollout`" in problems
    assert "`gamma`" not in problems and "`compute_target`" not in problems


# ----------------------------------------------------------------------------- quoted results
# Every result a README quotes sits inside a marker that tools/results.py fills from benchmarks/results/ (written
# by tools/seeds.py --save or tools/capture.py). A results file that changes without its README fails here.

RESULTS = load_script("tools/results.py")


@pytest.mark.parametrize("readme", RESULTS.markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_results_match_their_files(readme):
    assert RESULTS.check(readme) == []


def test_every_results_file_is_quoted_and_records_its_command():
    quoted = set()
    for readme in RESULTS.markdown_files():
        text = readme.read_text(encoding="utf-8")
        quoted |= {m[2] for m in RESULTS.BLOCK.finditer(text)} | {m[2] for m in RESULTS.INLINE.finditer(text)}
        for image in shown_images(readme):  # a figure quotes the results file it was drawn with
            source = FIGURES.read_stamp(image)
            quoted |= {Path(source["results"]).stem} if source else set()
    for path in sorted(RESULTS.RESULTS_DIR.glob("*.*")):
        data = RESULTS.load(path.stem)
        header = data["provenance"] if isinstance(data, dict) else data[0]
        assert header["command"].startswith("python ") and header["versions"]["python"] and header["date"], path
        assert path.stem in quoted, f"{path.name} is quoted by no README (delete it, or quote it)"


def primary_jax(requirements: Path = REPO / "requirements.txt") -> str:
    """The JAX version requirements.txt pins for Python >= 3.12: the stack every quoted result is measured on."""
    pins = re.findall(r'^jax==(\S+);\s*python_version\s*>=\s*"3\.12"', requirements.read_text(), re.M)
    assert len(pins) == 1, "requirements.txt must pin jax once for python_version >= '3.12'"
    return pins[0]


# Files measured on purpose on the Python 3.11 set (jax 0.10.2), to show a claim holds on another floating-point
# path; their names say so, and a README quotes them beside the primary stack's file.
OTHER_STACK = re.compile(r"_py311(\.|$)")


def stale_results(results_dir: Path, jax_version: str) -> list[str]:
    """The results files whose recorded JAX is not `jax_version` (tools/remeasure.py --stale measures them again),
    except those named `…_py311`, which must record Python 3.11."""
    stale = []
    for path in sorted(results_dir.glob("*.*")):
        data = RESULTS.load(path.stem, results_dir)
        header = data["provenance"] if isinstance(data, dict) else data[0]
        if OTHER_STACK.search(path.stem):
            if not header["versions"]["python"].startswith("3.11."):
                stale.append(f"{path.name}: python {header['versions']['python']}, not 3.11")
        elif header["versions"].get("jax") != jax_version:
            stale.append(f"{path.name}: jax {header['versions'].get('jax')}")
    return stale


def test_every_result_is_measured_on_the_primary_stack():
    assert stale_results(RESULTS.RESULTS_DIR, primary_jax()) == []


def test_a_result_from_another_jax_is_stale(tmp_path):
    header = RESULTS.provenance("python tools/capture.py demo")
    header["versions"]["jax"] = "0.0.1"
    (tmp_path / "demo.txt").write_text("# " + json.dumps(header) + "\n\nout\n", encoding="utf-8")
    assert stale_results(tmp_path, primary_jax()) == ["demo.txt: jax 0.0.1"]
    header["versions"]["python"] = "3.13.0"
    (tmp_path / "demo_py311.txt").write_text("# " + json.dumps(header) + "\n\nout\n", encoding="utf-8")
    assert stale_results(tmp_path, primary_jax())[1:] == ["demo_py311.txt: python 3.13.0, not 3.11"]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text('jax==9.9; python_version >= "3.12"\njax==0.1; python_version < "3.12"\n')
    assert primary_jax(requirements) == "9.9"


# A captured run of a course script shows one seed on one machine; the sentence after it says so in both languages.
RUN_NOTE = {
    "README.md": "Another CPU or JAX version can print slightly different digits",
    "README_ch.md": "換一顆 CPU 或另一個 JAX 版本",
}
SCRIPT_RUN = re.compile(r"^python \d_[A-Za-z0-9_]+/[A-Za-z0-9_]+\.py")


def check_run_notes(readme: Path, results_dir: Path = RESULTS.RESULTS_DIR) -> list[str]:
    """The first quoted capture of a module script's run (a .txt whose command is `python N_module/script.py …`)
    is followed, after its closing marker, by the note that other machines give other digits."""
    text = readme.read_text(encoding="utf-8")
    for m in RESULTS.BLOCK.finditer(text):
        path = results_dir / f"{m[2]}.txt"
        if path.is_file() and SCRIPT_RUN.match(RESULTS.load(m[2], results_dir)[0]["command"]):
            after = text[m.end() :].lstrip("\n").split("\n", 1)[0]
            ok = RUN_NOTE[readme.name] in after
            return [] if ok else [f"{readme}: the captured run {m[2]} is not followed by the other-machines note"]
    return []


MODULE_READMES = [p for p in ALL if MODULE_DIR.match(p.parent.name)]


@pytest.mark.parametrize("readme", MODULE_READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_captured_runs_say_other_machines_differ(readme):
    assert check_run_notes(readme) == []


def test_a_captured_run_without_the_note_fails(tmp_path):
    header = RESULTS.provenance("python 2_Cart_Pole_DQN/cart_pole_dqn.py")
    (tmp_path / "demo.txt").write_text("# " + json.dumps(header) + "\n\nstep=1\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    block = "<!-- results: demo -->\n```text\nstep=1\n```\n<!-- /results -->\n"
    readme.write_text(f"# T\n\n{block}\n{RUN_NOTE['README.md']}; the table is the claim.\n", encoding="utf-8")
    assert check_run_notes(readme, tmp_path) == []
    readme.write_text(f"# T\n\n{block}\nSome other sentence.\n", encoding="utf-8")
    assert len(check_run_notes(readme, tmp_path)) == 1


def test_a_changed_result_fails_the_docs_check(tmp_path):
    """Mutation: a results file whose value changed (a re-measurement) while the README kept the old text."""
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    summary = {
        "metric": "eval_return_mean",
        "bar": 475.0,
        "n": 4,
        "per_seed": {"0": 500.0, "1": 480.0, "2": 300.0, "3": 500.0},
        "mean": 445.0,
        "median": 490.0,
        "min": 300.0,
        "max": 500.0,
        "iqm": 490.0,
        "iqm_ci95": [390.0, 500.0],
        "solved": 3,
        "median_seconds": 7.06,
        "provenance": RESULTS.provenance("python tools/seeds.py demo.py --seeds 0-3 --save demo"),
    }
    (results_dir / "demo.json").write_text(json.dumps(summary), encoding="utf-8")
    for name in ("README.md", "README_ch.md"):
        readme = tmp_path / name
        text = "# Demo\n\n<!-- results: demo -->\n<!-- /results -->\n\nIQM <!-- r: demo.iqm --><!-- /r -->.\n"
        text += "Load <!-- r: demo.load --><!-- /r -->.\n"
        readme.write_text(RESULTS.fill(text, RESULTS.language(readme), results_dir), encoding="utf-8")
        assert RESULTS.check(readme, results_dir) == []
        filled = readme.read_text(encoding="utf-8")
        assert "490.0 [390.0, 500.0]" in filled and "3/4" in filled and "IQM <!-- r: demo.iqm -->490.0<!--" in filled
        load = summary["provenance"]["load_at_start"]
        assert f"Load <!-- r: demo.load -->{load:.2f}<!--" in filled
    assert "種子" in (tmp_path / "README_ch.md").read_text(encoding="utf-8")  # Chinese headings in the twin
    summary["iqm"] = 491.0
    (results_dir / "demo.json").write_text(json.dumps(summary), encoding="utf-8")
    for name in ("README.md", "README_ch.md"):
        problems = RESULTS.check(tmp_path / name, results_dir)
        assert len(problems) == 2 and all("demo" in p for p in problems), problems  # the table and the inline
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("demo.iqm", "demo.gone"), encoding="utf-8")
    assert any("unknown field" in p for p in RESULTS.check(readme, results_dir))


# ----------------------------------------------------------------------------- the learner's words only
# No build language in what learners read: READMEs, the scripts' help texts, comments and docstrings, the tools.
BUILD_WORDS = re.compile(
    r"\bissues?\b|\bteam\b|build machine|targets? we set|\b(?:the|a|its|course|this)\s+spec\b|\bspec's\b|"
    r"preset[ =]+[\"']?spec\b|\bspecification\b|議題|建置機器|團隊|/tmp/",
    re.IGNORECASE,
)


def learner_files() -> list[Path]:
    scripts = sorted(REPO.glob("[0-9]_*/*.py")) + sorted(REPO.glob("tools/*.py"))
    return [p for p in RESULTS.markdown_files() if p.name != "CONTRIBUTING.md"] + scripts


def learner_text(path: Path) -> list[tuple[int, str]]:
    """(line number, text) a learner reads: a README's lines; a script's comments, docstrings and strings (help
    texts) but not its code, where a name like `spec` (a PartitionSpec) is just a variable."""
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [(n, line) for n, line in enumerate(source.splitlines(), 1) if "<sub>`python" not in line]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    # From Python 3.12 an f-string is split into FSTRING_START / FSTRING_MIDDLE / FSTRING_END tokens, not one STRING.
    text = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    return [(t.start[0], t.string) for t in tokens if t.type in text]


def check_build_words(path: Path) -> list[str]:
    """Build language in a learner's text. In a README, inline code (a quoted library message) is not prose, but
    `--preset spec` counts wherever it stands."""
    problems = []
    for n, text in learner_text(path):
        words = INLINE_CODE.sub("", text) if path.suffix == ".md" else text
        m = BUILD_WORDS.search(words) or re.search(r"preset[ =]+[\"']?spec\b", text)
        if m:
            problems.append(f"{path}:{n}: '{m.group(0)}' is build language; say it in the learner's words")
    return problems


@pytest.mark.parametrize("path", learner_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_learner_text_has_no_build_language(path):
    assert check_build_words(path) == []


def test_build_language_check_fails(tmp_path):
    bad = tmp_path / "README.md"
    bad.write_text(
        "# T\n\nThe team measured this on the build machine.\n\n--preset spec\n\n`ValueError: see the specification`\n"
        "`python x.py --preset spec`\n",
        encoding="utf-8",
    )
    assert [p.split(":")[1] for p in check_build_words(bad)] == ["3", "5", "8"]
    script = tmp_path / "demo.py"
    script.write_text('spec = P("data")  # a PartitionSpec `spec`\nhelp = "as in the spec"\n# see the issue\n')
    assert [p.split(":")[1] for p in check_build_words(script)] == ["2", "3"]


# ----------------------------------------------------------------------------- Chinese tables are translated
ASCII_WORDS = re.compile(r"[A-Za-z][A-Za-z'-]*")
HEADER_WORDS_ALLOWED = {"English"}  # the glossary's first column names the English term


def check_table_headers(readme: Path) -> list[str]:
    """A README_ch.md table header is Chinese: a cell of only English words (outside code, math and acronyms such
    as IQM or PPO) is an untranslated header."""
    problems = []
    lines = numbered_prose(readme.read_text(encoding="utf-8"))
    for (n, line), (_, nxt) in zip(lines, lines[1:]):
        if not (line.lstrip().startswith("|") and re.match(r"^\s*\|[\s:|-]+\|\s*$", nxt)):
            continue
        for cell in line.strip().strip("|").split("|"):
            text = re.sub(r"`[^`]*`|\$[^$]*\$", "", cell)
            words = [w for w in ASCII_WORDS.findall(text) if not w.isupper() and w not in HEADER_WORDS_ALLOWED]
            if words and not re.search(f"[{CJK}]", text):
                problems.append(f"{readme}:{n}: table header '{cell.strip()}' is not translated")
    return problems


@pytest.mark.parametrize("readme", CHINESE, ids=CHINESE_IDS)
def test_chinese_table_headers_are_translated(readme):
    assert check_table_headers(readme) == []


def test_one_word_per_concept_fails_on_the_old_wording(tmp_path):
    readme = tmp_path / "README_ch.md"
    old = [
        "回報平均（隨機策略、原始獎勵）",
        "在存下任何激活值之前",
        "它的數字在效能評測頁；計時請見效能量測頁",
        "ε-greedy 探索",
        "標明的提交",
        "兩個種子的驗證搜尋",
        "只有一個 token 的數字任務",
        "讓 Q 學習成為 *off-policy*",
        "十個 epoch 的小批次；arguments 是權重；temporaries 是活化值",
    ]
    new = (
        "回報平均（隨機性策略、原始獎勵），一開始和均勻隨機策略一樣差。在存下任何活化值之前。它的數字在基準測試頁。"
        "**ε-貪婪**（ε-greedy）探索。標明的 commit。兩個種子的驗證掃描；局部搜尋與窮舉搜尋。個位數任務與多位數任務。"
        "讓 Q 學習成為*離策略*（off-policy）方法。十個訓練週期；引數（`arguments`）是權重；暫存記憶體是活化值。\n"
    )
    readme.write_text("# 測試\n\n" + "\n\n".join(old) + "\n", encoding="utf-8")
    lines = [int(p.split(":")[1]) for p in check_terms(readme)]
    assert sorted(set(lines)) == list(range(3, 3 + 2 * len(old), 2)), check_terms(readme)
    readme.write_text("# 測試\n\n" + new, encoding="utf-8")
    assert check_terms(readme) == []
    glossary = "## 詞彙表\n\n| English | 中文 | 說明 |\n| --- | --- | --- |\n| epoch | 訓練週期 | 不用「輪」 |\n"
    readme.write_text("# 測試\n\n" + glossary, encoding="utf-8")
    assert check_terms(readme) == []  # the glossary's first column is English by design
    readme.write_text("# 測試\n\n" + glossary.replace("不用「輪」", "不是 epoch"), encoding="utf-8")
    assert len(check_terms(readme)) == 1


def test_an_english_header_or_a_bare_mesh_in_chinese_fails(tmp_path):
    readme = tmp_path / "README_ch.md"
    readme.write_text(
        "# 測試\n\n| 旗標 | IQM | `--seed` |\n| --- | --- | --- |\n| a | b | c |\n\n"
        "| seed | score (mean) |\n|---|---|\n| 0 | 1 |\n\n網格世界與裝置網格都對。網格不對；課程指南也不對。\n",
        encoding="utf-8",
    )
    assert [p.split(":")[1] for p in check_table_headers(readme)] == ["7", "7"]
    problems = check_terms(readme)
    assert [p.split(":")[1] for p in problems] == ["11"] * 3 and "課程指南" in " ".join(
        problems
    )  # 網格, 課程指南, 指南


# ------------------------------------------------------------------ hand-typed numbers live in history only
BENCHMARKS = [REPO / "benchmarks" / "README.md", REPO / "benchmarks" / "README_ch.md"]
HISTORY_HEADING = re.compile(r"^###\s+(?:Earlier measurements|較早的量測)\s*$")
COMMIT = re.compile(r"\bcommits? [0-9a-f]{7}\b|提交 [0-9a-f]{7}|[0-9a-f]{7}")
MEASURED_CELL = re.compile(r"\d\.\d|\d\s?(?:s|ms|µs|秒|%)(?!\w)|\d+/\d+")


def check_history(page: Path) -> list[str]:
    """The benchmarks page's one rule for numbers typed by hand: a table row outside a results marker that holds a
    measured-looking cell (a decimal, a time, a share, a count of seeds) must sit in an "Earlier measurements"
    section, and every such section, and each of its #### headings, names the commit it was measured at."""
    errors, history, marker, fence, first_row = [], None, False, False, True
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fence = not fence
        if line.startswith("<!-- results:"):
            marker = True
        elif line.startswith("<!-- /results"):
            marker = False
        if fence or marker:
            continue
        if re.match(r"^#{2,3}\s", line):
            history = n if HISTORY_HEADING.match(line) else None
        elif history and line.startswith("#### ") and not COMMIT.search(line):
            errors.append(f"{page.name}:{n}: a heading under 'Earlier measurements' names no commit: {line}")
        if not line.startswith("|"):
            first_row = True
            continue
        row, header, first_row = re.sub(r"<!-- r: .*?<!-- /r -->", "", line), first_row, False
        cells = [c for c in row.strip("|").split("|") if not re.fullmatch(r"\s*:?-+:?\s*", c)]
        if not header and not history and any(MEASURED_CELL.search(re.sub(r"`[^`]*`", "", c)) for c in cells):
            errors.append(f"{page.name}:{n}: a measured table row typed by hand outside 'Earlier measurements'")
    return errors


def history_sections_name_commits(page: Path) -> list[str]:
    """Each 'Earlier measurements' section says, before its first table, at which commit it was measured."""
    text, errors = page.read_text(encoding="utf-8"), []
    for match in re.finditer(r"^###\s+(?:Earlier measurements|較早的量測)\s*\n(.*?)(?=^\|)", text, re.M | re.S):
        if not COMMIT.search(match.group(1)):
            errors.append(f"{page.name}: the section at offset {match.start()} names no commit before its first table")
    return errors


@pytest.mark.parametrize("page", BENCHMARKS, ids=lambda p: p.name)
def test_numbers_typed_by_hand_are_history_with_a_commit(page):
    assert check_history(page) + history_sections_name_commits(page) == []


def test_a_measured_table_typed_outside_history_fails(tmp_path):
    """Catches: a hand-typed measurement table in a current section, or a history heading without its commit."""
    page = tmp_path / "README.md"
    good = "## 2 · DQN\n\n### Earlier measurements\n\nAt commit dd37d81:\n\n| a | b |\n| --- | --- |\n| x | 12.5 s |\n"
    page.write_text(good, encoding="utf-8")
    assert check_history(page) + history_sections_name_commits(page) == []
    page.write_text(good.replace("### Earlier measurements", "### Re-measured"), encoding="utf-8")
    assert check_history(page)
    page.write_text(good + "\n#### Timings\n\n| a |\n| --- |\n| 3 |\n", encoding="utf-8")
    assert check_history(page)
    page.write_text(good.replace("At commit dd37d81:", "Earlier:"), encoding="utf-8")
    assert history_sections_name_commits(page)


# ------------------------------------------------------------------ the lesson budget
LESSON_LINES, LESSON_WORDS = 400, 3000


def lesson_lines(readme: Path) -> list[str]:
    """The README's lines without the exercises' answers (<details> … </details>), which a learner opens after
    trying and which do not count toward the lesson budget."""
    kept, answer = [], False
    for line in readme.read_text(encoding="utf-8").splitlines():
        if "<details>" in line:
            answer = True
        if answer:
            answer = "</details>" not in line
            continue
        kept.append(line)
    return kept


def prose_words(readme: Path) -> int:
    """English words a learner reads as prose: outside code fences, table rows, marker, <sub> and image lines, and
    outside the exercises' answers (<details> … </details>), which a learner opens after trying."""
    fence, count = False, 0
    for line in lesson_lines(readme):
        if FENCE.match(line):
            fence = not fence
            continue
        if fence or line.startswith(("|", "<!--", "<sub>", "![")):
            continue
        count += len(re.findall(r"[A-Za-z][A-Za-z'’-]*", line))
    return count


@pytest.mark.parametrize("readme", [p for p in MODULE_READMES if p.name == "README.md"], ids=lambda p: p.parent.name)
def test_module_readmes_keep_the_lesson_budget(readme):
    """A module README is a lesson: about 400 lines and 3,000 prose words, References included, the exercises' answers
    (<details> … </details>) not counted; sweeps, timings and what was tried go to the benchmarks page. The Chinese
    twin mirrors it heading by heading (checked above)."""
    lines = len(lesson_lines(readme))
    assert lines <= LESSON_LINES and prose_words(readme) <= LESSON_WORDS, (lines, prose_words(readme))


def test_answers_do_not_count_toward_the_budget(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "# T\n\n1. Try.\n\n<details><summary>Answer</summary>\n\nMany words here.\n\n</details>\n\nTwo more.\n"
    )
    assert len(lesson_lines(readme)) == 6 and prose_words(readme) == 4  # T, Try, Two, more


# ----------------------------------------------------------------------------- lessons that stand on their own
# A learner has no document the course was built from: no learner-facing text names one, and no flag is named after
# one. Nor does a lesson tell its own history ("the script now uses …"): that needs an earlier version of the course
# to make sense. The benchmarks page keeps measurements of earlier code in its "Earlier measurements" sections only.
GUIDE_WORDS = re.compile(r"\bguide(?:'s|s)?\b|原始指南|規格書|課程指南", re.IGNORECASE)
HISTORY_EN = re.compile(
    r"\b(?:is|are|was|were) now\b|\bnow (?:also |again )?(?:uses?|keeps?|needs?|prefers?|takes?|gives?|runs?|"
    r"writes?|prints?|reads?|checks?|counts?|scores?|saves?|draws?)\b|\buses? [`\w.]+ again\b|\bno longer\b|"
    r"\bpreviously\b|\bformerly\b|\bthe earlier (?:version|bandit|one-step|sweep|default|code|course|release|commit|"
    r"script|table|figure|preset)s?\b|\bresults did not change\b|\bwhen they were built\b|\bthe default was\b|"
    r"\b(?:was|were) (?:changed|renamed|rewritten)\b|\b(?:new|old|previous) default\b|\b(?:old|earlier) version\b",
    re.IGNORECASE,
)
HISTORY_ZH = re.compile(
    r"現在(?:也|改|已|預設|又)|改名為|又改回|較早(?:的)?(?:版本|拉霸|單步)|舊版|原本的(?:預設|版本)|先前的(?:預設|版本)"
)
EARLIER_SECTION = re.compile(r"^#{2,3}\s+(?:Earlier measurements|較早的量測)\s*$")


def standalone_problems(path: Path) -> list[str]:
    """Names of a document the learner lacks, anywhere; history sentences outside 'Earlier measurements'. In an
    'Earlier measurements' section a recorded command may keep the flag it was run with."""
    problems, earlier = [], False
    for n, text in learner_text(path):
        if path.suffix == ".md" and re.match(r"^#{2,3}\s", text):
            earlier = bool(EARLIER_SECTION.match(text))
        guide = GUIDE_WORDS.search(text)
        if guide and not (earlier and not re.search(r"original|原始", guide.group(0) + text, re.I)):
            problems.append(f"{path}:{n}: '{guide.group(0)}' names a document the learner does not have")
        prose = INLINE_CODE.sub("", text) if path.suffix == ".md" else text
        history = None if earlier else HISTORY_EN.search(prose) or HISTORY_ZH.search(prose)
        if history:
            problems.append(f"{path}:{n}: '{history.group(0)}' tells the course's history; say what the code does")
    return problems


@pytest.mark.parametrize("path", learner_files() + [REPO / "CONTRIBUTING.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_lessons_stand_on_their_own(path):
    assert standalone_problems(path) == []


def test_a_named_guide_or_a_history_sentence_fails(tmp_path):
    """Catches: 'the original guide' or 原始指南 in a lesson, a flag named after it, a history sentence; and not the
    commands recorded in an 'Earlier measurements' section."""
    page = tmp_path / "README.md"
    page.write_text(
        "# T\n\nAs in the original guide.\n\nRun `--preset guide`.\n\nThe script now uses `tfd.Normal` again.\n\n"
        "原始指南的設定。\n\nThe default is 0.99.\n\n## Earlier measurements\n\nAt commit abcdef0: `--preset guide`, "
        "and the reference is now exact.\n\n## Results\n\nThe reference is now exact.\n",
        encoding="utf-8",
    )
    assert [int(p.split(":")[1]) for p in standalone_problems(page)] == [3, 5, 7, 9, 19]
    script = tmp_path / "demo.py"
    script.write_text(
        'x = 1  # the guide\'s merged flag\nhelp = "one learned log σ"\nerror = f"{x} no longer matches"\n',
        encoding="utf-8",
    )
    assert [int(p.split(":")[1]) for p in standalone_problems(script)] == [1, 3]  # an f-string's text too


# ----------------------------------------------------------------------------- every exercise has a measured answer
ANSWER_SUMMARY = {"en": "<summary>Answer</summary>", "ch": "<summary>解答</summary>"}
EXERCISES_HEADING = re.compile(r"^##\s+(?:Exercises|練習)\s*$")
MEASURED_NUMBER = re.compile(r"\d\.\d|\d+/\d+|\d\s?%")  # a decimal, a share of seeds, a percentage


def exercise_items(readme: Path) -> list[tuple[int, str]]:
    """(line, text) of each numbered exercise, its answer included, in the README's Exercises section."""
    items, inside = [], False
    for n, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            inside = bool(EXERCISES_HEADING.match(line))
        elif inside and re.match(r"^\d+\.\s", line):
            items.append((n, line))
        elif inside and items:
            items[-1] = (items[-1][0], items[-1][1] + "\n" + line)
    return items


def answer_problems(readme: Path) -> list[str]:
    """Each exercise is followed by its answer in <details>; a number in an answer is read from a results file
    (a marker), or stands in code or $math$, never typed into the prose."""
    summary, problems = ANSWER_SUMMARY[RESULTS.language(readme)], []
    items = exercise_items(readme)
    if not items:
        return [f"{readme}: no numbered exercises under Exercises / 練習"]
    for n, text in items:
        m = re.search(r"<details>\s*\n?\s*" + re.escape(summary) + r"(.*?)</details>", text, re.S)
        if not m or not re.sub(r"<[^>]+>|\s", "", m.group(1)):
            problems.append(f"{readme}:{n}: exercise without an answer ({summary} … </details>)")
            continue
        body = re.sub(r"<!-- results: .*?<!-- /results -->|<!-- r: .*?<!-- /r -->", "", m.group(1), flags=re.S)
        body = re.sub(r"```.*?```|<sub>.*?</sub>|\$[^$\n]+\$", "", body, flags=re.S)
        typed = MEASURED_NUMBER.search(INLINE_CODE.sub("", body))
        if typed:
            problems.append(f"{readme}:{n}: '{typed.group(0)}' typed into an answer; quote it from its results file")
    return problems


@pytest.mark.parametrize("readme", MODULE_READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_exercise_has_a_measured_answer(readme):
    assert answer_problems(readme) == []


def test_a_missing_answer_or_a_typed_number_fails(tmp_path):
    readme = tmp_path / "README.md"
    answer = "<details><summary>Answer</summary>\n\nIt solves <!-- r: x.solved -->3/5<!-- /r --> with `--tau 0.1`.\n"
    readme.write_text(f"# T\n\n## Exercises\n\n1. Try it.\n\n{answer}\n</details>\n\n2. Again.\n", encoding="utf-8")
    assert [int(p.split(":")[1]) for p in answer_problems(readme)] == [13]
    readme.write_text(f"# T\n\n## Exercises\n\n1. Try it.\n\n{answer}It drops by 4.5.\n</details>\n", encoding="utf-8")
    assert [int(p.split(":")[1]) for p in answer_problems(readme)] == [5]
    readme.write_text(f"# T\n\n## Exercises\n\n1. Try it.\n\n{answer}\n</details>\n", encoding="utf-8")
    assert answer_problems(readme) == []


# ----------------------------------------------------------------------------- figures drawn from their results
FIGURES = load_script("tools/figures.py")
IMAGE_SUFFIXES = (".png", ".gif")


def shown_images(readme: Path) -> list[Path]:
    """Every image file of the repository that a README shows."""
    text = readme.read_text(encoding="utf-8")
    targets = [m.group(1) for m in LINK.finditer(text)] + IMG_TAG.findall(text)
    found = []
    for target in targets:
        path = (readme.parent / unquote(target.split("#")[0])).resolve()
        if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() and path not in found:
            found.append(path)
    return found


@pytest.mark.parametrize("readme", RESULTS.markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_figures_are_drawn_from_their_current_results_file(readme):
    problems = [p for image in shown_images(readme) if (p := FIGURES.check(image, RESULTS.RESULTS_DIR))]
    assert problems == []


def test_an_unstamped_or_stale_figure_fails(tmp_path):
    """Catches: a figure with no stamp, one whose results file changed since, and one whose results file is gone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    image, results_file = tmp_path / "curve.png", tmp_path / "run.txt"
    fig.savefig(image)
    plt.close(fig)
    results_file.write_text("# {}\n\nstep=1 return=2.0\n")
    assert "records no results file" in FIGURES.check(image, tmp_path)
    image.write_bytes(FIGURES.stamp(image, "run.txt", FIGURES.digest(results_file)))
    assert FIGURES.check(image, tmp_path) is None
    results_file.write_text("# {}\n\nstep=1 return=2.5\n")
    assert "stale" in FIGURES.check(image, tmp_path)
    results_file.unlink()
    assert "gone" in FIGURES.check(image, tmp_path)


# ----------------------------------------------------------------------------- every library name is taught
# A learner meets `optax.chain` or `nnx.eval_shape` in a script: the course must say what it is, in the top README's
# primer (`## JAX and Flax NNX`) or in the README of a module whose script uses it, in both languages.

PRIMER_HEADING = {"README.md": "## JAX and Flax NNX", "README_ch.md": "## JAX 與 Flax NNX"}
LIBRARY_ROOTS = ("jax", "lax", "nnx", "optax")
SCRIPTS = sorted(p for p in REPO.glob("[0-9]_*/*.py") if MODULE_DIR.match(p.parent.name))


def library_names(source: str) -> frozenset[str]:
    """Every dotted name a piece of code reaches from jax, lax, nnx or optax, whole (`jax.random.split`, not
    `jax.random`): the outermost attribute of each chain."""
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in LIBRARY_ROOTS:
                names.add(".".join([value.id, *reversed(parts)]))
    return frozenset(names)


def primer_text(readme: Path) -> str:
    match = re.search(
        rf"^{re.escape(PRIMER_HEADING[readme.name])}[ \t]*$(.*?)(?=^## |\Z)", readme.read_text(), re.M | re.S
    )
    return match.group(1) if match else ""


def names_in(name: str, text: str) -> bool:
    """`name` written whole in the text (`jax.lax.scan` may be written `lax.scan`)."""
    forms = [name] + ([name.removeprefix("jax.")] if name.startswith("jax.lax.") else [])
    return any(re.search(rf"(?<![\w.]){re.escape(form)}(?![\w])", text) for form in forms)


def untaught_names(lang: str, root: Path = REPO, scripts: list[Path] | None = None) -> dict[str, list[str]]:
    """{name: the modules using it} for every library name a script uses that neither the primer of the top README
    (in that language) nor the README of a module using it names."""
    primer = primer_text(root / lang)
    missing: dict[str, list[str]] = {}
    for script in scripts if scripts is not None else SCRIPTS:
        module_readme = (script.parent / lang).read_text(encoding="utf-8")
        for name in sorted(library_names(script.read_text(encoding="utf-8"))):
            if not names_in(name, primer) and not names_in(name, module_readme):
                missing.setdefault(name, []).append(script.parent.name)
    return missing


@pytest.mark.parametrize("lang", ["README.md", "README_ch.md"])
def test_every_library_name_a_script_uses_is_taught(lang):
    """Catches: a script that calls `optax.linear_schedule` or `nnx.eval_shape` while no lesson says what it is (the
    primer, or a README of a module that uses it)."""
    assert untaught_names(lang) == {}


def test_an_untaught_name_fails(tmp_path):
    """A name the primer lacks is flagged; written in the primer or in the module's README, it is taught."""
    (tmp_path / "1_M").mkdir()
    script = tmp_path / "1_M" / "m.py"
    script.write_text(
        "import jax\nfrom jax import lax\nx = jax.random.split(k, 2)\ny = jax.lax.scan(f, 0, None, length=3)\n"
    )
    (tmp_path / "1_M" / "README.md").write_text("# M\n\nUses `lax.scan`.\n")
    (tmp_path / "README.md").write_text(
        "# C\n\n## JAX and Flax NNX\n\nKeys: `jax.random.key`.\n\n## Next\n\n`jax.random.split`\n"
    )
    assert library_names(script.read_text()) == {"jax.random.split", "jax.lax.scan"}
    assert untaught_names("README.md", tmp_path, [script]) == {"jax.random.split": ["1_M"]}
    (tmp_path / "README.md").write_text("# C\n\n## JAX and Flax NNX\n\n`jax.random.split(key, 3)`\n")
    assert untaught_names("README.md", tmp_path, [script]) == {}


def primer_forward_references(primer: str) -> list[str]:
    """Library names the primer's prose uses in a subsection before the subsection whose snippet first runs them:
    a learner reads `nnx.Rngs` in the section on keys, with the snippet that shows it three sections on. The
    overview above the first subsection may name what is to come."""
    sections = re.split(r"^### ", primer, flags=re.M)[1:]
    first_prose: dict[str, int] = {}
    first_code: dict[str, int] = {}
    for i, section in enumerate(sections):
        prose, _ = split_markdown(section)
        for block in re.findall(r"^```python[ \t]*\n(.*?)^```", section, re.M | re.S):
            for name in library_names(block):
                first_code.setdefault(name, i)
        for token in INLINE_CODE.findall("\n".join(prose)):
            for name in re.findall(r"\b(?:jax|lax|nnx|optax)(?:\.\w+)+", token):
                first_prose.setdefault(name, i)
    return [
        f"`{name}` in '{sections[i].splitlines()[0]}', its snippet in '{sections[first_code[name]].splitlines()[0]}'"
        for name, i in sorted(first_prose.items())
        if name in first_code and first_code[name] > i
    ]


@pytest.mark.parametrize("lang", ["README.md", "README_ch.md"])
def test_the_primer_shows_a_name_before_it_leans_on_it(lang):
    assert primer_forward_references(primer_text(REPO / lang)) == []


def test_a_forward_reference_in_the_primer_fails():
    """Catches: the section on keys naming `nnx.Rngs`, whose snippet comes with the NNX module, later."""
    keys = "### Keys\n\nSee `nnx.Rngs(seed)`.\n\n```python\nimport jax\nk = jax.random.key(0)\n```\n\n"
    module = "### A module\n\n```python\nfrom flax import nnx\nr = nnx.Rngs(0)\n```\n\n"
    assert primer_forward_references(keys + module) == ["`nnx.Rngs` in 'Keys', its snippet in 'A module'"]
    assert primer_forward_references(module + keys) == []


# ----------------------------------------------------------------------------- the tables tools/results.py writes


def header_cells(text: str) -> list[str]:
    """The cells of every table's header row (the row above a |---| line)."""
    lines = text.splitlines()
    return [
        cell.strip()
        for above, line in zip(lines, lines[1:])
        if re.match(r"^\|\s*:?-{3,}", line) and above.startswith("|")
        for cell in above.strip().strip("|").split("|")
    ]


def unbalanced(cell: str) -> bool:
    return any(cell.count(a) != cell.count(b) for a, b in ("()", "（）", "[]"))


@pytest.mark.parametrize("readme", ALL, ids=IDS)
def test_table_headers_are_whole(readme):
    """Catches: a header cut mid-bracket, as seeds_table once cut 達標（≥ {bar}） at its first space."""
    assert [c for c in header_cells(readme.read_text(encoding="utf-8")) if unbalanced(c)] == []


@pytest.mark.parametrize("lang", ["en", "ch"])
@pytest.mark.parametrize("bar", [None, 0.5])
def test_seeds_table_header_is_whole_with_or_without_a_bar(lang, bar):
    """Catches (tried): the solved column's header cut at its first space when a summary has no bar ("達標（≥" in
    Chinese), or the bar left out when there is one."""
    summary = {**RESULTS.load("grpo_ex1_scratch_seeds"), "bar": bar}
    header = RESULTS.seeds_table(summary, lang).splitlines()[0]
    solved = header_cells(RESULTS.seeds_table(summary, lang))[3]
    expected = {
        ("en", None): "solved",
        ("ch", None): "達標",
        ("en", 0.5): "solved (≥ 0.5)",
        ("ch", 0.5): "達標（≥ 0.5）",
    }
    assert solved == expected[lang, bar], header
    assert not unbalanced(solved)


def test_a_number_can_be_quoted_with_more_digits():
    """kl_ref IQMs of 2.363 and 2.346 both read 2.4 / 2.3 at the table's one decimal, hiding the small gap the text
    compares; iqm_3 (min_3, …) quotes the same number to 3 decimals. Catches: the digits ignored, or the field read
    from another statistic."""
    summary = RESULTS.load("grpo_ex3_k1.val_kl_ref")
    assert RESULTS.field(summary, "iqm") == f"{summary['iqm']:.1f}"
    assert RESULTS.field(summary, "iqm_3") == f"{summary['iqm']:.3f}"
    assert RESULTS.field(summary, "max_4") == f"{summary['max']:.4f}"
    with pytest.raises(RESULTS.ResultsError):
        RESULTS.field(summary, "iqm_x")
