"""How long each command takes to say something and to answer one sentence, as a user runs it.

    python -m bench.startup --model runs/NAME/averaged [--repeats 3]

Each command is a new process started from the shell's point of view (the repository as the
working directory, the user's caches): the seconds to its first line of output (stdout or
stderr), and to its exit or its answer. `import` is the bare `import jax, flax.nnx` every
command pays. The server is timed to its first line, to /health saying ready, and to the
answer of one POST /translate. Prints one JSON line per command with the median of
`--repeats` runs and every run's figures (a new process's time on a small machine moves by
tens of percent between runs).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import bench_parser, emit, free_port, model_pair, positive_int, usage_errors

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "A man in a blue shirt is standing on a ladder cleaning windows."


def timed(command: list[str], stdin: str | None = None, timeout: float = 600.0,
          first_line_only: bool = False) -> dict[str, float | str]:
    """Seconds to the first line of output and to exit, and the last line of stdout;
    `first_line_only`: the process is killed at its first line."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: list[float] = []
    err_lines: list[str] = []

    def seen(line: str, lines: list[str]) -> None:
        """Keep `line`; the first of either stream sets the time to the first line."""
        if not first:
            first.append(time.perf_counter() - start)
            if first_line_only:
                process.kill()
        lines.append(line)

    def watch_stderr() -> None:
        for line in process.stderr:
            seen(line, err_lines)

    watcher = threading.Thread(target=watch_stderr, daemon=True)
    watcher.start()
    if stdin is not None:
        process.stdin.write(stdin)
    process.stdin.close()
    out_lines: list[str] = []
    for line in process.stdout:
        seen(line, out_lines)
    process.wait(timeout)
    watcher.join(5)
    total = time.perf_counter() - start
    if process.returncode != 0 and not first_line_only:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}): "
                         f"{''.join(err_lines[-3:]).strip()}")
    return {"first_line_s": round(first[0] if first else total, 3),
            "exit_s": round(total, 3),
            "last_line": (out_lines[-1].strip() if out_lines else "")[:120]}


def served(model: str, timeout: float = 600.0,
           server_args: tuple[str, ...] = ()) -> dict[str, float | str]:
    """The server: seconds to its first line, to /health ready, to one translation;
    `server_args` are more of its flags (a test's fewer shapes to compile)."""
    source, target = model_pair(model)  # a run directory too, as the server takes it
    port = free_port()
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "nmt.serving", "--model", model, "--port", str(port),
         *server_args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [process.stdout.readline()]
    first = lines[0] and time.perf_counter() - start
    # Read on, so that the server never blocks on a full pipe; its last line says why it ended.
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if time.perf_counter() - start > timeout or process.poll() is not None:
                reader.join(5)
                said = [line.strip() for line in lines if line.strip()]
                raise SystemExit(f"the server at {base} did not become ready: "
                                 f"{said[-1] if said else 'no output'}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
                    if json.load(reply).get("status") == "ok":
                        break
            except OSError:
                pass
            time.sleep(0.05)
        ready = time.perf_counter() - start
        body = {"q": SENTENCE, "source": source, "target": target}
        request = urllib.request.Request(
            f"{base}/translate", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = json.load(reply)
        answered = time.perf_counter() - start
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)
    return {"first_line_s": round(first, 3), "ready_s": round(ready, 3),
            "exit_s": round(answered, 3), "last_line": str(answer)[:120]}


def commands(model: str, workdir: str) -> dict[str, list[str] | None]:
    """Each command, by name, as a user types it (None: the server, timed by `served`)."""
    python = sys.executable
    scripts = Path(python).parent
    return {
        "import jax, flax.nnx": [python, "-c", "import jax, flax.nnx"],
        "train.py --help": [python, "train.py", "--help"],
        "translate.py --help": [python, "translate.py", "--help"],
        "translate.py, one sentence": [python, "translate.py", "--model", model, SENTENCE],
        "nmt-translate, one sentence from stdin": [str(scripts / "nmt-translate"), "--model",
                                                   model, "-q"],
        "train.py, to its first line": [python, "train.py", "--max-steps", "1",
                                        "--eval-sentences", "0", "--no-progress",
                                        "--output-dir", workdir],
        "nmt-serve": None,
    }


def main() -> None:
    parser = bench_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model directory")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--only", action="append",
                        help="the name of a command to time (repeatable; default: all)")
    args = parser.parse_args()
    import ml_dtypes

    common = {"ml_dtypes": ml_dtypes.__version__, "python": sys.version.split()[0],
              "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as workdir:
        chosen = commands(args.model, str(Path(workdir) / "run"))
        if args.only:
            unknown = [name for name in args.only if name not in chosen]
            if unknown:
                parser.error(f"--only {unknown[0]!r}: not one of {', '.join(map(repr, chosen))}")
            chosen = {name: chosen[name] for name in args.only}
        for name, command in chosen.items():
            stdin = SENTENCE + "\n" if "stdin" in name else None
            first_only = "first line" in name

            def once() -> dict:
                if command is None:
                    return served(args.model)
                return timed(command, stdin, first_line_only=first_only)

            with usage_errors():  # a model directory that is not one
                once()  # fills the caches: the runs timed are warm
                runs = [once() for _ in range(args.repeats)]
            figures = {key: statistics.median(run[key] for run in runs)
                       for key in runs[0] if key.endswith("_s")}
            emit({"command": name, **figures, "runs": runs, **common})


if __name__ == "__main__":
    main()
