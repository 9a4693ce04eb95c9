"""Per-client rate limits, as LibreTranslate's --req-limit: requests and characters a client
may send per minute, counted over a moving window of the last 60 seconds.

A client is the address uvicorn gives the request: the connection's peer, or the address a
trusted proxy forwarded (uvicorn's --forwarded-allow-ips, 127.0.0.1 by default, so that a
server behind a local nginx limits each of nginx's clients rather than nginx). A request of
several texts costs one request per text (LibreTranslate counts them so too). A request past
either limit is refused with 429 and Retry-After (the seconds until the window has room), and
costs nothing; one that could never fit a minute's budget is refused with 413 instead, since
waiting would not help.
"""

from __future__ import annotations

import dataclasses
import math
import time

from limits import RateLimitItem, RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from nmt.serving.errors import RequestError


@dataclasses.dataclass(frozen=True)
class RateLimits:
    """Per client and minute; 0 means no limit."""

    requests: int = 0     # --req-limit
    characters: int = 0   # --char-limit-per-minute

    def __bool__(self) -> bool:
        return bool(self.requests or self.characters)


class RateLimiter:
    """Checks and counts each client's requests and characters against `RateLimits`."""

    def __init__(self, limits: RateLimits):
        self.limits = limits
        self._windows = MovingWindowRateLimiter(MemoryStorage())
        self._items = [(name, flag, RateLimitItemPerMinute(amount))
                       for name, flag, amount in (("requests", "--req-limit", limits.requests),
                                                  ("characters", "--char-limit-per-minute",
                                                   limits.characters)) if amount]

    def charge(self, client: str, requests: int, characters: int) -> None:
        """Count a request of `requests` texts and `characters` characters from `client`, or
        RequestError 429 (with Retry-After) if it would pass a limit, 413 if it always
        would."""
        costs = {"requests": max(requests, 1), "characters": characters}
        for name, flag, item in self._items:
            if costs[name] > item.amount:
                raise RequestError(413, f"the request counts {costs[name]} {name}, more than "
                                        f"this server allows a client per minute ({item.amount}"
                                        f", {flag}); send less at a time")
        for name, flag, item in self._items:
            if costs[name] and not self._windows.test(item, client, cost=costs[name]):
                wait = self._seconds_until_room(item, client)
                raise RequestError(429, f"Slowdown: {item.amount} {name} per minute per client "
                                        f"({flag}); try again in {wait} s",
                                   {"Retry-After": str(wait)})
        for name, _, item in self._items:
            if costs[name]:
                self._windows.hit(item, client, cost=costs[name])

    def _seconds_until_room(self, item: RateLimitItem, client: str) -> int:
        reset = self._windows.get_window_stats(item, client).reset_time
        return max(1, math.ceil(reset - time.time()))
