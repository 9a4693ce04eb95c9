"""bench.op_times: operation times from a profiler trace, each operation charged only for
what the operations nested in it do not cover."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.op_times import by_kind, kind, op_times, traced_op_times


def _op(name: str, start: float, duration: float, thread: int = 1, module: str = "jit_f"
        ) -> dict:
    return {"ph": "X", "pid": 1, "tid": thread, "ts": start, "dur": duration, "name": name,
            "args": {"hlo_module": module, "hlo_op": name}}


def test_nested_operations_are_charged_to_themselves_only():
    events = [
        _op("while.3", 0, 100),             # the loop: 100 us, 70 of them in its body
        _op("ynn_fusion.7", 10, 40),
        _op("cond.2.clone.1", 50, 30),      # a conditional inside the loop
        _op("wrapped_slice.4", 55, 20),     # ... and a slice inside that
        _op("ynn_fusion.7", 200, 5, thread=2),  # the same operation on another thread
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 300, "name": "python"},  # no hlo_op
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "x"}},
    ]
    times = op_times(events)
    assert set(times) == {"jit_f"}
    assert times["jit_f"] == pytest.approx({"while.3": 30e-6, "ynn_fusion.7": 45e-6,
                                            "cond.2.clone.1": 10e-6,
                                            "wrapped_slice.4": 20e-6})
    # What the operations add up to is the loop's own duration plus the other thread's.
    assert sum(times["jit_f"].values()) == pytest.approx(105e-6)


def test_operations_of_two_programs_stay_apart():
    times = op_times([_op("copy.1", 0, 10, module="jit_a"), _op("copy.1", 20, 7, module="jit_b")])
    assert times == {"jit_a": {"copy.1": pytest.approx(10e-6)},
                     "jit_b": {"copy.1": pytest.approx(7e-6)}}


def test_kinds_drop_the_numbering_only():
    assert [kind(n) for n in ("ynn_fusion.75", "cond.19.clone.7", "wrapped_slice",
                              "custom-call.1", "dynamic-update-slice_bitcast_fusion.3",
                              "cond.clone")] == [
        "ynn_fusion", "cond", "wrapped_slice", "custom-call",
        "dynamic-update-slice_bitcast_fusion", "cond"]
    assert by_kind({"ynn_fusion.1": 1.0, "ynn_fusion.2": 2.0, "copy": 0.5}) == {
        "ynn_fusion": 3.0, "copy": 0.5}
    assert list(by_kind({"copy": 0.5, "ynn_fusion.1": 1.0})) == ["ynn_fusion", "copy"]


def test_a_real_trace_names_the_program_and_adds_up_to_no_more_than_its_runs():
    @jax.jit
    def looped(x, w):
        return jax.lax.fori_loop(0, 20, lambda i, x: jnp.tanh(x @ w), x)

    x = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64), np.float32))
    looped(x, x).block_until_ready()

    def run():
        start = time.perf_counter()
        for _ in range(3):
            looped(x, x).block_until_ready()
        run.seconds = time.perf_counter() - start

    times = traced_op_times(run)
    assert "jit_looped" in times, sorted(times)
    ops = times["jit_looped"]
    assert ops and all(seconds >= 0 for seconds in ops.values())
    assert "while" in {kind(name) for name in ops}  # the loop, charged for its own overhead
    assert 0 < sum(ops.values()) <= run.seconds
