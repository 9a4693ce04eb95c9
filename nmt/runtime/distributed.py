"""Several processes, one run: starting JAX's distributed runtime and small collectives.

Every process runs the same program; `initialize_distributed` must come before anything
touches a JAX device. With one process every helper here is a no-op or the identity.

Barriers and `gather` go through the key-value store of JAX's distributed runtime, not a
device collective: they wait in slices, so that a process that failed (`end_after_failure`
publishes its error line) ends the others' wait with that line, and a wait is bounded.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from nmt.runtime import cli

_CLUSTER_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS")


def _cluster_env_present() -> bool:
    """True when a launcher (SLURM, Open MPI, a multi-host TPU slice) started several processes."""
    if any(os.environ.get(name) for name in _CLUSTER_ENV):
        return True
    for count in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if int(os.environ.get(count, "1") or 1) > 1:
            return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([h for h in hosts.split(",") if h]) > 1


def check_process_flags(coordinator: str | None, num_processes: int | None,
                        process_id: int | None) -> None:
    """ValueError, naming the flag, for --coordinator/--num-processes/--process-id that
    `jax.distributed.initialize` would refuse with a message that names none of them."""
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"--num-processes must be >= 1, got {num_processes}")
    if process_id is not None and process_id < 0:
        raise ValueError(f"--process-id must be >= 0, got {process_id}")
    if None not in (num_processes, process_id) and process_id >= num_processes:
        raise ValueError(f"--process-id {process_id} is not below --num-processes "
                         f"{num_processes}; number the processes 0 to {num_processes - 1}")
    if coordinator is not None:
        host, _, port = coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--coordinator must be HOST:PORT (process 0's address and a free "
                             f"port, the same on every process), got {coordinator!r}")
    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if any(given) and not all(given) and not _cluster_env_present():
        raise ValueError("several processes need all three of --coordinator HOST:PORT (the "
                         "same on every process), --num-processes N and --process-id (0 to "
                         "N-1, one on each process); no launcher (SLURM, Open MPI, a TPU "
                         "slice) has set the missing ones")


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """Call `jax.distributed.initialize` when this is one of several processes.

    Must run before anything touches JAX devices. With explicit arguments they are passed on;
    otherwise JAX detects the cluster from the launcher's environment. Returns True if it ran
    (JAX's backend is then up); ValueError when nothing answers at --coordinator, or the
    processes were given different --num-processes or have different numbers of devices.
    """
    explicit = any(v is not None for v in (coordinator, num_processes, process_id))
    if not explicit and not _cluster_env_present():
        return False
    kwargs = {}
    if coordinator is not None:
        kwargs["coordinator_address"] = coordinator
    if num_processes is not None:
        kwargs["num_processes"] = num_processes
    if process_id is not None:
        kwargs["process_id"] = process_id
    place = coordinator or "the other processes (the launcher's coordinator)"
    logging.getLogger(__name__).info("connecting to %s (waiting up to %d s)", place,
                                     CONNECT_LIMIT_S)
    deadline = time.monotonic() + CONNECT_LIMIT_S
    if coordinator is not None and process_id:  # process 0 starts the coordinator
        _reach_coordinator(coordinator, deadline)
    watch = _end_in_one_line_at(deadline, place, num_processes)
    try:  # JAX's own limit comes later: at its limit it aborts with a C++ stack trace
        jax.distributed.initialize(
            **kwargs, initialization_timeout=int(deadline - time.monotonic()) + 30)
    finally:
        watch.cancel()
    cli.stop_on_sigterm()  # JAX's preemption notifier caught it: the waits never ended
    _same_process_count()
    _same_device_count()
    return True


CONNECT_LIMIT_S = 300  # how long a process waits for the others to start (JAX's default)


def _end_in_one_line_at(deadline: float, place: str, count: int | None) -> threading.Timer:
    """A timer that ends the process at `deadline` with one line (exit 2) while the processes
    are still meeting: one was not started, or was given another --num-processes or
    --coordinator, and the others wait for it inside JAX, whose connect cannot be
    interrupted."""
    every = f"all {count} processes" if count else "every process"
    line = (f"{os.path.basename(sys.argv[0]) or 'python'}: error: not {every} connected to "
            f"{place} within {CONNECT_LIMIT_S} s: start {every}, each with the same "
            "--num-processes and --coordinator (and a --process-id of its own), and check that "
            "they can reach each other")

    def expire() -> None:
        print(line, file=sys.stderr, flush=True)
        os._exit(cli.EXIT_USAGE)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
    timer.daemon = True
    timer.start()
    return timer


def _reach_coordinator(coordinator: str, deadline: float) -> None:
    """ValueError naming --coordinator when nothing answers at it by `deadline` (JAX would
    wait as long in silence, then abort with a C++ trace), or its host has no address."""
    host, _, port = coordinator.rpartition(":")
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return
        except socket.gaierror as err:
            if err.errno != socket.EAI_AGAIN:
                raise ValueError(f"--coordinator {coordinator}: no host {host} is known "
                                 f"({err.strerror}); give process 0's address and port, the "
                                 "same on every process") from None
            failure = err
        except OSError as err:
            failure = err
        if time.monotonic() + 1 > deadline:
            raise ValueError(
                f"--coordinator {coordinator}: nothing answered there in {CONNECT_LIMIT_S} s "
                f"({failure.strerror or failure}); start process 0 with the same --coordinator, "
                "or give its address and port")
        time.sleep(1)


COUNT_LIMIT_S = 120  # every process has connected when initialize returns: they come at once


def _same_process_count(limit_s: float = COUNT_LIMIT_S) -> None:
    """ValueError naming --num-processes when this process was given another count than
    process 0 (the others wait for a process that never comes); published and compared
    first, before any other wait."""
    me, count = _processes()
    differs = _first_other("processes", count, limit_s)
    if differs is not None:
        process, theirs = differs
        raise ValueError(
            f"--num-processes is {count} on process {me}, {theirs} on process {process}; "
            "give every process the same --num-processes and --coordinator, and start them "
            "again")


def _same_device_count(limit_s: float = COUNT_LIMIT_S) -> None:
    """ValueError when another process has another number of local devices: batches are
    split evenly over each process's devices, and a run that started so would fail later
    in a collective with a message that names neither the processes nor their devices."""
    cli.check_jax_platforms()  # starts the backend, or ends in its own line
    me, _ = _processes()
    mine = jax.local_device_count()
    differs = _first_other("devices", mine, limit_s)
    if differs is not None:
        process, theirs = differs
        raise ValueError(
            f"process {me} has {_devices(mine)}, process {process} has {_devices(theirs)}; "
            "give every process the same number of devices (CUDA_VISIBLE_DEVICES on GPUs, "
            "--xla_force_host_platform_device_count in XLA_FLAGS on CPUs), and start them "
            "again")


def _devices(count: int) -> str:
    return f"{count} device" + ("s" if count != 1 else "")


def _first_other(topic: str, mine: int, limit_s: float) -> tuple[int, int] | None:
    """(process, its value) of a process whose `topic` value differs from this one's `mine`,
    None when none does: process 0 compares with every other, the others with process 0."""
    client = _client()
    me, count = _processes()
    if client is None:
        return None
    client.key_value_set(f"{_PREFIX}/{topic}/{me}", str(mine))
    deadline = time.monotonic() + limit_s
    for process in range(1, count) if me == 0 else [0]:
        theirs = int(_read(client, f"{_PREFIX}/{topic}/{process}", process, count,
                           "the start", deadline, limit_s))
        if theirs != mine:
            return process, theirs
    return None


def max_over_processes(value: int) -> int:
    """The largest of every process's `value` (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return value
    return int(np.max(multihost_utils.process_allgather(np.array(value, np.int32))))


WAIT_LIMIT_S = 3600  # the longest wait for the slowest process: process 0 reads the corpus
_SLICE_MS = 1000  # how often a wait looks for another process's failure
_PREFIX = "nmt"  # this program's keys in the runtime's key-value store
_collectives = itertools.count()  # every process calls them in the same order


class PeerFailed(RuntimeError):
    """Another process of the run failed, or stopped answering; the message says which.

    A process that raises it only relays what went wrong elsewhere: `end_after_failure` then
    publishes nothing, so that a third process reads the failure itself, not an echo of it.
    """

    def __init__(self, message: str):
        super().__init__(message)
        global _relaying
        _relaying = True


_relaying = False  # this process raised PeerFailed: its error line is another's


def _client():
    """The distributed runtime's client, None before (or without) `initialize_distributed`."""
    from jax._src import distributed  # JAX exposes no public key-value store

    return distributed.global_state.client


def coordinator_address() -> str | None:
    """The HOST:PORT the processes met at (None with one process)."""
    from jax._src import distributed

    return distributed.global_state.coordinator_address


def _processes() -> tuple[int, int]:
    """(this process, how many), without starting a JAX backend."""
    from jax._src import distributed

    return distributed.global_state.process_id, distributed.global_state.num_processes


def gather(name: str, value: str, limit_s: float = WAIT_LIMIT_S) -> list[str]:
    """Every process's `value`, in process order (a collective: every process must call it).

    PeerFailed when another process published its failure, or has not come in `limit_s`.
    """
    client = _client()
    me, count = _processes()
    if client is None or count == 1:
        return [value]
    prefix = f"{_PREFIX}/{next(_collectives)}/"
    client.key_value_set(prefix + str(me), value)
    deadline = time.monotonic() + limit_s
    return [_read(client, prefix + str(process), process, count, name, deadline, limit_s)
            for process in range(count)]


def _read(client, key: str, process: int, count: int, name: str, deadline: float,
          limit_s: float) -> str:
    """The value `process` sets at `key`, waited for in slices (see `gather`)."""
    while True:
        try:
            return client.blocking_key_value_get(key, _SLICE_MS)
        except jax.errors.JaxRuntimeError as err:
            if "DEADLINE_EXCEEDED" not in str(err):
                raise PeerFailed(_lost(err)) from None
        if (failure := peer_failure()) is not None:
            raise PeerFailed(failure)
        if time.monotonic() > deadline:
            raise PeerFailed(
                f"process {process} of {count} has not reached '{name}' in {limit_s:.0f} "
                "s; it may be stuck or have died: stop all processes and start them again")


def barrier(name: str) -> None:
    """Wait until every process has reached the barrier `name` (see `gather`)."""
    names = gather(name, name)
    if len(set(names)) > 1:
        raise PeerFailed(f"the processes are out of step: at '{name}', others are at "
                         f"{sorted(set(names) - {name})}; stop all processes and start them "
                         "again")


def peer_failure() -> str | None:
    """The first error line another process published (`end_after_failure`), as what to
    say here; None when there is none (or the store cannot be read any more)."""
    client = _client()
    if client is None:
        return None
    me, count = _processes()
    try:
        published = client.key_value_dir_get(f"{_PREFIX}/failed/")
    except jax.errors.JaxRuntimeError:
        return None
    for process, line in sorted((int(key.rsplit("/", 1)[1]), line) for key, line in published):
        if process != me:
            return (f"process {process} of {count} failed: {line.rstrip('.')}; fix it and start "
                    "all processes again")
    return None


def _lost(err: Exception) -> str:
    brief = " ".join(str(err).split())[:200]
    return (f"lost the connection to the other processes ({brief}); process 0 (the "
            "coordinator) ended or died: see its output, then start all processes again")


def end_after_failure(line: str, status: int) -> None:
    """In a run of several processes, publish this process's error `line` for the others
    (waiting at a barrier, they end with it) and exit now with `status`: JAX's shutdown at
    exit waits for every process, which a failed or stuck one never joins. A process that
    only relays another's failure (`PeerFailed`) publishes nothing. Returns at once with one
    process."""
    client = _client()
    me, count = _processes()
    if client is None or count == 1:
        return
    if not _relaying:
        try:
            client.key_value_set(f"{_PREFIX}/failed/{me}", line)
            if me == 0:  # the store lives in this process: give the others time to read it
                time.sleep(2 * _SLICE_MS / 1000)
        except jax.errors.JaxRuntimeError:
            pass
    _exit_now(status)


def _exit_now(status: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def local_copy(tree: Any) -> Any:
    """This process's copy of replicated arrays, as single-device jax.Arrays.

    Unlike device_get, this works on several processes, where a global array is not fully
    addressable; the result can be used in computations local to this process (search).
    """
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x.addressable_data(0)
        return jnp.asarray(x)

    return jax.tree.map(one, tree)
