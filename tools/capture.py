"""Run a command and keep what it printed as a results file that the READMEs quote.

    python tools/capture.py dqn_run -- python 2_Cart_Pole_DQN/cart_pole_dqn.py --out runs/capture/dqn
    python tools/capture.py ppo_variance -- python tools/pg_variance.py

writes `benchmarks/results/NAME.txt`: one header line (the command, the date, the machine, the load and the
package versions, as JSON), a blank line, then the command's standard output and error as they were printed.
A README shows it with `<!-- results: NAME -->` (see tools/results.py). The command runs from the repository
root; a command that fails writes nothing.

    python tools/capture.py dqn_run \
        --figure runs/capture/dqn/latest/learning_curve.png=2_Cart_Pole_DQN/assets/learning_curve.png \
        -- python 2_Cart_Pole_DQN/cart_pole_dqn.py --out runs/capture/dqn

`--figure SRC=DEST` (repeatable; `--figure PATH` when the command writes the figure in place): after the command
succeeds, the image SRC that it wrote is copied to DEST and stamped with this results file's name and digest
(tools/figures.py), and the header records the pair, so `tools/remeasure.py` draws it again the same way.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import FigureError, digest, stamp  # noqa: E402
from results import REPO, RESULTS_DIR, provenance  # noqa: E402


class CaptureError(Exception):
    """Bad input or a failed command: one line, exit status 1."""


def parse_figure(text: str) -> tuple[str, str]:
    """`SRC=DEST` or `PATH` (drawn in place) -> (SRC, DEST), both relative to the repository root."""
    src, _, dest = text.partition("=")
    if not src or (_ and not dest):
        raise CaptureError(f"--figure {text!r}: write SRC=DEST or PATH")
    return src, dest or src


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary name in the same folder, then move it into place: never a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CaptureError(f"cannot write {path}: {e.strerror or e}") from None


def capture(
    name: str, command: list[str], results_dir: Path = RESULTS_DIR, figures: list[tuple[str, str]] = ()
) -> Path:
    """Run `command` in the repository root and write results_dir/NAME.txt; then copy and stamp each figure
    (SRC, DEST) it drew. Return the results file's path."""
    if not name.replace("_", "").replace("-", "").isalnum():
        raise CaptureError(f"name {name!r}: use letters, digits, _ and -")
    if not command:
        raise CaptureError("no command after --")
    try:
        results_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CaptureError(f"cannot write into {results_dir}: {e.strerror or e}") from None
    shown = " ".join(["python" if c == sys.executable else shlex.quote(c) for c in command])
    header = provenance(shown)
    if figures:
        header["figures"] = [f"{src}={dest}" if src != dest else src for src, dest in figures]
    started, start = time.time(), time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise CaptureError(f"cannot run {shown}: {e.strerror or e}") from None
    header["seconds"] = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        raise CaptureError(f"{shown} exited {proc.returncode}: {last}")
    for src, _ in figures:
        drawn = REPO / src
        if not drawn.is_file() or drawn.stat().st_mtime < started:
            raise CaptureError(f"{shown} did not draw {src}; nothing written")
    path = results_dir / f"{name}.txt"
    text = "# " + json.dumps(header, ensure_ascii=False) + "\n\n" + proc.stdout.rstrip("\n") + "\n"
    write_atomically(path, text.encode())
    for src, dest in figures:
        try:
            write_atomically(REPO / dest, stamp(REPO / src, path.name, digest(path)))
        except FigureError as e:
            raise CaptureError(str(e)) from None
        print(f"drew {dest} (stamped with {path.name})")
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="The command follows --.")
    p.add_argument("name", help="results file name (without .txt), e.g. dqn_run")
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="where results files go")
    p.add_argument(
        "--figure",
        action="append",
        default=[],
        metavar="SRC=DEST",
        help="an image the command draws (relative to the repository root), copied to DEST and stamped",
    )
    args = p.parse_args(ours)
    if command and command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]  # the same interpreter (and venv) as this tool
    path = capture(args.name, command, Path(args.results_dir), [parse_figure(f) for f in args.figure])
    print(f"wrote {path}")


if __name__ == "__main__":
    try:
        main()
    except CaptureError as e:
        sys.exit(f"error: {e}")
