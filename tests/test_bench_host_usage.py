"""bench.host_usage as time(1): a Ctrl-C to the terminal's process group reaches the command,
which stops in its own way, and the record is still written with the command's status; a
SIGTERM sent to bench.host_usage alone is passed on to the command. A share of nothing is
null, and a command or output directory that is not there is one line."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench import host_usage

# Saves on SIGINT or SIGTERM (as train.py does) once it has said it is ready.
CHILD = """
import signal, sys, time
def stop(number, frame):
    open(sys.argv[1], "w").write(signal.Signals(number).name)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2], "w").write("ready")
time.sleep(10)
"""


@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM to it alone"])
def test_an_interrupt_reaches_the_command_and_the_record_is_written(tmp_path, how):
    out, saved, ready = tmp_path / "out.json", tmp_path / "saved", tmp_path / "ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.host_usage", str(out), "--", sys.executable, "-c",
         CHILD, str(saved), str(ready)],
        start_new_session=True, stderr=subprocess.PIPE, text=True,
        cwd=host_usage.Path(host_usage.__file__).parents[1])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if how.startswith("SIGINT"):
            os.killpg(process.pid, signal.SIGINT)
        else:
            os.kill(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    assert saved.read_text() == how.split()[0]
    assert json.loads(out.read_text())["status"] == 130
    assert "Traceback" not in err


def test_no_share_of_nothing(tmp_path):
    record = host_usage.measure(["sh", "-c", "kill -9 $$"])
    assert record["status"] == 137 and record["system_over_user"] is None


@pytest.mark.parametrize("case, status", [("command", 127), ("directory", 2)])
def test_what_is_not_there_is_one_line(tmp_path, capsys, case, status):
    out = tmp_path / ("missing/out.json" if case == "directory" else "out.json")
    command = str(tmp_path / "missing-command") if case == "command" else "true"
    assert host_usage.main([str(out), "--", command]) == status
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("host_usage.py: error: ") and not out.exists()


def test_an_output_that_cannot_be_written_is_refused_before_the_command_runs(tmp_path, capsys):
    out = tmp_path / "out.json"
    out.mkdir()  # a directory where the record would go
    ran = tmp_path / "ran"
    assert host_usage.main([str(out), "--", "touch", str(ran)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "OUT.json" in line and str(out) in line and "Is a directory" in line
    assert not ran.exists()
