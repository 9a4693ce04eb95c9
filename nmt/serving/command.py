"""The server's command line: `python -m nmt.serving --model runs/NAME [--model ...]`.

    python -m nmt.serving --model runs/en-de --model runs/en-fr --port 5000
    curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
         -d '{"q": "A man rides a bike.", "source": "en", "target": "de"}'

Each --model serves one language pair, the languages train.py recorded with it, or those
given as `--model SRC:TGT=PATH`. Search settings are translate.py's flags, applied to every
model, so the server translates exactly as translate.py does with the same flags. The flags
are checked against the server's bounds, the address is bound (a port in use ends the
command before any model loads), the models load (a bad directory ends the command with one
line), the server starts listening, and every search shape is compiled before /health
answers 200 (`Translator.warm_up`); requests before then get 503 with Retry-After. SIGTERM or
Ctrl-C stops accepting connections, answers every request already accepted (waiting as long
as the longest request may take, `ServerLimits.longest_request`; one still running after
that gets 503), and exits 0.
Exit status: 0 after a requested stop, 1 for a fault (a model that cannot be read, a port in
use, a failed warm-up), 2 for a mistake in the flags (a value past its bound, an address not
of this machine).

A separate command rather than a translate.py mode: in translate.py repeated --model flags
make an ensemble, here they are the pairs served, and a server has settings of its own
(address, limits, keys, batching) that mean nothing to a one-off translation.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import uvicorn

from data.config import INFERENCE_BATCH_TOKENS, DataError, check_buckets
from nmt.runtime import cli
from nmt.runtime.cli import UsageError
from nmt.serving.limits import ServerLimits, read_api_keys
from nmt.translation.command import (
    add_engine_flags,
    add_search_flags,
    check_engine_args,
    enable_compilation_cache,
    engine_compute_type,
    given_search_fields,
    name_flags,
    read_shortlist,
    refused_by_this_model,
    search_config,
)
from nmt.translation.errors import InputError
from transformer.strategies import TopKTooLarge

if TYPE_CHECKING:
    from nmt.serving.service import KeyFile

log = logging.getLogger("nmt.serving")
PROG = "python -m nmt.serving"
DEFAULTS = ServerLimits()
# (flag, ServerLimits field, what it bounds, the answer past it): one row per limit.
LIMIT_FLAGS = (
    ("--max-body-bytes", "max_body_bytes", "request body", "413 above"),
    ("--max-file-bytes", "max_file_bytes", "file sent to /translate_file", "413 above"),
    ("--file-char-limit", "max_file_characters", "characters to translate in one file",
     "413 above"),
    ("--char-limit", "max_characters", "characters per request", "413 above"),
    ("--max-sentences", "max_sentences", "sentences per request", "413 above"),
    ("--queue-sentences", "max_queue", "sentences waiting per model",
     "503 with Retry-After while full, 413 for a request larger than it"),
    ("--timeout", "timeout", "seconds from request to answer", "504 after"),
    ("--header-timeout", "header_timeout", "seconds to receive a request's line and headers, "
     "from its first byte (or the connection's start)", "408 and the connection closed after"),
    ("--body-timeout", "body_timeout", "seconds to receive a request's body", "408 after"),
)
# What an operator may ask of one server, each bound named where a flag passes it: past them a
# setting does not serve requests but stalls them (a beam of 1,000 decodes 1,000 rows for each
# sentence, and a search cannot be cancelled once it runs), or has start-up compile for
# minutes.
MAX_SECONDS = 3600.0   # --timeout, --header-timeout, --body-timeout
MAX_BEAM = 64          # --beam (a beam of N decodes N rows per sentence)
MAX_BATCH_TOKENS = 65_536  # --batch-tokens and --gather-tokens: 16x translate.py's batch
MAX_SHAPES = 128       # search shapes compiled per model before the server is ready
# On a CPU a call that fits one batch is searched as one (`Translator._call_batches`): half
# translate.py's budget holds the calls of 32 clients' sentences at two searches, and
# compiles fewer shapes than the whole budget, for the same speed (docs/serving.md). An
# accelerator's step costs little more for more rows, so it takes translate.py's budget.
CPU_BATCH_TOKENS, ACCELERATOR_BATCH_TOKENS = 2048, INFERENCE_BATCH_TOKENS


def build_parser() -> argparse.ArgumentParser:
    parser = cli.OneLineParser(
        prog=PROG, description="Serve trained models over HTTP: LibreTranslate's and "
                               "OpenNMT-py's APIs, a page to try them, /health and /metrics.")
    parser.add_argument("--model", required=True, action="append", metavar="[SRC:TGT=]PATH",
                        help="a run or model directory, serving the languages it was trained "
                             "on (or SRC:TGT); once per language pair")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"),
                        help="compute dtype (default: the model's; --engine jax)")
    engine = parser.add_argument_group("engine")
    add_engine_flags(engine)
    engine.add_argument("--shortlist", type=int, metavar="K",
                        help="search each batch over K candidate target tokens from each "
                             "model's shortlist.npz (python -m nmt.distillation.shortlist) "
                             "instead of the whole vocabulary (--engine jax)")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "0.0.0.0 for every interface)")
    server.add_argument("--port", type=int, default=5000,
                        help="port (default 5000; 0 picks a free one, printed at start)")
    server.add_argument("--api-keys", metavar="FILE",
                        help="require one of the keys in FILE with every translation "
                             "request, as api_key or 'Authorization: Bearer KEY' (one key per "
                             "line, read whole; a line starting with # is a comment)")
    server.add_argument("--cors-origins", default="*", metavar="ORIGINS",
                        help="web origins whose pages may read the answers, comma-separated "
                             "(default *: any, as LibreTranslate; e.g. https://example.org; "
                             "'' for none)")
    server.add_argument("--url-prefix", type=_url_prefix, default="", metavar="PATH",
                        help="the path a reverse proxy serves this server at, e.g. /mt (as "
                             "LibreTranslate's --url-prefix): the URLs it answers with carry "
                             "it, and requests are taken with it or without it (a proxy that "
                             "strips it); default: none")
    server.add_argument("--req-limit", type=int, default=0, metavar="N",
                        help="requests per minute a client may send (a list of N texts counts "
                             "N); 429 with Retry-After past it (default 0: no limit)")
    server.add_argument("--char-limit-per-minute", type=int, default=0, metavar="N",
                        help="characters per minute a client may send; 429 with Retry-After "
                             "past it (default 0: no limit)")
    server.add_argument("--alternatives-limit", type=int, default=3, metavar="N",
                        help="alternative translations a request may ask for (default 3, as "
                             "LibreTranslate; 0: none), from an n-best beam search of at "
                             "least N+1 beams, compiled at its first use")
    server.add_argument("--access-log", action="store_true", help="log every request")
    server.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    batching = parser.add_argument_group("batching")
    batching.add_argument("--batch-tokens", type=int,
                          help="source tokens per search batch, before dividing by the beam "
                               f"size (default {CPU_BATCH_TOKENS} on a CPU, where a call "
                               "that fits one batch is searched as one, "
                               f"{ACCELERATOR_BATCH_TOKENS} on a GPU or TPU, as translate.py; "
                               f"at most {MAX_BATCH_TOKENS})")
    batching.add_argument("--gather-tokens", type=int, default=2048,
                          help="source tokens of waiting requests searched in one call at most "
                               f"(default 2048, at most {MAX_BATCH_TOKENS}); the call is cut "
                               "into batches of --batch-tokens, sentences of similar length "
                               "together")
    batching.add_argument("--searches", type=int,
                          help="search calls run at once (default 2 on a CPU, where one small "
                               "batch keeps only part of the cores busy; 1 on a GPU or TPU)")
    batching.add_argument("--batch-wait-ms", type=float, default=0.0,
                          help="how long the oldest request waits for others to share its "
                               "search (default 0: a call takes the requests that queued while "
                               "the searches before it ran; under load that fills it)")
    batching.add_argument("--refill-wait-ms", type=float, default=10.0,
                          help="how long a search call short of its share of the load waits "
                               "for the next requests of the clients its last call answered "
                               "(default 10)")
    batching.add_argument("--batch-across-requests", default=True,
                          action=argparse.BooleanOptionalAction,
                          help="search the sentences of concurrent requests together "
                               "(default on; off: each request on its own)")
    batching.add_argument("--buckets", type=_int_list, metavar="WIDTHS",
                          help="source widths compiled, e.g. 16,32,64 (default: "
                               "16,32,48,64,96,128,192,256 up to the model's positions)")
    limits = parser.add_argument_group("limits")
    for flag, field, what, answer in LIMIT_FLAGS:
        default = getattr(DEFAULTS, field)
        seconds = isinstance(default, float)
        limits.add_argument(flag, dest=field, type=type(default), default=default,
                            metavar="SECONDS" if seconds else "N",
                            help=f"{what} (default {default:{'g' if seconds else 'd'}}); "
                                 f"{answer}")
    add_search_flags(parser.add_argument_group("search (defaults: each model's stored "
                                               "settings)"))
    return parser


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers such as 16,32,64, got {text!r}")


def _url_prefix(text: str) -> str:
    """--url-prefix as a path from "/" without a trailing one ("mt/" is "/mt"; "/" none)."""
    path = "/" + text.strip("/")
    dot_segment = any(part in (".", "..") for part in path.split("/"))
    if not re.fullmatch(r"[\w.~!$&'()*+,;=:@/-]+", path, re.ASCII) or "//" in path \
            or dot_segment:  # a browser resolves "/../mt" to another path than the one sent
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL path: give the path a proxy "
                                         "serves this server at, such as /mt")
    return "" if path == "/" else path


def check_args(args: argparse.Namespace) -> None:
    """Flag values argparse cannot check; raises UsageError."""
    check_engine_args(args, ensembles=False)
    if args.engine == "ctranslate2" and args.buckets is not None:
        raise UsageError("--buckets does not apply with --engine ctranslate2: CTranslate2 "
                         "batches sentences without bucket widths; drop --buckets.")
    for flag in args.model:  # a malformed pair before any model loads
        parse_model_flag(flag)
    _check_limits(args)
    _check_batching(args)


def _check_limits(args: argparse.Namespace) -> None:
    """Per-request limits and counts in their ranges."""
    counts = [("--batch-tokens", args.batch_tokens), ("--gather-tokens", args.gather_tokens),
              ("--searches", args.searches), ("--shortlist", args.shortlist)]
    for flag, field, _, _ in LIMIT_FLAGS:
        value = getattr(args, field)
        if isinstance(value, float):
            if not 0 < value <= MAX_SECONDS:
                raise UsageError(f"{flag} must be more than 0 and at most {MAX_SECONDS:g} "
                                 f"seconds, got {value}.")
        else:
            counts.append((flag, value))
    for flag, value in (("--req-limit", args.req_limit),
                        ("--char-limit-per-minute", args.char_limit_per_minute),
                        ("--alternatives-limit", args.alternatives_limit)):
        if value < 0:
            raise UsageError(f"{flag} must be >= 0, got {value}.")
    if args.alternatives_limit >= MAX_BEAM:
        raise UsageError(f"--alternatives-limit {args.alternatives_limit}: the n-best search "
                         f"has a beam of at most {MAX_BEAM}; give {MAX_BEAM - 1} or less.")
    for flag, value in counts:
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}.")


def _check_batching(args: argparse.Namespace) -> None:
    """Batch sizes, waits, shapes and the port in their ranges."""
    for flag, value in (("--batch-tokens", args.batch_tokens),
                        ("--gather-tokens", args.gather_tokens)):
        if value is not None and value > MAX_BATCH_TOKENS:
            raise UsageError(f"{flag} {value}: this server searches at most {MAX_BATCH_TOKENS} "
                             "source tokens at once; give that or less.")
    if not 0 <= args.batch_wait_ms <= 1000:
        raise UsageError(f"--batch-wait-ms must be 0 to 1000, got {args.batch_wait_ms}.")
    if not 0 <= args.refill_wait_ms <= 1000:
        raise UsageError(f"--refill-wait-ms must be 0 to 1000, got {args.refill_wait_ms}.")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}.")
    if args.buckets is not None:
        try:
            check_buckets(args.buckets)
        except DataError as err:
            raise UsageError(str(err)) from None


def parse_model_flag(value: str) -> tuple[str | None, str | None, str]:
    """(source, target, path) of `--model [SRC:TGT=]PATH`."""
    head, sep, path = value.partition("=")
    if sep and ":" in head and "/" not in head:
        source, _, target = head.partition(":")
        if not source or not target:
            raise UsageError(f"--model {value}: write the pair as SRC:TGT=PATH, e.g. "
                             "en:de=runs/en-de")
        return source, target, path
    if sep and "/" not in head and not os.path.exists(value):  # de-en=PATH, say
        raise UsageError(f"--model {value}: write the pair as SRC:TGT=PATH, e.g. "
                         "en:de=runs/en-de, or give a path that exists")
    return None, None, value


def apply_backend_defaults(args: argparse.Namespace) -> None:
    """Fill in --batch-tokens and --searches where not given: their defaults depend on whether
    the search runs on a CPU (CTranslate2 here always does). CTranslate2's translators pick
    their own --searches (`load_served_models`): one when sampling, never beyond --threads,
    and only a number the user gave is checked against those."""
    if args.engine == "ctranslate2":
        args.batch_tokens = args.batch_tokens or CPU_BATCH_TOKENS
        return
    import jax

    from nmt.models.translator import default_searches

    if args.batch_tokens is None:
        args.batch_tokens = (CPU_BATCH_TOKENS if jax.default_backend() == "cpu"
                             else ACCELERATOR_BATCH_TOKENS)
    if args.searches is None:
        args.searches = default_searches()


def load_served_models(args: argparse.Namespace):
    """A ServedModel per --model, loaded and checked (InputError, UsageError)."""
    from nmt.serving.catalog import ServedModel

    apply_backend_defaults(args)
    served, seen = [], {}
    for index, flag in enumerate(args.model):
        source, target, path = parse_model_flag(flag)
        start = time.perf_counter()
        translator, values = load_translator(flag, path, args)
        recorded = (values.get("source_lang"), values.get("target_lang"))
        if source and all(recorded) and (source, target) != recorded:
            log.warning("--model %s: the model was trained for %s->%s (recorded with it); "
                        "serving it as %s->%s, as asked", flag, *recorded, source, target)
        source, target = source or recorded[0], target or recorded[1]
        if not (source and target):
            raise UsageError(f"--model {flag}: the model does not record its languages; "
                             f"give them as --model SRC:TGT={path}")
        if (source, target) in seen:
            raise UsageError(f"--model {flag} and --model {seen[source, target]} both serve "
                             f"{source}->{target}; give one model per language pair")
        seen[source, target] = flag
        shapes = check_bounds(flag, translator, args)
        log.info("%s->%s: %s loaded in %.2f s on %s; search: %s%s", source, target, path,
                 time.perf_counter() - start, translator.describe(),
                 ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(translator.search).items()),
                 f"; {shapes} search shapes to compile (at most {MAX_SHAPES})" if shapes else "")
        alternatives = (alternatives_translator(flag, path, translator, args)
                        if args.alternatives_limit else None)
        served.append(ServedModel(index, source, target, path, translator, alternatives))
    if args.searches is None:  # CTranslate2's: the calls its translators take at once
        args.searches = max(model.translator.searches for model in served)
    return served


def alternatives_search(search, limit: int):
    """The search that gives a request its alternatives: a beam of at least `limit` + 1 with
    as many hypotheses kept, otherwise the model's settings."""
    return dataclasses.replace(search, strategy="beam", nbest=limit + 1,
                               beam_size=max(search.beam_size, limit + 1))


def alternatives_translator(flag: str, path: str, translator, args: argparse.Namespace):
    """The model of `translator` with `alternatives_search` (a second CTranslate2 model on
    that engine; the same weights on JAX)."""
    search = alternatives_search(translator.search, args.alternatives_limit)
    if args.engine == "ctranslate2":
        from nmt.engines.ctranslate2 import EngineError, open_translator

        if search.min_len:
            # CTranslate2's beam search renormalizes while EOS is banned (`engine_search`
            # refuses it): the alternatives, a beam search of their own, go without min_len.
            origin = "--min-len" if args.min_len is not None else "the model's stored min_len"
            log.warning("--model %s: %s %d: the alternatives (--alternatives-limit %d) are "
                        "searched without it, as CTranslate2's beam search scores hypotheses "
                        "otherwise while EOS is banned; give --alternatives-limit 0 for none",
                        flag, origin, search.min_len, args.alternatives_limit)
            search = dataclasses.replace(search, min_len=0)
        try:
            return open_translator(path, lambda stored: search, given=given_search_fields(args),
                                   compute_type=engine_compute_type(args),
                                   threads=args.threads or 0, searches=args.searches or 0,
                                   batch_tokens=args.batch_tokens, seed=args.seed)[0]
        except EngineError as err:
            raise UsageError(f"--model {flag}: {err} (for the alternatives' beam search; "
                             "--alternatives-limit 0 gives none)") from None
    from flax import nnx

    from nmt.models.translator import Translator

    return Translator(nnx.merge(translator.graphdef, translator.state), translator.tokenizer,
                      search, batch_tokens=args.batch_tokens, seed=args.seed,
                      buckets=args.buckets, shortlist=translator.shortlist,
                      shortlist_size=translator.shortlist_size)


def load_translator(flag: str, path: str, args: argparse.Namespace):
    """(translator, config dict) of one --model on the engine of --engine."""
    if args.engine == "ctranslate2":
        return load_ctranslate2_translator(flag, path, args)
    from nmt.models.model_dir import ModelDirError, load_models
    from nmt.models.translator import Translator

    try:
        model, tokenizer, values = load_models([path], dtype=args.dtype)
    except (ModelDirError, DataError) as err:
        raise InputError(str(err)) from None
    shortlist = read_shortlist(path, tokenizer) if args.shortlist is not None else None
    try:
        search = search_config(values["search"], args)
        # compact_after=0: the warm-up compiles every program compaction needs, so every
        # batch leaves its finished sentences behind from the first request on (on a CPU;
        # on a GPU or TPU no batch compacts, `BatchPlan.on_cpu`).
        translator = Translator(model, tokenizer, search, batch_tokens=args.batch_tokens,
                                seed=args.seed, buckets=args.buckets, compact_after=0,
                                shortlist=shortlist, shortlist_size=args.shortlist or 0)
    except ValueError as err:
        raise UsageError(f"--model {flag}: {refused_by_this_model(err, args)}") from None
    return translator, {**values, "search": search}


def load_ctranslate2_translator(flag: str, path: str, args: argparse.Namespace):
    """`load_translator` on CTranslate2: the model's cached conversion, no JAX."""
    from nmt.engines.ctranslate2 import EngineError, MissingEngine, open_translator
    from nmt.models.model_files import ModelDirError

    def search_for(stored):
        try:
            return search_config(stored, args)
        except ValueError as err:
            raise UsageError(f"--model {flag}: invalid search settings: "
                             f"{name_flags(str(err))}") from None

    try:
        return open_translator(path, search_for, given=given_search_fields(args),
                               compute_type=engine_compute_type(args),
                               threads=args.threads or 0, searches=args.searches or 0,
                               batch_tokens=args.batch_tokens, seed=args.seed)
    except (ModelDirError, DataError, MissingEngine) as err:
        raise InputError(str(err)) from None
    except EngineError as err:
        raise UsageError(f"--model {flag}: {err}") from None
    except TopKTooLarge as err:
        raise UsageError(f"--model {flag}: {refused_by_this_model(err, args)}") from None


def check_bounds(flag: str, translator, args: argparse.Namespace) -> int:
    """The number of search shapes the model compiles; UsageError naming the bound its search
    passes: its beam (MAX_BEAM), or those shapes (MAX_SHAPES)."""
    beam = translator.strategy.rows_per_sentence
    if beam > MAX_BEAM:
        origin = "--beam" if args.beam is not None else "the model's stored beam size"
        raise UsageError(f"--model {flag}: {origin} {beam}: this server searches with a beam "
                         f"of at most {MAX_BEAM} (each beam is a row of every sentence's "
                         f"search); give --beam {MAX_BEAM} or less")
    if not hasattr(translator, "search_shapes"):  # CTranslate2 compiles nothing
        return 0
    shapes = len(translator.search_shapes())
    if shapes > MAX_SHAPES:
        raise UsageError(f"--model {flag}: --batch-tokens {args.batch_tokens} and the buckets "
                         f"{','.join(map(str, translator.buckets))} make {shapes} search shapes "
                         f"to compile, more than this server's {MAX_SHAPES}; give a smaller "
                         "--batch-tokens or fewer --buckets")
    return shapes


class _Stopping(Exception):
    """Raised inside the warm-up when the server is told to stop."""


def warm_up(models, service, stopping: threading.Event) -> None:
    """Compile every model's search shapes (in a search thread; CTranslate2 compiles nothing
    and translates a sentence), then mark ready."""
    for model in models:
        compiles = model.translator.engine == "jax"

        def progress(done: int, total: int, pair=model.pair) -> None:
            if compiles:
                service.status = f"compiling {pair} search {done}/{total}"
                if done == total or done % 10 == 0:
                    log.info("%s: search compiled for %d of %d batch shapes", pair, done,
                             total)
            if stopping.is_set():
                raise _Stopping

        start = time.perf_counter()
        # The first shape takes longest: the status names the pair from the start.
        service.status = (f"compiling {model.pair} search" if compiles
                          else f"warming up {model.pair}")
        model.translator.warm_up(progress)
        log.info("%s: %s in %.1f s", model.pair, "search compiled" if compiles else "warmed up",
                 time.perf_counter() - start)


def start_batchers(model, service, executor, args: argparse.Namespace) -> None:
    """Start `model`'s batcher, and its alternatives' if it has them: both counted in the
    pair's batch metrics and its queue gauge."""
    from nmt.serving.batching import Batcher

    def batcher(translator, name: str) -> Batcher:
        made = Batcher(translator, executor, name=name, gather_tokens=args.gather_tokens,
                       searches=args.searches, max_wait=args.batch_wait_ms / 1000,
                       max_queue=args.max_queue, refill_wait=args.refill_wait_ms / 1000,
                       across_requests=args.batch_across_requests,
                       on_batch=lambda batch: service.metrics.observe_batch(model.pair, batch))
        made.start()
        return made

    model.batcher = batcher(model.translator, model.pair)
    if model.alternatives is not None:
        model.alternatives_batcher = batcher(model.alternatives, f"{model.pair} alternatives")
    batchers = [b for b in (model.batcher, model.alternatives_batcher) if b is not None]
    service.metrics.track_queue(model.pair, lambda: sum(b.queued_sentences for b in batchers))


def make_lifespan(service, args: argparse.Namespace):
    """Start each model's batcher and the warm-up; at shutdown, stop them. A failed warm-up
    stops the server (`app.state.server`, set once it is made)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()
        executor = concurrent.futures.ThreadPoolExecutor(args.searches,
                                                         thread_name_prefix="search")
        stopping = threading.Event()
        for model in service.catalog.models:
            start_batchers(model, service, executor, args)
        service.executor = executor
        warming = loop.run_in_executor(executor, warm_up, service.catalog.models, service,
                                       stopping)
        warming.add_done_callback(lambda done: _warmed(done, service, app.state.server))
        try:
            yield
        finally:
            stopping.set()
            for model in service.catalog.models:
                await model.batcher.stop()
                if model.alternatives_batcher is not None:
                    await model.alternatives_batcher.stop()
            executor.shutdown(wait=True, cancel_futures=True)

    return lifespan


def _warmed(done: asyncio.Future, service, server: uvicorn.Server) -> None:
    if done.cancelled() or isinstance(done.exception(), _Stopping):
        return
    if done.exception() is not None:
        err = done.exception()
        log.error("compiling the search failed: %s: %s", type(err).__name__, err)
        service.status = "failed"
        server.should_exit = True
        return
    service.ready = True
    service.status = "ok"
    log.info("ready: %s", ", ".join(m.pair for m in service.catalog.models))


def run(args: argparse.Namespace) -> int:
    from nmt.serving.app import build_app
    from nmt.serving.catalog import Catalog
    from nmt.serving.metrics import Metrics
    from nmt.serving.protocol import listening_socket, with_header_timeout
    from nmt.serving.ratelimit import RateLimiter, RateLimits
    from nmt.serving.service import Service

    check_args(args)
    key_file = read_keys(args.api_keys)
    limits = ServerLimits(**{field: getattr(args, field) for _, field, _, _ in LIMIT_FLAGS})
    sock = listening_socket(args.host, args.port)  # before the models: a port in use ends it
    if args.engine == "jax":
        cli.check_jax_platforms()
        enable_compilation_cache()
    service = Service(Catalog(load_served_models(args)), limits, Metrics(),
                      rate=RateLimiter(RateLimits(args.req_limit, args.char_limit_per_minute)),
                      alternatives_limit=args.alternatives_limit, key_file=key_file)
    service.detect("")  # the language identifier loads now, not at the first request
    cli.done_starting()  # before the warm-up, which compiles for as long as it takes
    for model in service.catalog.models:
        service.metrics.describe_model(model.pair, model.translator.engine,
                                       model.translator.compute_type)
    if args.engine == "jax":
        log.info(cli.allocator_status().line)
    origins = [origin.strip() for origin in args.cors_origins.split(",") if origin.strip()]
    app = build_app(service, make_lifespan(service, args), cors_origins=origins,
                    url_prefix=args.url_prefix)
    grace = math.ceil(limits.longest_request(args.alternatives_limit))  # for a stop
    server = _Server(uvicorn.Config(
        app, log_config=None, access_log=args.access_log, lifespan="on", ws="none",
        http=with_header_timeout(limits.header_timeout, service.metrics),
        timeout_graceful_shutdown=grace))
    app.state.server = server
    # uvicorn raises the signal it caught again once it has shut down; these handlers take it,
    # so that a requested stop exits 0 rather than dying of the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    server.run(sockets=[sock])
    if service.status == "failed":
        return cli.EXIT_FAULT
    if not server.started:
        raise InputError(f"could not serve on {args.host}:{args.port} (see the error above)")
    return 0


def read_keys(path: str | None) -> KeyFile | None:
    """The keys of --api-keys, a `KeyFile` that reads them again when the file changes (None
    without the flag); UsageError for a path that is empty, unreadable or holds none."""
    from nmt.serving.service import KeyFile, key_file_state

    if path is None:
        return None
    state = key_file_state(path)  # before reading: a change while it is read is seen later
    try:
        keys = read_api_keys(path)
    except ValueError as err:
        raise UsageError(str(err)) from None
    if any(" #" in key or "\t#" in key for key in keys):
        log.warning("--api-keys %s: a key holds ' #'; keys are read whole, so it is part of "
                    "the key (a comment is a line of its own, starting with #)", path)
    return KeyFile(path, keys, state)


class _Server(uvicorn.Server):
    """uvicorn's Server, saying where it listens once it does (the port --port 0 picked)."""

    async def startup(self, sockets=None):
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]
                log.info("listening on http://%s:%d", host, port)


def main(argv: Sequence[str] | None = None) -> int:
    """The server: its exit status (0 after a requested stop, 1 for a fault, 2 for a mistake
    in the flags; the module's docstring lists them)."""
    return cli.guarded(PROG, lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    cli.allocator_status()
    cli.setup_logging(logging.WARNING if args.quiet else logging.INFO,
                      "%(name)s: %(levelname)s: %(message)s",
                      ("absl", "jax", "jax._src", "orbax", "data"))
    return run(args)
