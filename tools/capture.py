"""Run a command and keep what it printed as a results file that the READMEs quote.

    python tools/capture.py dqn_run -- python 2_Cart_Pole_DQN/cart_pole_dqn.py --out runs/capture/dqn
    python tools/capture.py ppo_variance -- python tools/pg_variance.py

writes `benchmarks/results/NAME.txt`: one header line (the command, the date, the machine, the load and the
package versions, as JSON), a blank line, then the command's standard output and error as they were printed.
A README shows it with `<!-- results: NAME -->` (see tools/results.py). The command runs from the repository
root; a command that fails writes nothing.
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
from results import REPO, RESULTS_DIR, provenance  # noqa: E402


class CaptureError(Exception):
    """Bad input or a failed command: one line, exit status 1."""


def capture(name: str, command: list[str], results_dir: Path = RESULTS_DIR) -> Path:
    """Run `command` in the repository root and write results_dir/NAME.txt; return its path."""
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
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise CaptureError(f"cannot run {shown}: {e.strerror or e}") from None
    header["seconds"] = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        raise CaptureError(f"{shown} exited {proc.returncode}: {last}")
    path = results_dir / f"{name}.txt"
    path.write_text("# " + json.dumps(header, ensure_ascii=False) + "\n\n" + proc.stdout.rstrip("\n") + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="The command follows --.")
    p.add_argument("name", help="results file name (without .txt), e.g. dqn_run")
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="where results files go")
    args = p.parse_args(ours)
    if command and command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]  # the same interpreter (and venv) as this tool
    path = capture(args.name, command, Path(args.results_dir))
    print(f"wrote {path}")


if __name__ == "__main__":
    try:
        main()
    except CaptureError as e:
        sys.exit(f"error: {e}")
