"""Batching across requests: the sentences of concurrent requests searched as one batch.

Each served model has one `Batcher`. A request hands it its sentences and awaits their
translations; the batcher's task takes the oldest waiting request, adds every request waiting
or arriving within `max_wait` seconds of it (none by default), up to `gather_tokens` source
tokens and up to the call's share of the load (`Batcher._share`), waiting up to `refill_wait`
for that share, and runs one
`Translator.translate_nbest` call on all their sentences in a search thread, off the event
loop (the call searches them as one batch, or sorts them by length into several). While that
call runs, new requests queue up and form the next one (run beside it when `searches` > 1),
so under load calls fill without waiting. The queue is
bounded in sentences: a request that would overflow it is refused at once (`QueueFull`),
never held in memory. A request abandoned while it waits (its timeout, its client gone) gives
its places back at once, and is neither searched nor waited for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

from nmt.models.translations import Hypothesis


class QueueFull(Exception):
    """The batcher's queue has no room for a request's sentences."""


@dataclasses.dataclass
class _Job:
    """One request's sentences, waiting for (or being) searched."""

    sentences: Sequence[str]
    ids: list[list[int]]  # their source token ids, encoded once, when the request came
    tokens: int  # EOS included
    future: asyncio.Future  # -> list[list[Hypothesis]], one n-best list per sentence
    arrived: float = dataclasses.field(default_factory=time.monotonic)
    queued: bool = True  # its sentences still count in `Batcher.queued_sentences`

    @property
    def abandoned(self) -> bool:
        """Its request stopped waiting (cancelled) before its search began."""
        return self.future.done()


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """What one search call held: for the metrics."""

    requests: int
    sentences: int
    seconds: float


class Batcher:
    """Gathers requests for one model into search calls run by `executor`.

    `gather_tokens`: source tokens (EOS included) gathered for one call at most, unless one
    request alone has more; `max_wait`: seconds the oldest request waits for others;
    `searches`: calls run at once (threads share the translator; the executor needs as many
    threads), so that a CPU's cores are all busy even with batches too small to spread
    over them; `refill_wait`: seconds a call short of its share waits for it (`_gather`);
    `across_requests=False` searches every request on its own (for comparison).
    `max_queue`: sentences waiting at most. `on_batch` is told of every search call. `name`
    (the model's pair) heads a call's one warning for its sentences cut to the model's
    positions: a warning per sentence, naming its place in a batch of several clients'
    requests, would tell no one anything, and any client could flood the log with them.
    """

    def __init__(self, translator, executor: concurrent.futures.Executor,
                 gather_tokens: int, max_wait: float, max_queue: int, searches: int = 1,
                 across_requests: bool = True, refill_wait: float = 0.0,
                 on_batch: Callable[[BatchRecord], None] | None = None, name: str = "server"):
        self.translator = translator
        self.name = name
        self.executor = executor
        self.gather_tokens = gather_tokens
        self.max_wait = max_wait
        self.refill_wait = refill_wait
        self.max_queue = max_queue
        self.across_requests = across_requests
        self.on_batch = on_batch
        self.queued_sentences = 0
        self._idle = list(range(searches))  # the search slots free for a call
        # What `_share` counts as the load in flight besides the queue: the sentences of the
        # calls searching (by slot), and those answered whose clients have not sent
        # as many new ones yet.
        self._searching: dict[int, int] = {}
        self._returning = 0
        self.searches = searches
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._held: _Job | None = None  # taken from the queue, but for the next batch
        self._task: asyncio.Task | None = None
        self._searches: set[asyncio.Task] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._searches]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def translate(self, sentences: Sequence[str]) -> list[list[Hypothesis]]:
        """The n-best lists of `sentences`, in order; QueueFull if there is no room.

        Cancelling the wait (a request's timeout, its client gone) takes the sentences off the
        queue's count at once; if their search has not started, they are never searched."""
        if not sentences:
            return []
        if self.queued_sentences + len(sentences) > self.max_queue:
            raise QueueFull(f"{self.queued_sentences} sentences are waiting; the queue holds "
                            f"{self.max_queue}")
        ids = self.translator.tokenizer.encode(list(sentences))
        job = _Job(sentences, ids, sum(len(row) + 1 for row in ids),
                   asyncio.get_running_loop().create_future())
        self.queued_sentences += len(sentences)
        self._returning = max(0, self._returning - len(sentences))
        self._queue.put_nowait(job)
        try:
            return await job.future
        finally:
            self._unqueue(job)

    def _unqueue(self, job: _Job) -> None:
        """Take `job`'s sentences off the queue's count, once: when its call is gathered, or
        when its request stops waiting, whichever comes first."""
        if job.queued:
            job.queued = False
            self.queued_sentences -= len(job.sentences)

    async def _run(self) -> None:
        """Gather a call whenever a search slot is free, and start its search."""
        free = asyncio.Event()
        while True:
            while not self._idle:
                free.clear()
                await free.wait()
            jobs = await self._gather()
            for job in jobs:
                self._unqueue(job)
            jobs = [job for job in jobs if not job.abandoned]  # given up while gathered
            if not jobs:
                continue
            slot = self._idle.pop()
            self._searching[slot] = sum(len(job.sentences) for job in jobs)
            task = asyncio.get_running_loop().create_task(self._search(slot, jobs, free))
            self._searches.add(task)
            task.add_done_callback(self._searches.discard)

    async def _search(self, slot: int, jobs: list[_Job], free: asyncio.Event) -> None:
        """One call for `jobs`' sentences; each job gets its own translations, or the error."""
        sentences = [s for job in jobs for s in job.sentences]
        ids = [row for job in jobs for row in job.ids]
        start = time.perf_counter()
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.executor, functools.partial(self.translator.translate_nbest, sentences,
                                                 ids=ids, source=self.name, each_line=False))
        except Exception as err:  # noqa: BLE001 - every waiting request gets the error
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(err)
            return
        finally:
            del self._searching[slot]
            self._idle.append(slot)
            free.set()
        if self.on_batch is not None:
            self.on_batch(BatchRecord(len(jobs), len(sentences), time.perf_counter() - start))
        offset = 0
        for job in jobs:
            if not job.future.done():
                job.future.set_result(results[offset:offset + len(job.sentences)])
                self._returning += len(job.sentences)
            offset += len(job.sentences)

    async def _gather(self) -> list[_Job]:
        """The next call: the oldest job, and the others that arrive until max_wait after it
        did, up to the token budget (a job that would pass it is held for the next call), and
        its share of the load (`_share`), leaving the rest for the other searches.

        Clients send their next requests a moment after their answers, so while the call holds
        less than its share it waits for them, up to `refill_wait` from its first job (without
        that wait, calls settle into small ones: docs/serving.md); if they do not come, they
        are no longer counted."""
        first = self._held if self._held is not None and not self._held.abandoned else None
        self._held = None
        while first is None or first.abandoned:
            first = await self._queue.get()
        jobs, tokens = [first], first.tokens
        if not self.across_requests:
            return jobs
        sentences, refill_until = len(first.sentences), time.monotonic() + self.refill_wait
        while tokens < self.gather_tokens:
            share = self._share()
            if sentences >= share and not self._queue.empty() and self.searches > 1:
                break  # the rest is the next search's
            deadline = first.arrived + self.max_wait
            if sentences < share:
                deadline = max(deadline, refill_until)
            job = await self._next_job(deadline, first)
            if job is None:
                if first.abandoned:
                    break  # no one to wait for: the call goes with those still waiting
                if sentences < share:
                    self._returning = 0  # the clients that did not come back have left
                break
            if tokens + job.tokens > self.gather_tokens:
                self._held = job
                break
            jobs.append(job)
            tokens += job.tokens
            sentences += len(job.sentences)
        return jobs

    async def _next_job(self, deadline: float, first: _Job) -> _Job | None:
        """The next queued job still waiting, waiting for one until `deadline`
        (time.monotonic); None if none came by then, or once `first`, the job the call waits
        on behalf of, is abandoned."""
        while not first.abandoned:
            if not self._queue.empty():
                job = self._queue.get_nowait()
            else:
                job = await self._wait_for_job(deadline, first)
                if job is None:
                    return None
            if not job.abandoned:
                return job
        return None

    async def _wait_for_job(self, deadline: float, first: _Job) -> _Job | None:
        """The next job to arrive before `deadline`, unless `first` is abandoned first."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        arrival = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait({arrival, first.future}, timeout=remaining,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            # cancel() is False once the get has returned; one cancelled before takes nothing
            came = not arrival.cancel()
        return arrival.result() if came else None

    def _share(self) -> int:
        """Sentences a call should hold: the load in flight (searching, queued, or answered
        and about to come back) over the searches."""
        in_flight = sum(self._searching.values()) + self.queued_sentences + self._returning
        return -(-in_flight // self.searches)
