"""Compiled programs kept on disk (transformer.stored): what is stored, what loads, what not.

Each test's function multiplies by a constant drawn for this run, so that its program is new
to JAX's persistent compilation cache too (a program that cache serves is not stored; one
test checks that).
"""

from __future__ import annotations

import errno
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import stored


@pytest.fixture
def store(tmp_path):
    """Programs stored in a fresh directory for one test, then as before."""
    before = stored._directory, stored._max_bytes
    stored.keep_programs_in(tmp_path / "programs")
    yield tmp_path / "programs"
    stored._directory, stored._max_bytes = before


def _salt() -> float:
    return float(int.from_bytes(os.urandom(3), "little") + 1)


def _stored_jit(salt: float, traces: list, identity: str = "model A") -> stored.StoredJit:
    """A StoredJit of a new function of (static factor, x) that records each trace: what a
    new process has (jax.jit's own caches know a function by its identity)."""
    def scaled(factor, x):
        traces.append(x.shape)
        return x * factor * salt + 1

    return stored.StoredJit(scaled, identity=lambda: identity, static_args=1)


def test_a_program_stored_by_one_process_loads_in_the_next_without_tracing(store):
    traces: list = []
    salt = _salt()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = _stored_jit(salt, traces)
    np.testing.assert_allclose(first(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
    files = sorted(p.name for p in store.iterdir())
    assert len(files) == 1 and files[0].startswith("scaled-") and files[0].endswith(".exe")
    assert traces == [(2, 3)]

    second = _stored_jit(salt, traces)  # nothing in memory: what a new process has
    np.testing.assert_allclose(second(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
    assert traces == [(2, 3)]  # loaded, not traced
    assert sorted(p.name for p in store.iterdir()) == files


def test_each_shape_static_argument_and_identity_is_its_own_program(store):
    traces: list = []
    salt = _salt()
    x = np.ones((2, 3), np.float32)
    _stored_jit(salt, traces)(2.0, x)
    _stored_jit(salt, traces)(2.0, np.ones((4, 3), np.float32))  # another shape
    _stored_jit(salt, traces)(3.0, x)  # another static argument
    _stored_jit(salt, traces)(2.0, x.astype(np.int32))  # another dtype
    other_model = _stored_jit(salt, traces, identity="model B")  # e.g. another graph
    np.testing.assert_allclose(other_model(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
    assert len(traces) == 5
    assert len(list(store.iterdir())) == 5
    _stored_jit(salt, traces)(3.0, x)  # found
    assert len(traces) == 5


def test_two_functions_of_one_name_are_two_programs(store):
    """The disk key holds where a function is defined and its code, not its name alone: two
    functions named alike with one signature each run their own program, two lambdas on one
    line too, and one lambda made with two default values."""
    salt = _salt()
    x = np.arange(4, dtype=np.float32)

    def make(offset):
        if offset:
            def f(y):
                return y * salt - 100
        else:
            def f(y):
                return y * salt
        return f

    np.testing.assert_allclose(stored.StoredJit(make(0))(x), x * salt)
    np.testing.assert_allclose(stored.StoredJit(make(1))(x), x * salt - 100)
    np.testing.assert_allclose(stored.StoredJit(lambda y: y + salt)(x), x + salt)
    np.testing.assert_allclose(stored.StoredJit(lambda y: y - salt)(x), x - salt)
    assert len(list(store.iterdir())) == 4
    double, halve = stored.StoredJit(lambda y: y * 2), stored.StoredJit(lambda y: y / 2)
    np.testing.assert_allclose(double(x), x * 2)
    np.testing.assert_allclose(halve(x), x / 2)  # not the program stored for `double`
    assert len(list(store.iterdir())) == 6
    adders = [stored.StoredJit(lambda y, k=k: y + k) for k in (1.0, 100.0)]
    np.testing.assert_allclose(adders[1](x), x + 100.0)  # after k=1.0's: its own program
    np.testing.assert_allclose(adders[0](x), x + 1.0)


def test_a_damaged_file_is_removed_and_the_program_compiled_again(store, caplog):
    traces: list = []
    salt = _salt()
    x = np.ones((2, 2), np.float32)
    _stored_jit(salt, traces)(2.0, x)
    (path,) = store.iterdir()
    path.write_bytes(path.read_bytes()[:1000])  # truncated, as by a full disk
    with caplog.at_level(logging.WARNING, logger="transformer.stored"):
        out = _stored_jit(salt, traces)(2.0, x)
    np.testing.assert_allclose(out, x * 2.0 * salt + 1, rtol=1e-6)
    assert len(traces) == 2
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "compiling the program again" in \
        record.getMessage()


def test_a_damaged_file_that_cannot_be_removed_is_left_and_the_program_compiled(
        store, caplog, monkeypatch):
    """A read-only directory, or another user's file: the call still answers, and the
    warning does not claim the file was removed."""
    traces: list = []
    salt = _salt()
    x = np.ones((2, 5), np.float32)
    _stored_jit(salt, traces)(2.0, x)
    (path,) = store.iterdir()
    path.write_bytes(path.read_bytes()[:1000])

    def read_only(self, **_):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(type(path), "unlink", read_only)
    with caplog.at_level(logging.WARNING, logger="transformer.stored"):
        out = _stored_jit(salt, traces)(2.0, x)
    np.testing.assert_allclose(out, x * 2.0 * salt + 1, rtol=1e-6)
    assert len(traces) == 2
    (record,) = [r for r in caplog.records if str(path) in r.getMessage()]
    message = record.getMessage()
    assert "could not remove it (Read-only file system)" in message
    assert "compiling the program in memory" in message and "removed it" not in message


def test_a_full_disk_is_said_once_and_the_programs_still_run(store, caplog, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(stored, "write_atomically", full)
    monkeypatch.setattr(stored, "_told_disk_full", False)
    traces: list = []
    salt = _salt()
    with caplog.at_level(logging.WARNING, logger="transformer.stored"):
        for width in (2, 3, 4):
            x = np.ones(width, np.float32)
            np.testing.assert_allclose(_stored_jit(salt, traces)(2.0, x), x * 2.0 * salt + 1,
                                       rtol=1e-6)
    assert len(traces) == 3 and not list(store.glob("*.exe"))
    (record,) = caplog.records
    assert f"not stored in {store}: No space left on device" in record.getMessage()
    assert "free some space" in record.getMessage()


def test_a_program_served_by_the_compilation_cache_is_compiled_afresh_to_be_stored(
        store, monkeypatch):
    """XLA:CPU writes an executable that JAX's persistent cache served without some of its
    kernels (it loads, then fails to run), so such a program is compiled again, past the
    cache, before it is stored. The cache's answer is played here by JAX's own event."""
    real_compile = jax.stages.Lowered.compile
    options_seen = []

    def compile_as_served(lowered, compiler_options=None, **kwargs):
        options_seen.append(compiler_options)
        if compiler_options is None:
            jax.monitoring.record_event("/jax/compilation_cache/cache_hits")
        return real_compile(lowered, compiler_options=compiler_options, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_as_served)
    traces: list = []
    salt = _salt()
    x = np.ones(3, np.float32)
    np.testing.assert_allclose(_stored_jit(salt, traces)(2.0, x), x * 2.0 * salt + 1,
                               rtol=1e-6)
    assert options_seen[0] is None and options_seen[1]  # served, then compiled with options
    assert len(list(store.iterdir())) == 1
    monkeypatch.setattr(jax.stages.Lowered, "compile", real_compile)
    np.testing.assert_allclose(_stored_jit(salt, traces)(2.0, x), x * 2.0 * salt + 1,
                               rtol=1e-6)
    assert len(traces) == 1  # the second loaded the stored program


def test_without_a_directory_it_is_jax_jit(store):
    traces: list = []
    salt = _salt()
    x = jnp.ones((2, 2), jnp.float32)
    stored.keep_programs_in(None)
    jitted = _stored_jit(salt, traces)
    np.testing.assert_allclose(jitted(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
    assert jitted.programs() == 1 and not store.exists()


def test_arguments_on_another_device_or_sharded_take_jax_jit():
    """A stored executable runs on the default device; training's replicated parameters
    (a mesh of devices) are searched by jit as before."""
    class Placed:
        def __init__(self, devices):
            self.sharding = type("Sharding", (), {"device_set": set(devices)})()

    default = jax.devices()[0]
    assert stored._single_device([np.ones(2), jnp.ones(2), 3, Placed([default])])
    assert not stored._single_device([jnp.ones(2), Placed(["another device"])])
    assert not stored._single_device([Placed([default, "another device"])])


def test_donated_arguments_stay_donated(store):
    """The search loop donates its state; a stored executable must not copy it every step.
    Only its first run in a process takes copies (to fall back on if it cannot run)."""
    salt = _salt()

    def step(state):
        return state + salt

    stepping = stored.StoredJit(step, donate_argnums=(0,))
    state = jnp.zeros(4, jnp.float32)
    new = stepping(state)
    assert state.is_deleted() and np.all(np.asarray(new) == salt)
    assert len(list(store.iterdir())) == 1
    loaded = stored.StoredJit(step, donate_argnums=(0,))
    proven = loaded(new)  # loaded from the file, first run: on a copy
    assert not new.is_deleted() and np.all(np.asarray(proven) == 2 * salt)
    again = loaded(proven)
    assert proven.is_deleted() and np.all(np.asarray(again) == 3 * salt)


def test_a_stored_program_that_fails_to_run_is_removed_and_compiled_again(store, monkeypatch,
                                                                         caplog):
    """As XLA:CPU's executables re-serialized after a cache hit did ("Function ... not
    found" at their first run): the call still answers, by a program compiled anew."""
    from jax.experimental import serialize_executable

    traces: list = []
    salt = _salt()
    x = np.ones((3,), np.float32)
    _stored_jit(salt, traces)(2.0, x)
    (path,) = store.iterdir()

    def broken(*_):
        raise jax.errors.JaxRuntimeError("INTERNAL: Function wrapped_iota.4 not found")

    monkeypatch.setattr(serialize_executable, "deserialize_and_load", lambda *_, **__: broken)
    with caplog.at_level(logging.WARNING, logger="transformer.stored"):
        jitted = _stored_jit(salt, traces)
        np.testing.assert_allclose(jitted(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
        np.testing.assert_allclose(jitted(2.0, x), x * 2.0 * salt + 1, rtol=1e-6)
    assert len(traces) == 2  # compiled again once, then jit's own program
    assert not path.exists()
    (record,) = caplog.records
    assert str(path) in record.getMessage() and "wrapped_iota" in record.getMessage()


def test_the_directory_keeps_under_its_size_the_programs_used_last(store):
    """A load touches its file; a write prunes the least recently used beyond the bound."""
    traces: list = []
    salt = _salt()
    x = np.ones((2, 3), np.float32)
    _stored_jit(salt, traces)(1.0, x)
    _stored_jit(salt, traces)(2.0, x)
    first, second = sorted(store.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    size = first.stat().st_size
    os.utime(first, (1_000, 1_000))  # both used long ago, the first program longest ago
    os.utime(second, (2_000, 2_000))
    _stored_jit(salt, traces)(1.0, x)  # a new process loads the first program: now the newest
    assert first.stat().st_mtime > second.stat().st_mtime
    assert len(traces) == 2  # loaded, not traced

    stored.keep_programs_in(store, max_bytes=int(2.5 * size))
    _stored_jit(salt, traces)(3.0, x)  # a third program is written: only two fit
    kept = set(store.iterdir())
    assert len(kept) == 2 and first in kept and second not in kept

    with pytest.raises(ValueError, match="max_bytes"):
        stored.keep_programs_in(store, max_bytes=0)
