"""bench.serve's figures: each alternating round's load is set against the ceiling pass of
its own round (a machine whose speed moves between rounds moves both sides), and the calls
that bound a server are what they say (a share of the clients each; sorted: one length)."""

import argparse
import asyncio
import os
import signal
import sys
import threading
import time

import pytest

from bench import serve
from bench.serve import against_ceiling


def test_each_round_is_divided_by_its_own_ceiling_pass():
    rows = [{"clients": 8, "sent_per_s": 100.0}, {"clients": 32, "sent_per_s": 150.0},
            {"clients": 8, "sent_per_s": 60.0}, {"clients": 32, "sent_per_s": 90.0},
            {"clients": 8, "sent_per_s": 80.0}, {"clients": 32, "sent_per_s": 160.0}]
    passes = [{"sent_per_s": 200.0}, {"sent_per_s": 100.0}, {"sent_per_s": 200.0}]
    summary = against_ceiling(rows, passes, [8, 32])
    assert [s["clients"] for s in summary] == [8, 32]
    assert summary[0]["ratios"] == [0.5, 0.6, 0.4] and summary[0]["ratio"] == 0.5
    assert summary[1]["ratios"] == [0.75, 0.9, 0.8] and summary[1]["ratio"] == 0.8
    assert summary[0]["sent_per_s"] == 80.0 and summary[1]["sent_per_s"] == 150.0


class _Tokenizer:
    def encode(self, sentences):
        return [sentence.split() for sentence in sentences]


class _Translator:
    """Records the calls each translator (thread) is given."""

    calls: list[list[str]] = []

    def __init__(self, *args, **kwargs):
        pass

    def warm_up(self):
        pass

    def translate_nbest(self, sentences):
        _Translator.calls.append(list(sentences))
        return [[None]] * len(sentences)


@pytest.mark.parametrize("by_length", [False, True])
def test_calls_hold_a_share_of_the_clients_and_sorted_calls_one_length_each(monkeypatch,
                                                                            by_length):
    from nmt.models import translator

    monkeypatch.setattr(serve, "model_and_search", lambda args: (None, _Tokenizer(), None))
    monkeypatch.setattr(serve, "server_settings", lambda args: argparse.Namespace(
        batch_tokens=512, buckets=None, searches=2))
    monkeypatch.setattr(translator, "Translator", _Translator)
    _Translator.calls = []
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    sentences = [" ".join(["w"] * n) + f" {i}" for i, n in enumerate(lengths)]
    rows = serve.call_ceilings(argparse.Namespace(), sentences, [8], by_length=by_length)
    assert rows[0]["sentences_per_call"] == 4 and rows[0]["searches"] == 2
    calls = _Translator.calls
    assert sorted(s for call in calls for s in call) == sorted(sentences)
    assert all(len(call) == 4 for call in calls)
    spans = [max(len(s.split()) for s in call) - min(len(s.split()) for s in call)
             for call in calls]
    if by_length:
        # Each call is four neighbours in length order: here at most 2 tokens apart.
        assert max(spans) <= 2
    else:
        # In the test set's order: calls are consecutive sentences, lengths mixed.
        assert sorted(calls) == sorted(sentences[i:i + 4] for i in range(0, 16, 4))
        assert max(spans) >= 5


# A stand-in for `python -m nmt.serving`: writes its pid to $FAKE_PID, then as $FAKE_SERVER
# says refuses to start, hangs while "loading", or serves /health and /metrics (logging
# nothing, as --quiet) and exits with status 3 at the first POST.
FAKE_SERVER = """
import http.server, os, sys, time
open(os.environ["FAKE_PID"], "w").write(str(os.getpid()))
mode, port = os.environ["FAKE_SERVER"], int(sys.argv[sys.argv.index("--port") + 1])
if mode == "refuse":
    sys.exit("python -m nmt.serving: error: could not serve on 127.0.0.1: address in use")
if mode == "hang":
    time.sleep(20)
    sys.exit(0)
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b'{"status": "ok"}' if self.path == "/health" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        os._exit(3)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_server(monkeypatch, tmp_path):
    """Sets the stand-in's behaviour; the path its pid is written to."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(serve, "SERVER", [sys.executable, str(script)])
    monkeypatch.setenv("FAKE_PID", str(tmp_path / "pid"))

    def behave(mode: str):
        monkeypatch.setenv("FAKE_SERVER", mode)
        return tmp_path / "pid"
    return behave


def _gone(pid_file) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except ProcessLookupError:
        return True
    return False


def test_an_interrupt_during_start_up_stops_the_server(fake_server, monkeypatch):
    pid_file = fake_server("hang")
    waits = iter(range(20))

    def healthy(self):
        if next(waits) == 3:  # the server has started by now
            raise KeyboardInterrupt
        return False
    monkeypatch.setattr(serve.ServerProcess, "_healthy", healthy)
    with pytest.raises(KeyboardInterrupt):
        serve.ServerProcess([])
    assert _gone(pid_file)


def test_sigterm_during_start_up_stops_the_server_and_is_one_line(fake_server, capsys):
    pid_file = fake_server("hang")
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        with pytest.raises(SystemExit) as ended, serve.ending_in_one_line():
            serve.ServerProcess([])
    finally:
        timer.cancel()
    assert ended.value.code == 143 and _gone(pid_file)
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith(": error: terminated")


def test_a_server_that_cannot_start_gives_its_own_reason(fake_server):
    fake_server("refuse")
    with pytest.raises(serve.ServerStartError, match=r"^the server did not start: could not "
                                                     r"serve on 127.0.0.1: address in use$"):
        serve.ServerProcess([])


def test_a_server_that_exits_under_load_ends_each_client_once_and_the_run(fake_server):
    fake_server("serve quietly")  # ready without a line of log, as under --quiet
    for check in ("client", "load"):
        server = serve.ServerProcess([], start_timeout=30)
        try:
            if check == "client":
                errors: list[str] = []
                began = time.monotonic()
                asyncio.run(serve._client(server.port, ["Ein Mann."], 0, began + 10, "de",
                                          "en", [], errors))
                assert len(errors) == 1 and time.monotonic() - began < 5
            else:
                with pytest.raises(serve.ServerExited,
                                   match=r"^the server exited \(status 3\)"):
                    serve.load(server, ["Ein Mann."], 2, 10, "de", "en")
        finally:
            server.stop()


class _StillServer:
    def __init__(self, args):
        self.port = None

    def stop(self):
        return 0


class _NoWatch:
    def __init__(self, port, timeout):
        pass

    def stop(self):
        return 0.0


def test_hostile_bodies_carry_the_models_own_pair(run_dir, tmp_path, monkeypatch, capsys):
    """An en->de model (given as its run directory) gets en->de bodies: a keyed body is
    answered, not refused for a pair the server does not serve."""
    import json

    from bench import serve_hostile

    values = json.loads((run_dir / "model" / "config.json").read_text())
    values.update(source_lang="en", target_lang="de")
    (tmp_path / "ende" / "model").mkdir(parents=True)
    (tmp_path / "ende" / "model" / "config.json").write_text(json.dumps(values))
    pairs = []
    real_bodies = serve_hostile.bodies
    monkeypatch.setattr(serve_hostile, "bodies",
                        lambda *pair: pairs.append(pair) or real_bodies(*pair))
    monkeypatch.setattr(serve_hostile, "ServerProcess", _StillServer)
    monkeypatch.setattr(serve_hostile, "HealthWatch", _NoWatch)
    monkeypatch.setattr(serve_hostile, "post", lambda *args: (200, b""))
    monkeypatch.setattr(sys, "argv", ["serve_hostile.py", "--model", str(tmp_path / "ende"),
                                      "--cases", "form-fields"])
    serve_hostile.main()
    assert pairs[-1] == ("en", "de")  # (the parser builds them once more, for the names)


def test_startup_says_why_the_server_did_not_start(run_dir, tmp_path):
    """bench.startup's server timing ends with the server's own last line (here: a model
    directory without its parameters), and takes a run directory as the server does."""
    import json

    from bench import startup

    values = json.loads((run_dir / "model" / "config.json").read_text())
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text(json.dumps(values))
    with pytest.raises(SystemExit) as ended:
        startup.served(str(tmp_path / "run"), timeout=120)
    assert str(ended.value).startswith("the server at http://127.0.0.1:")
    assert "did not become ready: " in str(ended.value)
    assert str(tmp_path / "run") in str(ended.value).split("ready: ")[1]


def test_startup_times_a_run_directory_to_its_answer(run_dir):
    """Given a run directory (the model in model/), the answer is timed: the pair is read
    from the model directory, not from RUN/config.json after the server is ready."""
    from bench import startup

    # a few shapes to warm up, not the default's many: the timing is tested, not the compiling
    figures = startup.served(str(run_dir), timeout=120,
                             server_args=("--buckets", "16", "--batch-tokens", "64"))
    assert 0 < figures["ready_s"] <= figures["exit_s"]


def test_the_ceilings_seconds_and_sentences_per_second_are_of_the_same_median_pass():
    passes = [{"sentences": 120, "seconds": 4.0, "batch_tokens": 64, "sent_per_s": 30.0},
              {"sentences": 120, "seconds": 1.0, "batch_tokens": 64, "sent_per_s": 120.0},
              {"sentences": 120, "seconds": 2.0, "batch_tokens": 64, "sent_per_s": 60.0}]
    ceiling = serve.ceiling_summary(passes)
    assert (ceiling["seconds"], ceiling["sent_per_s"]) == (2.0, 60.0)
    assert ceiling["passes"] == [30.0, 120.0, 60.0] and ceiling["batch_tokens"] == 64
