"""nmt.serving.batching.Batcher: how the sentences of concurrent requests become search calls."""

import asyncio
import concurrent.futures
import contextlib
import logging
import time

from nmt.models.translations import Hypothesis
from nmt.serving.batching import Batcher

SEARCH_SECONDS = 0.03


ENCODED: list[str] = []  # every sentence the fake tokenizer was given


class SleepingTranslator:
    """Answers each sentence with its token ids joined back, after SEARCH_SECONDS, as a search
    call would take: an answer equal to its request shows that the ids the batcher encoded
    travelled with their sentence."""

    class tokenizer:
        @staticmethod
        def encode(sentences):
            ENCODED.extend(sentences)
            return [sentence.split() for sentence in sentences]

    def translate_nbest(self, sentences, ids, **warnings):
        assert len(ids) == len(sentences)
        time.sleep(SEARCH_SECONDS)
        return [[Hypothesis(" ".join(row), 0.0, ())] for row in ids]


def run_clients(clients: int, rounds: int, refill_wait: float, searches: int = 2):
    """`clients` clients, each sending one sentence, and its next 1 to `clients` ms after its
    answer (client n: n + 1 ms), `rounds` times. Returns (sentences per search call, whether
    each answer matched its request, seconds per request)."""
    calls, matched, seconds = [], [], []

    async def main():
        executor = concurrent.futures.ThreadPoolExecutor(searches)
        batcher = Batcher(SleepingTranslator(), executor, gather_tokens=10_000, max_wait=0.0,
                          max_queue=10_000, searches=searches, refill_wait=refill_wait,
                          on_batch=lambda record: calls.append(record.sentences))
        batcher.start()

        async def client(n: int):
            for k in range(rounds):
                sentence = f"client {n} sentence {k}"
                start = time.monotonic()
                (answer,) = await batcher.translate([sentence])
                seconds.append(time.monotonic() - start)
                matched.append(answer[0].text == sentence)
                await asyncio.sleep(0.001 * (n + 1))  # the answer's way, the next request's

        try:
            await asyncio.gather(*(client(n) for n in range(clients)))
        finally:
            await batcher.stop()
            executor.shutdown()

    asyncio.run(main())
    return calls, all(matched) and len(matched) == clients * rounds, seconds


def test_calls_settle_to_an_even_share_of_the_clients():
    """Eight clients and two searches: once the first calls are past, every call holds four
    sentences. Taking only what had queued at once, calls start with the clients that came
    back first, and the rest wait for the next call."""
    calls, matched, _ = run_clients(clients=8, rounds=12, refill_wait=1.0)
    assert matched
    assert calls[4:] and set(calls[4:]) == {4}, calls

    calls, matched, _ = run_clients(clients=8, rounds=12, refill_wait=0.0)
    assert matched
    assert min(calls[4:]) < 4, calls  # what the wait is for


def test_each_sentence_is_encoded_once_and_searched_with_its_own_ids():
    """The batcher counts a request's tokens with its ids and hands the search those same
    ids: no sentence is encoded twice, and none gets another's ids."""
    ENCODED.clear()
    _, matched, _ = run_clients(clients=8, rounds=6, refill_wait=0.01)
    assert matched
    assert sorted(ENCODED) == sorted(f"client {n} sentence {k}" for n in range(8)
                                     for k in range(6))


def test_a_lone_client_never_waits_for_company():
    """One client: its share is its own sentence, so no call waits `refill_wait`."""
    calls, matched, seconds = run_clients(clients=1, rounds=5, refill_wait=1.0)
    assert matched and calls == [1] * 5
    assert max(seconds) < 0.5, seconds


def test_an_abandoned_request_gives_its_places_back_at_once_and_is_not_searched():
    """A request waiting for company (`max_wait`) is abandoned (its timeout, its client gone):
    its 15 sentences leave the queue's count of 20 at once, so a request of 10 that comes
    next is taken, and only those 10 are searched."""
    calls: list[int] = []

    async def main():
        executor = concurrent.futures.ThreadPoolExecutor(1)
        batcher = Batcher(SleepingTranslator(), executor, gather_tokens=10_000, max_wait=0.5,
                          max_queue=20, on_batch=lambda record: calls.append(record.sentences))
        batcher.start()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(batcher.translate(["Ja."] * 15), 0.05)
            queued_after = batcher.queued_sentences
            answers = await asyncio.wait_for(batcher.translate(["Nein."] * 10), 5)
            return queued_after, [nbest[0].text for nbest in answers]
        finally:
            await batcher.stop()
            executor.shutdown()

    queued_after, answers = asyncio.run(main())
    assert queued_after == 0
    assert answers == ["Nein."] * 10
    assert calls == [10]


def test_the_alternatives_search_counts_in_the_pairs_metrics_and_queue():
    """The n-best search for alternatives runs through a batcher of its own: its calls count
    as the pair's batches and sentences, and its waiting sentences in the pair's queue."""
    import argparse

    from nmt.serving.catalog import Catalog, ServedModel
    from nmt.serving.command import start_batchers
    from nmt.serving.limits import ServerLimits
    from nmt.serving.metrics import Metrics
    from nmt.serving.service import Service

    model = ServedModel(0, "de", "en", "runs/x", SleepingTranslator(), SleepingTranslator())
    service = Service(Catalog([model]), ServerLimits(), Metrics())
    args = argparse.Namespace(gather_tokens=10_000, searches=1, batch_wait_ms=0, max_queue=100,
                              refill_wait_ms=0, batch_across_requests=True)

    async def main():
        executor = concurrent.futures.ThreadPoolExecutor(1)
        start_batchers(model, service, executor, args)
        try:
            await model.batcher.translate(["ein Satz"])
            await model.alternatives_batcher.translate(["zwei Sätze", "drei"])
            model.batcher.queued_sentences, model.alternatives_batcher.queued_sentences = 1, 4
            return service.metrics.exposition().decode()
        finally:
            await model.batcher.stop()
            await model.alternatives_batcher.stop()
            executor.shutdown()

    exposition = asyncio.run(main())
    assert 'nmt_sentences_translated_total{pair="de-en"} 3.0' in exposition
    assert 'nmt_batch_sentences_count{pair="de-en"} 2.0' in exposition
    assert 'nmt_queue_sentences{pair="de-en"} 5.0' in exposition


def test_a_request_of_long_texts_logs_one_warning_that_counts_them(caplog):
    """A request of 12 sentences past the model's 50 positions logs one warning, naming the
    pair, the count and the longest, not one per sentence naming its place in the batch
    (any client could flood the log with those, and they mean nothing to anyone)."""
    from test_translator import NumberTokenizer, tiny_model

    from nmt.models.translator import Translator
    from transformer.config import SearchConfig

    translator = Translator(tiny_model(max_len=50), NumberTokenizer(),
                            SearchConfig(beam_size=2, max_len_b=3))
    long_texts = [" ".join(["7"] * (55 + n % 6)) for n in range(12)]

    async def main():
        executor = concurrent.futures.ThreadPoolExecutor(1)
        batcher = Batcher(translator, executor, gather_tokens=10_000, max_wait=0.0,
                          max_queue=100, name="de-en")
        batcher.start()
        try:
            return await batcher.translate(["5 6 7", *long_texts])
        finally:
            await batcher.stop()
            executor.shutdown()

    with caplog.at_level(logging.WARNING, logger="translate"):
        found = asyncio.run(main())
    assert len(found) == 13
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["de-en: 12 sentences longer than the model's 50 positions were cut to "
                        "49 tokens (longest 60)"], warnings
