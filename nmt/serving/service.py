"""What every endpoint shares: the models, the limits, the keys, the metrics, readiness."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from starlette.requests import Request

from nmt.models.translations import Hypothesis
from nmt.serving.batching import QueueFull
from nmt.serving.catalog import Catalog, ServedModel
from nmt.serving.errors import ClientGone, RequestError
from nmt.serving.limits import ServerLimits
from nmt.serving.metrics import Metrics

RETRY_AFTER_SECONDS = 1
T = TypeVar("T")


@dataclasses.dataclass
class Service:
    catalog: Catalog
    limits: ServerLimits
    metrics: Metrics
    api_keys: frozenset[str] | None = None  # None: no key needed
    ready: bool = False  # models loaded and every search shape compiled
    status: str = "loading"

    def check_ready(self) -> None:
        if not self.ready:
            raise RequestError(503, f"the server is starting ({self.status}); try again "
                                    "shortly", {"Retry-After": str(RETRY_AFTER_SECONDS)})

    def check_key(self, key: str | None) -> None:
        """RequestError 403 unless keys are off or `key` is one of them (compared in constant
        time, so that the answer's timing does not tell how much of a key was right)."""
        if self.api_keys is None:
            return
        if not key:
            raise RequestError(403, "this server needs an API key: send api_key with the "
                                    "request; ask the server's operator for one")
        sent = key.encode()
        if not any(hmac.compare_digest(sent, known.encode()) for known in self.api_keys):
            raise RequestError(403, "Invalid API key")

    async def translate(self, model: ServedModel, sentences: Sequence[str]
                        ) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences` from `model`'s batcher, within the request
        timeout (504) and the queue's bound (503 with Retry-After while it is full, 413 for
        more sentences than it ever holds)."""
        self.check_ready()
        self.limits.check_queue(len(sentences))
        assert model.batcher is not None
        try:
            return await asyncio.wait_for(model.batcher.translate(sentences),
                                          self.limits.timeout)
        except QueueFull as err:
            raise RequestError(503, f"the server is busy ({err}); try again shortly",
                               {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        except TimeoutError:
            raise RequestError(504, f"the translation took longer than this server's "
                                    f"{self.limits.timeout:g} s (--timeout)") from None


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client closes its connection first: then `work` is
    cancelled (its sentences leave the queue if their search has not started) and ClientGone
    raised, so that no search is spent on an answer no one will read."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in (task, left):
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body was read already: what
    the server hears next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
