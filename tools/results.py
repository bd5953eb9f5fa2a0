"""Measured results, from the files that measured them into the READMEs that quote them.

Every result a README quotes lives in `benchmarks/results/`, written by the tool that measured it:

- `NAME.json`: a many-seed summary written by `python tools/seeds.py SCRIPT --seeds 0-19 --save NAME`;
- `NAME.txt`: any other printed output, written by `python tools/capture.py NAME -- COMMAND …`.

Both record their command, the package versions, the machine and the date. A README quotes them through markers
that this tool fills in, so nobody types a result by hand:

    <!-- results: NAME -->               a whole table (.json) or a code block of the output (.txt);
    <!-- /results -->                    `<!-- results: NAME head=6 tail=4 -->` keeps 6 first and 4 last lines
    <!-- r: NAME.FIELD -->…<!-- /r -->   one number in a sentence: iqm, ci, solved, n, mean, median, min, max,
                                         median_seconds, load (the load average when it started), or seed_K
                                         (seed K's score)

    python tools/results.py            # fill every marker in every README from benchmarks/results/
    python tools/results.py --check    # change nothing; list each marker whose text differs (exit 1)

A marker quoted in inline code (`<!-- r: … -->`, as on this page) is text, not a marker. A README_ch.md gets the
same numbers under Chinese headings. tests/test_docs.py runs the check, so a results file
that changes without its README (or a README number typed by hand inside a marker) fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "gymnasium", "numpy", "torch", "stable-baselines3")

BLOCK = re.compile(r"(?<!`)(<!-- results: ([\w.-]+)((?: \w+=\d+)*) -->\n)(.*?)(<!-- /results -->)", re.S)
INLINE = re.compile(r"(?<!`)(<!-- r: ([\w.-]+)\.(\w+) -->)(.*?)(<!-- /r -->)")

WORDS = {
    "en": {
        "seeds": "seeds",
        "iqm": "IQM [95 % CI]",
        "solved": "solved (≥ {bar})",
        "solved_no_bar": "solved",
        "min": "min",
        "median": "median",
        "max": "max",
        "seconds": "median s per run",
        "per_seed": "Per seed",
        "metric": "metric",
        "load": "load",
        "cores": "cores",
    },
    "ch": {
        "seeds": "種子",
        "iqm": "IQM [95 % 信賴區間]",
        "solved": "達標（≥ {bar}）",
        "solved_no_bar": "達標",
        "min": "最小值",
        "median": "中位數",
        "max": "最大值",
        "seconds": "每次執行秒數（中位數）",
        "per_seed": "各種子",
        "metric": "指標",
        "load": "負載",
        "cores": "核心",
    },
}


class ResultsError(Exception):
    """A marker names a results file or field that does not exist."""


# ----------------------------------------------------------------------------- provenance (written by the tools)


def provenance(command: str) -> dict:
    """What a results file records about how it was measured: command, date, machine, load, package versions."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "system": platform.system(), "arch": platform.machine()},
        "load_at_start": round(os.getloadavg()[0], 2),
        "versions": versions,
    }


# ----------------------------------------------------------------------------- reading and rendering


def load(name: str, results_dir: Path = RESULTS_DIR) -> dict | tuple[dict, list[str]]:
    """A .json summary as a dict, or a .txt capture as (its header dict, its output lines)."""
    if (results_dir / f"{name}.json").is_file():
        return json.loads((results_dir / f"{name}.json").read_text())
    path = results_dir / f"{name}.txt"
    if not path.is_file():
        raise ResultsError(f"no results file {name}.json or {name}.txt in {results_dir}")
    header, body = path.read_text().split("\n\n", 1)
    return json.loads(header.removeprefix("# ")), body.rstrip("\n").split("\n")


def fmt(v: float, scores) -> str:
    """Scores to one decimal; accuracies and rates (every |score| <= 1) to four."""
    text = f"{v:.4f}" if all(abs(s) <= 1 for s in scores) else f"{v:.1f}"
    return text.replace("-", "−")  # the typographic minus, as in the READMEs' prose


def field(summary: dict, name: str) -> str:
    """One number of a seeds summary, formatted as every table shows it."""
    scores = list(summary["per_seed"].values())
    if name in ("iqm", "mean", "median", "min", "max"):
        return fmt(summary[name], scores)
    digits = re.fullmatch(r"(iqm|mean|median|min|max)_(\d)", name)
    if digits:  # iqm_3: the IQM to 3 decimals, where the table's digits would hide a difference the text compares
        return f"{summary[digits[1]]:.{digits[2]}f}".replace("-", "−")
    if name == "ci":
        low, high = summary["iqm_ci95"]
        return f"[{fmt(low, scores)}, {fmt(high, scores)}]"
    if name == "solved":
        return f"{summary['solved']}/{summary['n']}"
    if name == "n":
        return str(summary["n"])
    if name == "median_seconds":
        return f"{summary['median_seconds']:.1f}"
    if name == "load":
        return f"{summary['provenance']['load_at_start']:.2f}"
    if name.startswith("seed_") and name[5:] in summary["per_seed"]:
        return fmt(summary["per_seed"][name[5:]], scores)
    known = "iqm, ci, solved, n, mean, median, min, max (each also as iqm_D: D decimals), median_seconds, load, seed_K"
    raise ResultsError(f"unknown field {name!r} ({known})")


def footer(prov: dict, lang: str) -> str:
    w = WORDS[lang]
    m = prov["machine"]
    shown = ("python", "jax", "flax", "torch", "stable-baselines3")
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if k in shown)
    return (
        f"<sub>`{prov['command']}` · {prov['date']} · {m['cpu']}, {m['cores']} {w['cores']}, "
        f"{w['load']} {prov['load_at_start']} · {versions}</sub>"
    )


def seeds_table(summary: dict, lang: str) -> str:
    w = WORDS[lang]
    scores = list(summary["per_seed"].values())
    seeds = list(summary["per_seed"])
    seeds_text = (
        f"{seeds[0]}–{seeds[-1]}"
        if seeds == [str(s) for s in range(int(seeds[0]), int(seeds[-1]) + 1)]
        else ", ".join(seeds)
    )
    solved_head = w["solved"].format(bar=f"{summary['bar']:g}") if summary["bar"] is not None else w["solved_no_bar"]
    solved = field(summary, "solved") if summary["bar"] is not None else "–"
    iqm = field(summary, "iqm") + (f" {field(summary, 'ci')}" if summary["iqm_ci95"] else "")
    per_seed = " · ".join(f"{s}: {fmt(v, scores)}" for s, v in summary["per_seed"].items())
    colon = "：" if lang == "ch" else ": "
    return "\n".join(
        [
            f"| {w['metric']} | {w['seeds']} | {w['iqm']} | {solved_head} | {w['min']} | {w['median']} | "
            f"{w['max']} | {w['seconds']} |",
            "|---|---|---|---|---|---|---|---|",
            f"| `{summary['metric']}` | {seeds_text} ({summary['n']}) | {iqm} | {solved} | "
            f"{field(summary, 'min')} | {field(summary, 'median')} | {field(summary, 'max')} | "
            f"{field(summary, 'median_seconds')} |",
            "",
            f"{w['per_seed']}{colon}{per_seed}",
            "",
            footer(summary["provenance"], lang),
        ]
    )


def output_block(header: dict, lines: list[str], lang: str, head: int | None, tail: int | None) -> str:
    if head is not None or tail is not None:
        first, last = lines[: head or 0], lines[len(lines) - (tail or 0) :] if tail else []
        if (head or 0) + (tail or 0) < len(lines):
            lines = [*first, "…", *last]
    return "\n".join(["```text", *lines, "```", "", footer(header, lang)])


def render_block(name: str, options: str, lang: str, results_dir: Path = RESULTS_DIR) -> str:
    opts = dict(o.split("=") for o in options.split())
    unknown = set(opts) - {"head", "tail"}
    if unknown:
        raise ResultsError(f"results: {name}: unknown option(s) {sorted(unknown)} (head=N, tail=N)")
    data = load(name, results_dir)
    if isinstance(data, dict):
        return seeds_table(data, lang)
    header, lines = data
    return output_block(
        header,
        lines,
        lang,
        int(opts["head"]) if "head" in opts else None,
        int(opts["tail"]) if "tail" in opts else None,
    )


def render_inline(name: str, name_field: str, results_dir: Path = RESULTS_DIR) -> str:
    data = load(name, results_dir)
    if not isinstance(data, dict):
        raise ResultsError(f"r: {name}.{name_field}: inline numbers come from a seeds .json, not a .txt capture")
    return field(data, name_field)


def language(path: Path) -> str:
    return "ch" if path.name.endswith("_ch.md") else "en"


def fill(text: str, lang: str, results_dir: Path = RESULTS_DIR) -> str:
    """`text` with every results marker's content replaced by what the results files hold."""
    text = BLOCK.sub(lambda m: m[1] + render_block(m[2], m[3], lang, results_dir) + "\n" + m[5], text)
    return INLINE.sub(lambda m: m[1] + render_inline(m[2], m[3], results_dir) + m[5], text)


def check(path: Path, results_dir: Path = RESULTS_DIR) -> list[str]:
    """Problems in one markdown file: each marker whose text is not what its results file holds."""
    text = path.read_text()
    problems = []
    try:
        filled = fill(text, language(path), results_dir)
    except (ResultsError, KeyError, ValueError) as e:
        return [f"{path}: {e}"]
    for pattern, what in ((BLOCK, "results"), (INLINE, "r")):
        for old, new in zip(pattern.finditer(text), pattern.finditer(filled)):
            if old[0] != new[0]:
                line = text[: old.start()].count("\n") + 1
                problems.append(f"{path}:{line}: <!-- {what}: {old[2]} --> differs from benchmarks/results/{old[2]}")
    return problems


def markdown_files(root: Path = REPO) -> list[Path]:
    """Every README that may quote results: top level, each module, the benchmarks page, CONTRIBUTING.md."""
    found = [*root.glob("README*.md"), *root.glob("[0-9]_*/README*.md"), *root.glob("benchmarks/README*.md")]
    return sorted(p for p in found + [root / "CONTRIBUTING.md"] if p.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; list markers that differ, exit 1 if any")
    args = p.parse_args(argv)
    problems = []
    for path in markdown_files():
        if args.check:
            problems += check(path)
            continue
        text = path.read_text()
        try:
            new = fill(text, language(path))
        except ResultsError as e:
            problems.append(f"{path}: {e}")
            continue
        if new != text:
            path.write_text(new)
            print(f"filled {path.relative_to(REPO)}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
