"""The JAX and Flax NNX primer of the top README runs, and prints what it shows.

The section `## JAX and Flax NNX` of README.md (`## JAX 與 Flax NNX` in README_ch.md) teaches JAX with snippets, each a
```python block followed by a ```text block with the output it prints. Here every snippet runs in this process, in a
fresh namespace, with its stdout captured (a few seconds for all of them, most of it compiling), and:

- its stdout must equal the text block under it, in both READMEs: a snippet that stops working, or prints something
  else, on a new JAX or Flax version fails here, as does an output line edited by hand;
- a DeprecationWarning that the snippet's own code triggers fails it: the primer teaches the current API;
- the Chinese snippets must be the English code (compared as syntax trees: comments may be translated, code and the
  strings it prints may not).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import warnings

import pytest
from conftest import REPO

pytestmark = pytest.mark.unit

PRIMER = {"README.md": "## JAX and Flax NNX", "README_ch.md": "## JAX 與 Flax NNX"}
FENCED = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SNIPPET_FILE = "<primer snippet>"
MIN_SNIPPETS = 12  # arrays, jit, static arguments, grad, keys, vmap, pytrees, scan, cond, Module, Optimizer, split


def primer_section(text: str, heading: str) -> str | None:
    """The lines from the primer's heading to the next level-2 heading, or None if the heading is missing."""
    match = re.search(rf"^{re.escape(heading)}[ \t]*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1) if match else None


def snippets(text: str, heading: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(code, shown output) of every ```python block in the primer section, each with the ```text block that must
    follow it (nothing but blank lines between), and the problems met while reading them."""
    section = primer_section(text, heading)
    if section is None:
        return [], [f"no section '{heading}'"]
    blocks = list(FENCED.finditer(section))
    pairs, problems = [], []
    for i, block in enumerate(blocks):
        if block.group(1) != "python":
            continue
        shown = blocks[i + 1] if i + 1 < len(blocks) else None
        between = section[block.end() : shown.start()] if shown else ""
        if shown is None or shown.group(1) != "text" or between.strip():
            first_line = block.group(2).strip().splitlines()[0] if block.group(2).strip() else ""
            problems.append(f"the snippet starting '{first_line}' has no ```text block right after it")
            continue
        pairs.append((block.group(2), shown.group(2)))
    return pairs, problems


_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {}  # syntax tree -> (stdout, deprecations)


def run(code: str) -> tuple[str, tuple[str, ...]]:
    """(stdout, the DeprecationWarnings raised from the snippet's own lines) of one snippet, run in a fresh namespace;
    once per syntax tree, so the Chinese twin of an English snippet (the same code, other comments) is not run again."""
    tree = ast.dump(ast.parse(code))
    if tree not in _RUNS:
        out = io.StringIO()
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            exec(compile(code, SNIPPET_FILE, "exec"), {"__name__": "primer_snippet"})
        deprecated = tuple(
            f"line {w.lineno}: {str(w.message).splitlines()[0]}"
            for w in caught
            if issubclass(w.category, DeprecationWarning) and w.filename == SNIPPET_FILE
        )
        _RUNS[tree] = out.getvalue(), deprecated
    return _RUNS[tree]


def check_snippet(code: str, shown: str) -> list[str]:
    """What is wrong with one snippet: an exception, a deprecated call, or stdout other than the shown output."""
    try:
        printed, deprecated = run(code)
    except Exception as error:  # the snippet is broken: report it as a problem, not as an error of the test
        return [f"raises {type(error).__name__}: {error}"]
    problems = [f"uses a deprecated API ({d})" for d in deprecated]
    if printed.rstrip("\n") != shown.rstrip("\n"):
        problems.append(f"prints\n{printed.rstrip()}\nbut the README shows\n{shown.rstrip()}")
    return problems


def check_same_code(english: list[tuple[str, str]], chinese: list[tuple[str, str]]) -> list[str]:
    """The Chinese snippets are the English ones: the same number, the same syntax tree (comments aside)."""
    if len(english) != len(chinese):
        return [f"README.md has {len(english)} snippets, README_ch.md {len(chinese)}"]
    return [
        f"snippet {i} differs from the English beyond its comments"
        for i, ((en, _), (ch, _)) in enumerate(zip(english, chinese), 1)
        if ast.dump(ast.parse(en)) != ast.dump(ast.parse(ch))
    ]


def readme_snippets(name: str) -> tuple[list[tuple[str, str]], list[str]]:
    return snippets((REPO / name).read_text(encoding="utf-8"), PRIMER[name])


CASES = [(name, i, pair) for name in PRIMER for i, pair in enumerate(readme_snippets(name)[0], 1)]


# ----------------------------------------------------------------------------------------------- the real READMEs


@pytest.mark.parametrize("name", list(PRIMER))
def test_the_primer_has_its_snippets(name):
    pairs, problems = readme_snippets(name)
    assert problems == [] and len(pairs) >= MIN_SNIPPETS, (problems, len(pairs))


@pytest.mark.parametrize(("name", "index", "pair"), CASES, ids=[f"{name}-{i}" for name, i, _ in CASES])
def test_every_snippet_prints_what_the_readme_shows(name, index, pair):
    code, shown = pair
    assert check_snippet(code, shown) == [], f"{name}, snippet {index}"


def test_chinese_snippets_are_the_english_code():
    assert check_same_code(readme_snippets("README.md")[0], readme_snippets("README_ch.md")[0]) == []


# ----------------------------------------------------------------------------------- the checks catch what they must


def test_a_changed_output_line_a_missing_output_or_a_broken_snippet_fails():
    """Catches: an output line edited by hand (or a JAX version that prints another), a snippet shown without its
    output, a snippet that raises, a deprecated call."""
    code, shown = readme_snippets("README.md")[0][0]
    assert check_snippet(code, shown) == []
    lines = shown.splitlines()
    changed = "\n".join(lines[:-1] + [lines[-1] + "0"]) + "\n"
    assert len(check_snippet(code, changed)) == 1
    assert len(check_snippet(code, "\n".join(lines[:-1]) + "\n")) == 1  # a line missing
    assert check_snippet(code + "raise ValueError('x')\n", shown)[0].startswith("raises ValueError")
    old_api = "import warnings\nwarnings.warn('old', DeprecationWarning)\n"
    assert check_snippet(old_api, "") != []
    section = f"{PRIMER['README.md']}\n\nText.\n\n```python\n{code}```\n\nProse between.\n\n```text\n{shown}```\n"
    pairs, problems = snippets(section, PRIMER["README.md"])
    assert pairs == [] and len(problems) == 1
    assert snippets("# Course\n", PRIMER["README.md"]) == ([], ["no section '## JAX and Flax NNX'"])


def test_a_chinese_snippet_with_other_code_fails():
    """Catches: a Chinese snippet whose code drifted from the English; a translated comment is fine."""
    english = readme_snippets("README.md")[0][:1]
    code, shown = english[0]
    commented = [(code.replace("\n", "  # 註解\n", 1), shown)]
    assert check_same_code(english, commented) == []
    other = [(code.replace("16", "17", 1), shown)]
    assert len(check_same_code(english, other)) == 1
    assert len(check_same_code(english, english + english)) == 1
