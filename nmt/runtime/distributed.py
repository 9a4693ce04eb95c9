"""Several processes, one run: starting JAX's distributed runtime and small collectives.

Every process runs the same program; `initialize_distributed` must come before anything
touches a JAX device. With one process every helper here is a no-op or the identity.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

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
    otherwise JAX detects the cluster from the launcher's environment. Returns True if it ran.
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
    jax.distributed.initialize(**kwargs)
    return True


def any_process(flag: bool) -> bool:
    """True if `flag` is True on any process (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return flag
    return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


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
