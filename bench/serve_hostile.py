"""The server against bodies built to stall it: `python -m bench.serve_hostile --model M`.

Starts `python -m nmt.serving` on 127.0.0.1 (with --api-keys, so that every body is also a
request without a key) and sends, one at a time, the bodies below that fit its default 1 MiB
limit, in the language pair recorded with the model (another pair is refused with 400). For
each it prints the answer's status, the seconds until it came, and the longest wait for
`GET /health` while it was being handled (asked every 50 ms from another connection): how
long one request held up everyone else.

    form-fields              349,000 urlencoded fields `q=&` (one 1 MiB body), with the key
    form-fields-no-key       the same without a key
    form-fields-100k-no-key  100,000 of them, without a key
    empty-texts              {"q": ["", "", ...]} with 260,000 empty texts, with the key
    deep-lists               q nested 100,000 lists deep
"""

from __future__ import annotations

import http.client
import json
import tempfile
import threading
import time
from pathlib import Path

from bench.common import bench_parser, model_pair, positive_float, usage_errors
from bench.serve import ServerProcess, ServerStartError, ending_in_one_line

KEY = "bench-key-0123456789"


def bodies(source: str, target: str) -> dict[str, tuple[str, bytes]]:
    """Case name -> (content type, body)."""
    form = "application/x-www-form-urlencoded"
    pair = f"source={source}&target={target}&".encode()
    keyed = pair + f"api_key={KEY}&".encode()
    return {
        "form-fields": (form, keyed + b"q=&" * 349_000),
        "form-fields-no-key": (form, pair + b"q=&" * 349_000),
        "form-fields-100k-no-key": (form, pair + b"q=&" * 100_000),
        "empty-texts": ("application/json", json.dumps(
            {"q": [""] * 260_000, "source": source, "target": target, "api_key": KEY}).encode()),
        "deep-lists": ("application/json", b'{"q": ' + b"[" * 100_000 + b"]" * 100_000
                       + f', "source": "{source}", "target": "{target}"}}'.encode()),
    }


def post(port: int, content_type: str, body: bytes, timeout: float) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/translate", body=body, headers={
            "Content-Type": content_type})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class HealthWatch:
    """Asks /health every 50 ms from its own thread until `stop`; `longest()` is the
    longest wait for an answer, one still open counted up to now."""

    def __init__(self, port: int, timeout: float):
        self.port, self.timeout = port, timeout
        self.waits: list[float] = []
        self.asking_since: float | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.asking_since = time.monotonic()
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                connection.request("GET", "/health")
                connection.getresponse().read()
            except OSError:
                pass
            finally:
                connection.close()
            self.waits.append(time.monotonic() - self.asking_since)
            self.asking_since = None
            time.sleep(0.05)

    def stop(self) -> float:
        """Stops asking; the longest wait."""
        self._stop.set()
        since = self.asking_since
        open_wait = [time.monotonic() - since] if since is not None else []
        return max(self.waits + open_wait, default=0.0)


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model directory to serve")
    parser.add_argument("--cases", nargs="+", choices=list(bodies("", "")),
                        help="cases to send (default: all)")
    parser.add_argument("--timeout", type=positive_float, default=600,
                        help="seconds to wait for each answer (default 600)")
    parser.add_argument("--server-flags", default="",
                        help="more flags for python -m nmt.serving, as one string")
    args = parser.parse_args()
    with (ending_in_one_line(), usage_errors(ServerStartError),
          tempfile.TemporaryDirectory() as scratch):
        pair = model_pair(args.model)  # as the server serves it: a keyed body is answered
        keys = Path(scratch) / "keys.txt"
        keys.write_text(KEY + "\n")
        server = ServerProcess(["--model", args.model, "--api-keys", str(keys),
                                *args.server_flags.split()])
        try:
            print(f"{'case':24} {'status':>6} {'seconds':>8} {'longest /health wait':>21}")
            for name, (kind, body) in bodies(*pair).items():
                if args.cases and name not in args.cases:
                    continue
                health = HealthWatch(server.port, args.timeout)
                began = time.monotonic()
                try:
                    status, _ = post(server.port, kind, body, args.timeout)
                except OSError as err:
                    status = f"{type(err).__name__}"
                seconds = time.monotonic() - began
                longest = health.stop()
                print(f"{name:24} {status:>6} {seconds:8.2f} {longest:21.2f}", flush=True)
                time.sleep(0.2)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
