"""Where a compiled program's time goes, op by op, from a profiler trace of its runs.

`traced_op_times(fn)` runs `fn` under `jax.profiler.trace` (its Perfetto output), then adds up
the time of every XLA operation the trace shows, by program (`hlo_module`) and by operation
(`hlo_op`). An operation's time is exclusive: a loop or conditional is charged only for what
its body's operations do not account for, so the figures of one program add up to its run
time. Kinds are XLA's own names without their numbering (`ynn_fusion.75` -> `ynn_fusion`): on
the CPU, `ynn_fusion` is work XLA hands to YNNPACK (matrix products and the reductions fused
with them), `wrapped_slice` a slice copied into a buffer of its own, `custom-call` a library
call such as TopK; which is which in a given program is in its optimized HLO
(`XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`).
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterable

import jax


def traced_op_times(fn: Callable[[], object]) -> dict[str, dict[str, float]]:
    """Calls `fn` once under the profiler; returns {program: {operation: exclusive seconds}}."""
    with tempfile.TemporaryDirectory() as directory:
        with jax.profiler.trace(directory, create_perfetto_trace=True):
            fn()
        traces = sorted(Path(directory).rglob("perfetto_trace.json.gz"))
        if not traces:
            raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {directory}")
        with gzip.open(traces[-1], "rt", encoding="utf-8") as f:
            events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    return op_times(events)


def op_times(events: Iterable[dict]) -> dict[str, dict[str, float]]:
    """{program: {operation: exclusive seconds}} of a trace's complete ("X") events that name
    an XLA operation; nesting is read per thread from the events' start and duration."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    per_thread = collections.defaultdict(list)
    for event in spans:
        per_thread[(event.get("pid"), event.get("tid"))].append(event)
    times: dict[str, dict[str, float]] = collections.defaultdict(collections.Counter)
    for thread in per_thread.values():
        for event, exclusive in _exclusive(thread):
            args = event.get("args") or {}
            if "hlo_op" in args:
                times[args.get("hlo_module", "?")][args["hlo_op"]] += exclusive / 1e6
    return {program: dict(ops) for program, ops in times.items()}


def _exclusive(thread: list[dict]) -> list[tuple[dict, float]]:
    """(event, microseconds not covered by the events nested in it) for one thread's events."""
    thread = sorted(thread, key=lambda e: (e["ts"], -e["dur"]))
    covered = [0.0] * len(thread)
    open_spans: list[int] = []  # indices of the events enclosing the current one
    for i, event in enumerate(thread):
        while open_spans and thread[open_spans[-1]]["ts"] + thread[open_spans[-1]]["dur"] \
                <= event["ts"]:
            open_spans.pop()
        if open_spans:
            covered[open_spans[-1]] += event["dur"]
        open_spans.append(i)
    return [(event, max(event["dur"] - covered[i], 0.0)) for i, event in enumerate(thread)]


def kind(operation: str) -> str:
    """An operation's kind: its name without XLA's numbering and clone suffixes."""
    return re.sub(r"(\.clone|\.\d+)+$", "", operation)


def by_kind(ops: dict[str, float]) -> dict[str, float]:
    """Seconds per kind of operation, largest first."""
    kinds = collections.Counter()
    for operation, seconds in ops.items():
        kinds[kind(operation)] += seconds
    return dict(kinds.most_common())
