"""The server under load: `python -m bench.serve --model runs/NAME --test-prefix P --src S
--tgt T`.

Starts `python -m nmt.serving` on 127.0.0.1, lets 1, 8, 32 and 128 concurrent clients send the
test set's sentences for --seconds each (LibreTranslate's POST /translate, one sentence per
request, keep-alive connections), and prints sentences per second, p50/p95/p99 latency and
errors per client count; then the same with batching across requests switched off
(--no-batch-across-requests), and the batch ceiling: the whole test set translated as one
call, as translate.py --input does, warm (no start-up). With --modes ...,calls: the most a
server could give with that many sentences in flight, were HTTP and queueing free: the
server's translator (its --batch-tokens, --buckets and --searches), warm, on threads each
fed calls of clients / searches sentences of the test set at once; ...,sorted-calls: the same
with the test set sorted by source length, so that each call holds sentences of about one
length (what mixing lengths in a call costs). The server's RSS is read at the end of every load;
--memory-minutes N runs one more load (32 clients) for N minutes and compares the RSS after
the first minute with the RSS at the end. With --rounds N, the batched server's loads
and the ceiling's pass alternate N times (the ceiling's translator is then loaded in this
process first, and idles while the server is loaded), and the medians are reported with each
round's ratio of the server to the ceiling: a machine whose speed moves between minutes moves
both.

The clients run in this process (asyncio, raw HTTP/1.1) and share the machine's cores with the
server, as they would with a front end on the same host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import (
    bench_prog,
    free_port,
    positive_int,
    read_test_set,
    test_set_parser,
    usage_errors,
)
from data.config import INFERENCE_BATCH_TOKENS
from nmt.runtime import allocator
from nmt.runtime.cli import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_SIGNALLED, fail
from transformer.config import BEAM_RULES

SEARCH_FLAGS = ("beam_rules", "max_len_a", "max_len_b")

REPO = Path(__file__).resolve().parents[1]


# The server's command line; a test puts a stand-in here.
SERVER = [sys.executable, "-m", "nmt.serving"]


class ServerStartError(Exception):
    """The server could not start: its own one-line reason (a port in use, no model)."""


class ServerExited(Exception):
    """The server exited while it was being measured."""


class _Terminated(BaseException):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt (no `except Exception` stops it)."""


def _terminate(*_) -> None:
    raise _Terminated


@contextlib.contextmanager
def ending_in_one_line():
    """Within it, SIGTERM unwinds as Ctrl-C does, through the `finally` blocks that stop the
    server; either ends the command in one line (exit 143, 130), as does a server that exited
    under load (exit 1)."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    prog = bench_prog()
    try:
        yield
    except KeyboardInterrupt:
        fail(prog, "interrupted", EXIT_INTERRUPTED)
    except _Terminated:
        fail(prog, "terminated", EXIT_SIGNALLED["SIGTERM"])
    except ServerExited as err:
        fail(prog, str(err), EXIT_FAULT)
    finally:
        signal.signal(signal.SIGTERM, previous)


class ServerProcess:
    """`python -m nmt.serving` on a free port (or the --port in `args`), ready: its /health
    says "ok". Asked, not read from its log, which --quiet keeps to warnings. Stopped again
    should anything, an interrupt included, end the wait."""

    def __init__(self, args: list[str], start_timeout: float = 900):
        self.port = _port_in(args) or free_port()
        self.process = subprocess.Popen(
            [*SERVER, "--port", str(self.port), *args], cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        started = time.monotonic()
        try:
            self._wait_ready(started + start_timeout)
        except BaseException:  # an interrupt too: no server is left behind
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.log.append(line)

    def _wait_ready(self, deadline: float) -> None:
        while not self._healthy():
            if self.process.poll() is not None:
                raise ServerStartError(f"the server did not start: {self.last_line()}")
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server was not ready in time: {self.last_line()}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                        timeout=5) as reply:
                return json.load(reply).get("status") == "ok"
        except (OSError, ValueError):  # not listening yet, 503 while loading
            return False

    def last_line(self) -> str:
        """The server's last line on stderr, less its `PROG: error: `."""
        if self.process.poll() is not None:
            self._drain.join(5)
        lines = [line.strip() for line in self.log if line.strip()]
        if not lines:
            return f"no output (exit status {self.process.poll()})"
        return lines[-1].split(": error: ", 1)[-1]

    def rss_mib(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def check_running(self, grace: float = 0.0) -> None:
        """ServerExited if the server has exited, or does within `grace` seconds."""
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            return
        else:
            raise ServerExited(f"the server exited (status {self.process.returncode}): "
                               f"{self.last_line()}")

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _port_in(args: list[str]) -> int | None:
    """The last --port in the server's flags, as its parser reads them."""
    port = None
    for i, arg in enumerate(args):
        if arg == "--port" and i + 1 < len(args):
            port = args[i + 1]
        elif arg.startswith("--port="):
            port = arg.removeprefix("--port=")
    return int(port) if port is not None and port.isdigit() else None


async def _client(port: int, sentences: list[str], start: int, stop_at: float,
                  source: str, target: str, latencies: list[float], errors: list[str]) -> None:
    """One keep-alive connection sending one sentence per request until `stop_at`; one the
    server closes or breaks ends it, as one error."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as err:
        errors.append(f"could not connect: {err}")
        return
    n = start
    try:
        while time.monotonic() < stop_at:
            body = json.dumps({"q": sentences[n % len(sentences)], "source": source,
                               "target": target}).encode()
            n += 1
            began = time.monotonic()
            writer.write(b"POST /translate HTTP/1.1\r\nHost: bench\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            status_line = await reader.readline()
            if not status_line:
                errors.append("the server closed the connection")
                return
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answer = await reader.readexactly(length)
            if b" 200 " not in status_line:
                errors.append(status_line.decode().strip() + " " + answer.decode()[:200])
            else:
                latencies.append(time.monotonic() - began)
    except (OSError, asyncio.IncompleteReadError) as err:
        errors.append(f"the connection broke: {type(err).__name__}")
    finally:
        writer.close()


def _search_calls(port: int) -> tuple[float, float]:
    """(search calls, sentences in them) so far, from the server's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    totals = {"count": 0.0, "sum": 0.0}
    for line in text.splitlines():
        found = re.match(r"nmt_batch_sentences_(count|sum)\{.*\} (\S+)$", line)
        if found:
            totals[found.group(1)] += float(found.group(2))
    return totals["count"], totals["sum"]


def load(server: ServerProcess, sentences: list[str], clients: int, seconds: float,
         source: str, target: str) -> dict:
    """`clients` concurrent clients for `seconds`: throughput, latency, errors, and the
    sentences per search call the server made of them. ServerExited if it exited."""
    port = server.port
    server.check_running()
    calls_before, searched_before = _search_calls(port)
    latencies: list[float] = []
    errors: list[str] = []

    async def run():
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(
            _client(port, sentences, i * 997, stop_at, source, target, latencies, errors)
            for i in range(clients)))

    start = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - start
    server.check_running(grace=1.0 if errors else 0.0)  # a closed connection: has it exited?
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    calls, searched = (after - before for after, before in
                       zip(_search_calls(port), (calls_before, searched_before)))
    return {"clients": clients, "sentences_per_call": searched / calls if calls else 0.0,
            "sentences": len(latencies),
            "sent_per_s": len(latencies) / elapsed, "p50_ms": 1000 * cuts[49],
            "p95_ms": 1000 * cuts[94], "p99_ms": 1000 * cuts[98], "errors": len(errors),
            "first_error": errors[0] if errors else None}


def server_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The server's own flags as it reads them (--batch-tokens and --server-args on top of its
    defaults for this backend): the ceilings search with the same batches, widths and threads."""
    from nmt.serving import command

    flags = ["--model", args.model, *shlex.split(args.server_args)]
    if args.batch_tokens is not None:
        flags += ["--batch-tokens", str(args.batch_tokens)]
    settings = command.build_parser().parse_args(flags)
    command.apply_backend_defaults(settings)
    return settings


def model_and_search(args: argparse.Namespace):
    """The model, its tokenizer and its search settings with this command's overrides."""
    from nmt.models.model_dir import load_model
    from nmt.runtime.compilation import enable_compilation_cache

    enable_compilation_cache()
    model, tokenizer, values = load_model(args.model)
    search = dataclasses.replace(values["search"], **{
        name: getattr(args, name) for name in SEARCH_FLAGS if getattr(args, name) is not None})
    return model, tokenizer, search


class BatchCeiling:
    """The test set as one Translator call with translate.py's settings (its searches at
    once), warm: every program a timed pass runs, the compacting ones included, is compiled by
    an untimed pass first."""

    def __init__(self, args: argparse.Namespace, sentences: list[str]):
        from nmt.models.translator import Translator, default_searches

        model, tokenizer, search = model_and_search(args)
        self.translator = Translator(
            model, tokenizer, search, batch_tokens=args.ceiling_batch_tokens,
            buckets=server_settings(args).buckets, searches=default_searches(), compact_after=0)
        self.sentences = sentences
        self.batch_tokens = args.ceiling_batch_tokens
        self.translator.translate(sentences)  # compiles

    def timed_pass(self) -> dict:
        start = time.perf_counter()
        self.translator.translate(self.sentences)
        seconds = time.perf_counter() - start
        return {"sentences": len(self.sentences), "seconds": seconds,
                "batch_tokens": self.batch_tokens, "sent_per_s": len(self.sentences) / seconds}


def call_ceilings(args: argparse.Namespace, sentences: list[str], counts: list[int],
                  by_length: bool = False) -> list[dict]:
    """For each client count N: the server's translator, warm, on N threads at most, each
    translating the test set's sentences in calls of N / searches (as many as N clients keep
    in flight), all at once. `by_length`: the sentences sorted by source length first, so
    that each call holds sentences of about one length, as no server's calls can (its clients
    choose what comes in): what mixing lengths in a call costs."""
    import concurrent.futures

    from nmt.models.translator import Translator

    model, tokenizer, search = model_and_search(args)
    if by_length:
        lengths = [len(row) for row in tokenizer.encode(sentences)]
        sentences = [sentences[i] for i in sorted(range(len(sentences)), key=lengths.__getitem__)]
    settings = server_settings(args)
    translator = Translator(model, tokenizer, search, batch_tokens=settings.batch_tokens,
                            buckets=settings.buckets, compact_after=0)
    translator.warm_up()  # as the server does before it is ready
    rows = []
    with concurrent.futures.ThreadPoolExecutor(settings.searches) as pool:
        for clients in counts:
            at_once = min(clients, settings.searches)
            size = clients // at_once
            calls = [sentences[i:i + size] for i in range(0, len(sentences), size)]

            def work(k: int) -> None:
                for call in calls[k::at_once]:
                    translator.translate_nbest(call)

            start = time.perf_counter()
            list(pool.map(work, range(at_once)))
            seconds = time.perf_counter() - start
            rows.append({"clients": clients, "sentences_per_call": size,
                         "searches": at_once, "sentences": len(sentences),
                         "seconds": seconds, "sent_per_s": len(sentences) / seconds})
    return rows


def main(argv=None) -> int:
    parser = test_set_parser(__doc__.splitlines()[0])
    parser.add_argument("--clients", type=client_counts, default="1,8,32,128",
                        help="concurrent client counts (default 1,8,32,128)")
    parser.add_argument("--seconds", type=positive_int, default=60,
                        help="load per client count (default 60)")
    parser.add_argument("--modes", default="batched,unbatched,ceiling",
                        help="what to measure: batched, unbatched, ceiling, calls, "
                             "sorted-calls (default: the first three)")
    parser.add_argument("--batch-tokens", type=positive_int,
                        help="the server's --batch-tokens (default: the server's)")
    parser.add_argument("--ceiling-batch-tokens", type=positive_int,
                        default=INFERENCE_BATCH_TOKENS,
                        help=f"the ceiling's --batch-tokens (default {INFERENCE_BATCH_TOKENS}, "
                             "translate.py's)")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="alternate the batched server's loads and the ceiling's pass this "
                             "many times, and report medians (default 1: each once)")
    parser.add_argument("--memory-minutes", type=positive_int, default=0,
                        help="then load the batched server with 32 clients this long and "
                             "compare its RSS after 1 minute with the RSS at the end")
    parser.add_argument("--beam-rules", choices=BEAM_RULES,
                        help="beam rules (default: the model's)")
    parser.add_argument("--max-len-a", type=float, help="output limit a (default: the model's)")
    parser.add_argument("--max-len-b", type=int, help="output limit b (default: the model's)")
    parser.add_argument("--server-args", default="",
                        help="more flags for the server, e.g. '--buckets 32,64 "
                             "--batch-wait-ms 2' (and --buckets for the ceiling)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    try:
        shlex.split(args.server_args)  # split where the server starts: a quote left open
    except ValueError as error:  # would end the run there in a traceback
        parser.error(f"--server-args {args.server_args!r}: {error}; close the quote")
    modes = args.modes.split(",")
    unknown = set(modes) - {"batched", "unbatched", "ceiling", "calls", "sorted-calls"}
    if unknown:
        parser.error(f"--modes: unknown mode(s) {', '.join(sorted(unknown))}; the modes are "
                     "batched, unbatched, ceiling, calls and sorted-calls")
    with ending_in_one_line(), usage_errors(ServerStartError):
        return measure(args, modes)


def client_counts(text: str) -> list[int]:
    """argparse type: client counts, comma-separated, each at least 1."""
    return [positive_int(part) for part in text.split(",")]


def measure(args: argparse.Namespace, modes: list[str]) -> int:
    """What `modes` name, printed as it goes; the report in --json too."""
    sentences, _ = read_test_set(args)
    sentences = [s for s in sentences if s.strip()]
    counts = args.clients
    report: dict = {"model": args.model, "test_set": args.test_prefix, "seconds": args.seconds,
                    "rounds": args.rounds}
    # With --rounds the ceiling's translator is loaded first, so that its passes can alternate
    # with the server's loads; on a GPU both processes then hold the device, so neither may
    # take most of its memory up front (JAX's default). Otherwise it is loaded at the end,
    # once the servers have stopped.
    alternate = "ceiling" in modes and "batched" in modes and args.rounds > 1
    if alternate:
        os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # inherited by the server
    ceiling = BatchCeiling(args, sentences) if alternate else None
    passes: list[dict] = []

    def ceiling_pass() -> None:
        passes.append(ceiling.timed_pass())
        print(f"ceiling: {passes[-1]['sent_per_s']:.1f} sent/s "
              f"({len(sentences)} sentences in one call)", flush=True)

    for mode in ("batched", "unbatched"):
        if mode not in modes:
            continue
        flags = ["--model", args.model]
        if args.batch_tokens is not None:
            flags += ["--batch-tokens", str(args.batch_tokens)]
        for name in SEARCH_FLAGS:
            if getattr(args, name) is not None:
                flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
        if mode == "unbatched":
            flags.append("--no-batch-across-requests")
        flags += shlex.split(args.server_args)
        server = ServerProcess(flags)
        print(f"{mode}: ready {server.ready_seconds:.0f} s after start (loading, compiling "
              "every search shape)", flush=True)
        report[f"{mode}_ready_seconds"] = server.ready_seconds
        rows = []
        rounds = args.rounds if mode == "batched" else 1
        try:
            for round_ in range(rounds):
                for clients in counts:
                    row = load(server, sentences, clients, args.seconds, args.src,
                               args.tgt)
                    row.update(rss_mib=server.rss_mib(), round=round_)
                    rows.append(row)
                    print(f"{mode:9s} {clients:4d} clients: {row['sent_per_s']:7.1f} sent/s  "
                          f"p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  "
                          f"p99 {row['p99_ms']:7.1f} ms  errors {row['errors']}  "
                          f"RSS {row['rss_mib']:.0f} MiB  {row['sentences_per_call']:.1f} "
                          "sentences per search call", flush=True)
                if alternate:
                    ceiling_pass()  # while the server idles
            if mode == "batched" and args.memory_minutes:
                report["memory"] = memory_check(server, sentences, args)
        finally:
            print(f"{mode}: server exit status {server.stop()}", flush=True)
        report[mode] = rows
    if "ceiling" in modes:
        if not passes:
            ceiling = BatchCeiling(args, sentences)
            ceiling_pass()
        report["ceiling"] = ceiling_summary(passes)
        if len(passes) > 1 and "batched" in report:
            report["against_ceiling"] = against_ceiling(report["batched"], passes, counts)
    for mode in ("calls", "sorted-calls"):
        if mode not in modes:
            continue
        report[mode] = call_ceilings(args, sentences, counts, by_length=(mode == "sorted-calls"))
        for row in report[mode]:
            print(f"{mode:12s} {row['clients']:4d} clients: {row['sent_per_s']:7.1f} sent/s  "
                  f"({row['searches']} at once, {row['sentences_per_call']} sentences each, "
                  "no HTTP)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def ceiling_summary(passes: list[dict]) -> dict:
    """The ceiling's passes as one record: the median seconds and the sentences/s they give
    (one pass's figures, so the two agree), and every pass's sentences/s."""
    seconds = statistics.median(p["seconds"] for p in passes)
    return {**passes[0], "seconds": seconds, "sent_per_s": passes[0]["sentences"] / seconds,
            "passes": [p["sent_per_s"] for p in passes]}


def against_ceiling(rows: list[dict], passes: list[dict], counts: list[int]) -> list[dict]:
    """Per client count: the median sentences/s of the rounds, and the median over rounds of
    the load's sentences/s over the ceiling pass that followed it."""
    summary = []
    for clients in counts:
        loads = [row["sent_per_s"] for row in rows if row["clients"] == clients]
        ratios = [load / ceiling["sent_per_s"] for load, ceiling in zip(loads, passes)]
        summary.append({"clients": clients, "sent_per_s": statistics.median(loads),
                        "ratio": statistics.median(ratios), "ratios": ratios})
        print(f"batched   {clients:4d} clients over {len(loads)} rounds: median "
              f"{summary[-1]['sent_per_s']:.1f} sent/s, {summary[-1]['ratio']:.2f} of the "
              f"ceiling (rounds: {', '.join(f'{r:.2f}' for r in ratios)})", flush=True)
    return summary


def memory_check(server: ServerProcess, sentences: list[str], args) -> dict:
    """RSS after one minute of 32 clients and after `memory_minutes`."""
    first = load(server, sentences, 32, 60, args.src, args.tgt)
    after_one = server.rss_mib()
    rest = load(server, sentences, 32, 60 * (args.memory_minutes - 1), args.src, args.tgt)
    at_end = server.rss_mib()
    result = {"rss_after_1_min_mib": after_one, "rss_at_end_mib": at_end,
              "minutes": args.memory_minutes, "errors": first["errors"] + rest["errors"],
              "change": at_end / after_one - 1}
    print(f"memory: RSS {after_one:.0f} MiB after 1 minute, {at_end:.0f} MiB after "
          f"{args.memory_minutes} ({100 * result['change']:+.1f}%), errors {result['errors']}",
          flush=True)
    return result


if __name__ == "__main__":
    allocator.preload()  # as translate.py and the server: mimalloc under XLA:CPU
    sys.exit(main())
