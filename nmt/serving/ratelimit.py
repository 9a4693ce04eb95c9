"""Per-client rate limits, as LibreTranslate's --req-limit: requests and characters a client
may send per minute, counted over a moving window of the last 60 seconds.

A client is the address uvicorn gives the request: the connection's peer, or the address a
trusted proxy forwarded (uvicorn's FORWARDED_ALLOW_IPS, 127.0.0.1 by default, so that a
server behind a local nginx limits each of nginx's clients rather than nginx). A request of
several texts costs one request per text (LibreTranslate counts them so too). A request past
either limit is refused with 429 and Retry-After (the seconds until every window has room for
it), and costs nothing; one that could never fit a minute's budget of either is refused with
413 whatever the other limit says, since waiting would not help. A request the server refuses
after charging it (a full queue, say) is given its charge back (`RateLimiter.refund`).

Each window is a queue of (time, cost) with its running total, so that a request costs the
same whatever the limit: a window kept in units (the `limits` package's moving window) copies
a list of every character of the last minute on each request.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import time

from nmt.serving.errors import RequestError

WINDOW_SECONDS = 60.0
SWEEP_EVERY = 1024  # charges between drops of the windows of clients gone quiet
# What one charge added: each window it counted in, with the (time, cost) it appended there.
Charge = list[tuple["_Window", tuple[float, int]]]


@dataclasses.dataclass(frozen=True)
class RateLimits:
    """Per client and minute; 0 means no limit."""

    requests: int = 0     # --req-limit
    characters: int = 0   # --char-limit-per-minute

    def __bool__(self) -> bool:
        return bool(self.requests or self.characters)


class _Window:
    """What one client spent on one limit over the last `WINDOW_SECONDS`."""

    def __init__(self):
        self.spent: collections.deque[tuple[float, int]] = collections.deque()
        self.total = 0

    def expire(self, now: float) -> None:
        while self.spent and self.spent[0][0] <= now - WINDOW_SECONDS:
            self.total -= self.spent.popleft()[1]

    def wait(self, cost: int, limit: int, now: float) -> float:
        """Seconds until `cost` more fits under `limit` (0: it fits now)."""
        over = self.total + cost - limit
        for at, spent in self.spent:
            if over <= 0:
                break
            over -= spent
            if over <= 0:
                return at + WINDOW_SECONDS - now
        return 0.0


class RateLimiter:
    """Checks and counts each client's requests and characters against `RateLimits`."""

    def __init__(self, limits: RateLimits):
        self.limits = limits
        self._limits = [(name, flag, amount) for name, flag, amount in (
            ("requests", "--req-limit", limits.requests),
            ("characters", "--char-limit-per-minute", limits.characters)) if amount]
        self._windows: dict[tuple[str, str], _Window] = {}
        self._charges = 0

    def charge(self, client: str, requests: int, characters: int) -> Charge:
        """Count a request of `requests` texts and `characters` characters from `client`, or
        RequestError 413 if it could never fit a limit, else 429 (with Retry-After, the
        longest wait of the limits it passes) if it would pass one now. Returns what it
        counted, for `refund`."""
        now = time.monotonic()
        costs = {"requests": max(requests, 1), "characters": characters}
        for name, flag, limit in self._limits:
            if costs[name] > limit:
                raise RequestError(413, f"the request counts {costs[name]} {name}, more than "
                                        f"this server allows a client per minute ({limit}, "
                                        f"{flag}); send less at a time")
        windows = [(self._window(rule[0], client, now), costs[rule[0]], rule)
                   for rule in self._limits]
        self._refuse_if_over(windows, now)
        charged = [(window, (now, cost)) for window, cost, _ in windows]
        for window, entry in charged:
            window.spent.append(entry)
            window.total += entry[1]
        self._sweep(now)
        return charged

    def _window(self, name: str, client: str, now: float) -> _Window:
        window = self._windows.setdefault((name, client), _Window())
        window.expire(now)
        return window

    @staticmethod
    def _refuse_if_over(windows: list[tuple[_Window, int, tuple[str, str, int]]],
                        now: float) -> None:
        """429 if any window lacks room, naming the limit whose room comes last."""
        if not windows:
            return
        wait, (name, flag, limit) = max(
            ((window.wait(cost, rule[2], now), rule) for window, cost, rule in windows),
            key=lambda waited: waited[0])
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise RequestError(429, f"Slowdown: {limit} {name} per minute per client "
                                    f"({flag}); try again in {seconds} s",
                               {"Retry-After": str(seconds)})

    @staticmethod
    def refund(charged: Charge) -> None:
        """Take back what `charge` counted: the request was refused, not served."""
        for window, entry in charged:
            with contextlib.suppress(ValueError):  # already out of the window
                window.spent.remove(entry)
                window.total -= entry[1]

    def _sweep(self, now: float) -> None:
        """Every `SWEEP_EVERY` charges, forget the clients with nothing in their windows."""
        self._charges += 1
        if self._charges % SWEEP_EVERY:
            return
        for key, window in list(self._windows.items()):
            window.expire(now)
            if not window.spent:
                del self._windows[key]
