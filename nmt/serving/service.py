"""What every endpoint shares: the models, the limits, the keys, the metrics, readiness."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from nmt.models.translator import Hypothesis
from nmt.serving.batching import QueueFull
from nmt.serving.catalog import Catalog, ServedModel
from nmt.serving.errors import RequestError
from nmt.serving.limits import Limits
from nmt.serving.metrics import Metrics

RETRY_AFTER_SECONDS = 1


@dataclasses.dataclass
class Service:
    catalog: Catalog
    limits: Limits
    metrics: Metrics
    api_keys: frozenset[str] | None = None  # None: no key needed
    ready: bool = False  # models loaded and every search shape compiled
    status: str = "loading"

    def check_ready(self) -> None:
        if not self.ready:
            raise RequestError(503, f"the server is starting ({self.status}); try again "
                                    "shortly", {"Retry-After": str(RETRY_AFTER_SECONDS)})

    def check_key(self, key: object) -> None:
        """RequestError 403 unless keys are off or `key` is one of them."""
        if self.api_keys is None:
            return
        if not key:
            raise RequestError(403, "this server needs an API key: send api_key with the "
                                    "request; ask the server's operator for one")
        if key not in self.api_keys:
            raise RequestError(403, "Invalid API key")

    async def translate(self, model: ServedModel, sentences: Sequence[str]
                        ) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences` from `model`'s batcher, within the request
        timeout (504) and the queue's bound (503 with Retry-After)."""
        self.check_ready()
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
