"""Several processes, one run: a fault on one of them ends every one promptly, in one line.

Each test starts two local processes that meet through JAX's distributed runtime (gloo
collectives on the CPU): tiny models, a few steps, and a bounded wait for every process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SHALLOW_FLAGS, xla_flags

from nmt.rundir.checkpoints import CHECKSUMS_FILE
from synthetic_corpus import write_corpus

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ended(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    """(exit status, last stderr line) of a process that must end within `timeout` s."""
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"still running after {timeout} s: {err[-2000:]}")
    lines = [line for line in err.splitlines() if line.strip()]
    return process.returncode, lines[-1] if lines else ""


def _all_ended(processes: list[subprocess.Popen], timeout: float = 120
               ) -> list[tuple[int, str]]:
    """`_ended` of each process; none is left running, whatever fails (a failure says how
    the processes before the one still running ended)."""
    ended: list[tuple[int, str]] = []
    try:
        for process in processes:
            try:
                ended.append(_ended(process, timeout))
            except pytest.fail.Exception as err:
                pytest.fail(f"process {len(ended)}: {err}; before it: {ended}")
        return ended
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


# A process that fails publishes its line; the other, waiting at a barrier, ends with it.
BARRIER_WORKER = """
import os, sys
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
from nmt.runtime.distributed import PeerFailed, barrier, end_after_failure
barrier("started")
if jax.process_index() == 1:
    end_after_failure("RUN/spm.model: not found", 1)
try:
    barrier("tokenizer")
except PeerFailed as err:
    print(err, file=sys.stderr, flush=True)
    end_after_failure(str(err), 1)
"""


def test_a_process_that_fails_ends_the_wait_of_the_others(env):
    coordinator = f"127.0.0.1:{_free_port()}"
    env = {**env, "JAX_PLATFORMS": "cpu"}
    processes = [_start([sys.executable, "-c", BARRIER_WORKER, coordinator, str(k)], env)
                 for k in range(PROCESSES)]
    began = time.monotonic()
    (status0, line0), (status1, _) = _all_ended(processes, timeout=90)
    assert (status0, status1) == (1, 1)
    assert line0 == ("process 1 of 2 failed: RUN/spm.model: not found; fix it and start all "
                     "processes again")
    assert time.monotonic() - began < 60


# Process 1 waits at a barrier that process 0 reaches late, as while process 0 reads the corpus.
STARTING_WORKER = """
import sys, time
from pathlib import Path
from nmt.runtime import cli
from nmt.runtime.distributed import (PeerFailed, barrier, end_after_failure,
                                     initialize_distributed)

def main():
    initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))
    barrier("started")
    if sys.argv[2] == "1":
        Path(sys.argv[3]).touch()
    else:  # late: until process 1 has ended (the test says so), or 60 s
        deadline = time.monotonic() + 60
        while not Path(sys.argv[4]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    barrier("corpus read")  # process 1 set its key here before the signal: both pass
    try:
        barrier("tokenizer")
    except PeerFailed as err:
        raise cli.Fault(str(err)) from None
    return 0

sys.exit(cli.guarded("worker", main, end_after_failure))
"""


def test_sigterm_while_starting_ends_the_process_at_once(tmp_path, env):
    """JAX's preemption notifier catches SIGTERM: the process waited on at the barrier."""
    coordinator, waiting = f"127.0.0.1:{_free_port()}", tmp_path / "waiting"
    ended = tmp_path / "ended"
    env = {**env, "JAX_PLATFORMS": "cpu"}
    processes = [_start([sys.executable, "-c", STARTING_WORKER, coordinator, str(k),
                         str(waiting), str(ended)], env)
                 for k in range(PROCESSES)]
    try:
        deadline = time.monotonic() + 60
        while not waiting.exists():
            assert time.monotonic() < deadline and processes[1].poll() is None, processes
            time.sleep(0.1)
        os.kill(processes[1].pid, signal.SIGTERM)
        (status1, line1) = _ended(processes[1], timeout=5)
    finally:
        ended.touch()
        (status0, line0), _ = _all_ended(processes, timeout=30)
    assert (status1, line1) == (143, "worker: terminated (SIGTERM)")
    assert (status0, line0) == (1, "worker: error: process 1 of 2 failed: terminated (SIGTERM); "
                                   "fix it and start all processes again")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("corpus")
    return ["--train-prefix", write_corpus(root, 200, 0, "train"),
            "--valid-prefix", write_corpus(root, 20, 1, "valid")]


def _train(run: Path, corpus: list[str], process: int, port: int, env, *extra: str,
           cwd: Path = ROOT):
    return _start([sys.executable, str(ROOT / "train.py"), "--preset", "tiny", *SHALLOW_FLAGS,
                   *corpus, "--vocab-size", "320", "--batch-tokens", "256", "--buckets", "16",
                   "--max-tokens-per-sentence", "16", "--warmup", "20", "--eval-sentences", "0",
                   "--output-dir", str(run), "--coordinator", f"127.0.0.1:{port}",
                   "--num-processes", str(PROCESSES), "--process-id", str(process), *extra],
                  env, cwd)


def test_processes_given_different_settings_are_refused(corpus, tmp_path, env):
    port = _free_port()
    processes = [_train(tmp_path / "run", corpus, k, port, env, "--max-steps", str(steps))
                 for k, steps in enumerate((30, 20))]
    for status, line in _all_ended(processes):
        assert status == 2, line
        assert line == ("train.py: error: the processes were given different settings: "
                        "--max-steps is 30 on process 0, 20 on process 1; give every process "
                        "the same flags and recipe, and start them again.")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_processes_given_different_process_counts_are_refused_by_name(corpus, tmp_path, env):
    """Process 1 told of 3 processes, process 0 of 2: JAX starts both, and each would wait an
    hour for the other at the first barrier."""
    port = _free_port()
    processes = [_train(tmp_path / "run", corpus, k, port, env, "--max-steps", "4",
                        "--num-processes", str(count))
                 for k, count in enumerate((2, 3))]
    began = time.monotonic()
    ended = _all_ended(processes, timeout=90)
    assert [status for status, _ in ended] == [2, 2], ended
    for _, line in ended:
        assert line.startswith("train.py: error: "), line
        assert "--num-processes is " in line and line.endswith(
            "give every process the same --num-processes and --coordinator, and start them "
            "again"), line
    assert time.monotonic() - began < 60


def test_processes_with_different_device_counts_are_refused_by_name(corpus, tmp_path, env):
    """Process 0 with one CPU device, process 1 with two: batches are split evenly over each
    process's devices, and the run used to end in a checkpoint's collective with a reshape
    error naming neither."""
    port = _free_port()
    processes = [_train(tmp_path / "run", corpus, k, port,
                        {**env, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices)},
                        "--max-steps", "4")
                 for k, devices in enumerate((1, 2))]
    began = time.monotonic()
    ended = _all_ended(processes, timeout=90)
    fix = ("give every process the same number of devices (CUDA_VISIBLE_DEVICES on GPUs, "
           "--xla_force_host_platform_device_count in XLA_FLAGS on CPUs), and start them again")
    assert ended == [
        (2, f"train.py: error: process 0 has 1 device, process 1 has 2 devices; {fix}"),
        (2, f"train.py: error: process 1 has 2 devices, process 0 has 1 device; {fix}")]
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert time.monotonic() - began < 60


def test_average_only_on_some_processes_is_refused_by_name(corpus, tmp_path, env):
    port = _free_port()
    processes = [_train(tmp_path / "run", corpus, k, port, env, "--max-steps", "6",
                        "--average-last", "2", *extra)
                 for k, extra in enumerate((["--average-only"], []))]
    for status, line in _all_ended(processes):
        assert status == 2, line
        assert line == ("train.py: error: the processes were given different settings: "
                        "--average-only is true on process 0, false on process 1; give every "
                        "process the same flags and recipe, and start them again.")


def test_average_only_with_several_processes_writes_the_average(corpus, tmp_path, env):
    """Process 0 holds the run directory's lock (as in training) and writes averaged/; the
    others read the checkpoints with it."""
    run, flags = tmp_path / "run", ["--max-steps", "4", "--eval-every", "2"]
    port = _free_port()
    trained = _all_ended([_train(run, corpus, k, port, env, *flags) for k in range(PROCESSES)])
    assert [status for status, _ in trained] == [0, 0], trained
    port = _free_port()
    processes = [_train(run, corpus, k, port, env, *flags, "--average-only", "--average-last",
                        "2") for k in range(PROCESSES)]
    ended = _all_ended(processes, timeout=90)
    assert [status for status, _ in ended] == [0, 0], ended
    assert (run / "averaged" / "config.json").is_file()


def test_processes_without_a_shared_run_directory_end_in_one_line_each(corpus, tmp_path,
                                                                        env):
    """--output-dir run from two working directories: the same setting, two directories, as
    on hosts that do not share the file system. Process 1 finds no tokenizer; process 0,
    waiting for it, ends with its line."""
    port = _free_port()
    places = [tmp_path / name for name in ("host0", "host1")]
    processes = []
    for k, place in enumerate(places):
        place.mkdir()
        processes.append(_train(Path("run"), corpus, k, port, env, "--max-steps", "5",
                                cwd=place))
    began = time.monotonic()
    (status0, line0), (status1, line1) = _all_ended(processes)
    missing = (f"{places[1] / 'run'} holds no tokenizer after process 0 wrote one there: "
               "every process needs the same run directory, on a file system they share "
               "(--output-dir)")
    assert (status1, line1) == (2, f"train.py: error: {missing}")
    assert (status0, line0) == (1, f"train.py: error: process 1 of 2 failed: {missing}; fix it "
                                   "and start all processes again")
    assert time.monotonic() - began < 60


def test_a_process_killed_mid_run_ends_the_other_at_once(corpus, tmp_path, env):
    """kill -9 of process 1 after the checkpoint of step 5: process 0 names it and ends."""
    run = tmp_path / "run"
    processes = _past_checkpoint_5(run, corpus, env)
    try:
        os.kill(processes[1].pid, signal.SIGKILL)
        killed = time.monotonic()
    finally:
        (status, line), _ = _all_ended(processes, timeout=60)
    assert status == 1, line
    assert line.startswith("train.py: error: another process of the run died or lost its "
                           "connection (")
    assert "the last intact checkpoint is step " in line and str(run / "checkpoints") in line
    assert line.endswith("start all processes again with the same command to resume from it")
    assert time.monotonic() - killed < 30


def _past_checkpoint_5(run: Path, corpus, env) -> list[subprocess.Popen]:
    """The processes of a long run, once its checkpoint of step 5 is sealed (none left
    running if it never comes). Saved without validating, and before the processes' first
    agreement on stopping (step 10), which a signal then needs to wait for only once."""
    port = _free_port()
    processes = [_train(run, corpus, k, port, env, "--max-steps", "100000",
                        "--save-every", "5", "--eval-every", "100000")
                 for k in range(PROCESSES)]
    deadline = time.monotonic() + 120
    try:
        while not (run / "checkpoints" / "5" / CHECKSUMS_FILE).exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, processes
            time.sleep(0.2)
    except BaseException:
        _all_ended(processes, timeout=60)
        raise
    return processes


@pytest.mark.parametrize("victim", [0, 1])
def test_sigterm_to_one_process_stops_every_process_saving(corpus, tmp_path, env, victim):
    """SIGTERM to one process only: all agree on the reason, save the same checkpoint and
    exit 143, as one process would."""
    run = tmp_path / "run"
    processes = _past_checkpoint_5(run, corpus, env)
    try:
        os.kill(processes[victim].pid, signal.SIGTERM)
    finally:
        ended = _all_ended(processes, timeout=90)
    assert [status for status, _ in ended] == [143, 143], ended
    # The stop's checkpoint: of the step where the processes next agree (10, or a later one
    # on a loaded machine); complete.
    saved = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert max(saved) > 5, saved  # a checkpoint of its own, not step 5's
    assert (run / "checkpoints" / str(max(saved)) / CHECKSUMS_FILE).exists()


# ----------------------------------------------------------------- the store, without processes


class _Store:
    """The distributed runtime client's key-value calls that the failure relay uses."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str) -> None:
        self.values[key] = value

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        return [(key, value) for key, value in self.values.items() if key.startswith(prefix)]


@pytest.fixture
def store(monkeypatch) -> _Store:
    """Process 1 of 12, its runtime's store in memory, and no failure relayed yet."""
    from nmt.runtime import distributed

    held = _Store()
    monkeypatch.setattr(distributed, "_client", lambda: held)
    monkeypatch.setattr(distributed, "_processes", lambda: (1, 12))
    monkeypatch.setattr(distributed, "_relaying", False)
    monkeypatch.setattr(distributed, "_exit_now", lambda status: None)
    return held


def test_a_process_that_relays_a_failure_publishes_no_echo_of_it(store):
    from nmt.runtime import distributed

    distributed.end_after_failure("RUN/spm.model: not found", 1)  # its own failure
    assert store.values == {"nmt/failed/1": "RUN/spm.model: not found"}
    store.values.clear()
    relayed = distributed.PeerFailed("process 2 of 12 failed: RUN/spm.model: not found")
    distributed.end_after_failure(str(relayed), 1)
    assert store.values == {}


def test_the_failure_named_is_the_lowest_process_that_published_in_number_order(store):
    from nmt.runtime import distributed

    store.values.update({"nmt/failed/10": "ten", "nmt/failed/2": "two", "nmt/failed/1": "me"})
    assert distributed.peer_failure() == "process 2 of 12 failed: two; fix it and start all " \
                                         "processes again"


def test_the_resume_command_of_several_processes_joins_them(monkeypatch):
    from nmt.training import summary

    monkeypatch.setattr(summary.jax, "process_count", lambda: 2)
    monkeypatch.setattr(summary, "coordinator_address", lambda: "host0:1234")
    assert summary.resume_command(Path("run")) == (
        "on each process K (0 to 1): python train.py --config run/config.yaml --output-dir run "
        "--resume --coordinator host0:1234 --num-processes 2 --process-id K")


@pytest.mark.parametrize("host", ["127.0.0.1", "nosuchhost.invalid"])
def test_a_coordinator_that_never_answers_is_named_in_bounded_time(monkeypatch, caplog, host):
    """Process 1 checks that something answers at --coordinator before JAX waits there in
    silence (5 minutes, then a C++ abort)."""
    from nmt.runtime import distributed

    def initialize(**kwargs):
        raise AssertionError("JAX was left to wait")

    monkeypatch.setattr(distributed, "CONNECT_LIMIT_S", 2)
    monkeypatch.setattr(distributed.jax.distributed, "initialize", initialize)
    coordinator = f"{host}:{_free_port()}"  # nothing listens there
    began = time.monotonic()
    with caplog.at_level("INFO"), pytest.raises(ValueError) as raised:
        distributed.initialize_distributed(coordinator, 2, 1)
    assert time.monotonic() - began < 10
    assert f"connecting to {coordinator} (waiting up to 2 s)" in caplog.messages
    said = {"127.0.0.1": "nothing answered there in 2 s (Connection refused); start process 0 "
                         "with the same --coordinator, or give its address and port",
            "nosuchhost.invalid": "no host nosuchhost.invalid is known (Name or service not "
                                  "known); give process 0's address and port, the same on "
                                  "every process"}[host]
    assert str(raised.value) == f"--coordinator {coordinator}: {said}"


def test_processes_that_never_all_connect_end_in_one_line_in_bounded_time(tmp_path):
    """Process 0 told of a process that never comes (another --num-processes on it, or one
    never started) waits inside JAX's connect, which no signal ends and whose own limit
    aborts with a C++ stack trace: at the limit the process ends with one line instead."""
    coordinator = f"127.0.0.1:{_free_port()}"
    script = ("from nmt.runtime import distributed\n"
              "distributed.CONNECT_LIMIT_S = 3\n"
              f"distributed.initialize_distributed({coordinator!r}, 2, 0)\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert (done.returncode, len(lines)) == (2, 1), done.stderr[-3000:]
    assert lines[0].endswith(
        f"error: not all 2 processes connected to {coordinator} within 3 s: start all 2 "
        "processes, each with the same --num-processes and --coordinator (and a --process-id "
        "of its own), and check that they can reach each other"), lines[0]
    assert time.monotonic() - began < 60
