"""nmt.models.translator.Translator: text in, text out, around search."""

import dataclasses
import re

import pytest
from conftest import SHALLOW
from flax import nnx

from data.tokenizer import SpecialIds
from nmt.models.translations import Hypothesis
from nmt.models.translator import Translator
from transformer.config import SearchConfig, get_preset
from transformer.model import Transformer


class NumberTokenizer:
    """Sentences of integers (the token ids themselves); enough for Translator."""

    ids = SpecialIds()

    def encode(self, sentences, side="source"):
        return [[int(word) for word in sentence.split()] for sentence in sentences]

    def decode(self, rows):
        return [" ".join(map(str, row)) for row in rows]


def tiny_model(**overrides) -> Transformer:
    """The tiny preset, one layer each side: the translator's batching does not depend on depth."""
    model = Transformer(get_preset("tiny", vocab_size=64, **SHALLOW, **overrides),
                        rngs=nnx.Rngs(0))
    table = model.src_embedding.table.embedding
    table[...] = table[...] * 4.0  # peaked distributions, as a trained model has
    return model


@pytest.mark.parametrize("max_len", [50, 300])
def test_a_source_cut_to_the_model_length_is_never_padded_past_it(max_len):
    # 49 tokens + EOS fall in the default bucket 56, wider than 50 positions; past the last
    # bucket (256) widths round up to a multiple of 64: 320 for 299 + EOS.
    translator = Translator(tiny_model(max_len=max_len),
                            NumberTokenizer(), SearchConfig(beam_size=2, max_len_b=3))
    long_source = " ".join(["7"] * (max_len + 10))
    done = translator.translate_all([long_source, "5 6 7"])
    assert len(done.nbest) == 2
    assert done.truncated == [1]  # line numbers, from 1
    assert max(translator.buckets) == max_len


def test_sampling_draws_new_numbers_on_every_call_and_repeats_with_the_seed():
    search = SearchConfig(strategy="sample", max_len_a=0, max_len_b=8)
    sentence = ["5 9 13 17"]

    def four_calls():
        translator = Translator(tiny_model(), NumberTokenizer(), search, seed=3)
        return [translator.translate(sentence)[0] for _ in range(4)]

    first = four_calls()
    assert len(set(first)) > 1, first  # each call (a stdin chunk in translate.py) draws anew
    assert four_calls() == first       # and the seed fixes the whole sequence


def test_batch_keys_come_from_the_count_or_from_the_stream_alone():
    import jax
    import numpy as np

    from nmt.models.translator import BatchKeys

    seed = jax.random.key(3)
    data = jax.random.key_data
    keys = BatchKeys(seed, draws=True)
    assert np.array_equal(data(keys.key(7, 2, 1)), data(keys.key(0, 2, 1)))  # not the count
    distinct = {data(key).tobytes() for key in (keys.key(0, None, 0), keys.key(1, None, 0),
                                                keys.key(0, 0, 0), keys.key(0, 1, 0),
                                                keys.key(0, 0, 1))}
    assert len(distinct) == 5
    assert BatchKeys(seed, draws=False).key(7, 2, 1) is seed  # nothing to fold for a beam


def test_a_call_with_a_stream_number_draws_the_same_whatever_came_before():
    search = SearchConfig(strategy="sample", max_len_a=0, max_len_b=8)
    sentences = ["5 9 13 17", "6 10", "7 7 7"]
    fresh = Translator(tiny_model(), NumberTokenizer(), search, seed=3)
    first = fresh.translate_all(sentences, stream=2).nbest
    used = Translator(tiny_model(), NumberTokenizer(), search, seed=3)
    for stream in (None, 0, 1):
        used.translate_all(sentences, stream=stream)
    assert used.translate_all(sentences, stream=2).nbest == first
    draws = {tuple(h[0].text for h in fresh.translate_all(sentences, stream=n).nbest)
             for n in range(4)}
    assert len(draws) > 1, draws  # other numbers, other draws


@pytest.mark.parametrize("vocab_size, limit, found", [
    (64, 1, 1),  # EOS is forced at once: it is the one hypothesis
    (6, 2, 4),   # EOS, or UNK, 4 or 5 then EOS (PAD and BOS are never chosen)
    (6, 6, 5),
])
def test_nbest_lists_hold_only_the_hypotheses_the_search_found(vocab_size, limit, found):
    """The n-best places the search leaves unfilled (scored NEG_INF) never reach the caller:
    a list is then shorter than nbest."""
    model = Transformer(get_preset("tiny", vocab_size=vocab_size, **SHALLOW), rngs=nnx.Rngs(0))
    search = SearchConfig(beam_size=5, nbest=5, max_len_a=0, max_len_b=limit)
    translator = Translator(model, NumberTokenizer(), search)
    for nbest in translator.translate_nbest(["4 4 4", "4"]):
        assert len(nbest) == found, nbest
        assert len({h.tokens for h in nbest}) == found
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True) and min(scores) > -1e3, scores


def test_input_mistakes_are_named_and_a_sentence_of_no_tokens_is_an_empty_one():
    translator = Translator(tiny_model(), NumberTokenizer(),
                            SearchConfig(beam_size=2, max_len_a=0, max_len_b=1), batch_tokens=16)
    with pytest.raises(TypeError, match="a list of strings, got one str: pass"):
        translator.translate("5 6 7")  # else each character is a sentence
    with pytest.raises(ValueError, match="1 line numbers for 2 sentences"):
        translator.translate_all(["5", "6"], line_numbers=[4])
    # A zero-width space, say: not blank, but no tokens. It is answered as an empty line
    # is, not searched from EOS alone, and not counted as reaching the output limit.
    sources = ["5 6 7 8 9 10 11 12 13", "\u200b", "5", "5 6 7 8 9 10 11 12 13 14 15 16", "6"]
    done = translator.translate_all(sources, ids=NumberTokenizer().encode(
        [s if s.strip("\u200b") else "" for s in sources]))
    assert done.nbest[1] == [Hypothesis("", 0.0, ())]
    assert done.reached_limit == [1, 3, 4, 5]  # every searched line (a limit of 1), in order


def test_top_k_beyond_the_vocabulary_is_refused_with_the_size():
    search = SearchConfig(strategy="sample", top_k=65)
    with pytest.raises(ValueError, match="top_k 65.*64 tokens"):
        Translator(tiny_model(), NumberTokenizer(), search)


@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_every_batch_shape_searched_is_one_of_search_shapes(strategy):
    """The server compiles `search_shapes()` before it takes requests: any call, of any size
    and lengths, must search only those shapes, or a request would pay for a compilation."""
    import random

    translator = Translator(tiny_model(), NumberTokenizer(),
                            SearchConfig(strategy=strategy, beam_size=3, max_len_b=2),
                            batch_tokens=256, compact_after=0)
    shapes = set(translator.search_shapes())
    rng = random.Random(0)
    seen = set()
    for count in (1, 3, 9, 40):
        sentences = [" ".join(str(rng.randrange(4, 60)) for _ in range(rng.randrange(1, 62)))
                     for _ in range(count)]
        batches = translator.translate_all(sentences).batches
        seen |= {(rows, stats.width) for stats in batches for rows in stats.stage_rows}
    assert seen <= shapes, seen - shapes
    assert len(seen) >= 4  # the calls did meet several shapes
    assert any(len(stats.stage_rows) > 1 for stats in batches)  # and compacted
    assert len(shapes) == len(set(shapes))


@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_a_call_that_fits_one_batch_is_searched_as_one(strategy):
    """Where rows cost time, a small call of several widths is one batch at its longest
    sentence's width (with the fewest rows of that width's compiled shapes that hold it), not a
    batch per width; each sentence gets the translation it gets alone. A call too large for
    one batch is still cut by width."""
    search = SearchConfig(strategy=strategy, beam_size=3, max_len_b=2)
    translator = Translator(tiny_model(), NumberTokenizer(), search, batch_tokens=512)
    short, long = "5 6 7", " ".join(["9"] * 20)  # widths 16 and 32
    sentences = [long, short, short.replace("5", "8")]
    done = translator.translate_all(sentences)
    found = [nbest[0].text for nbest in done.nbest]
    ((rows, width, count),) = [(b.rows, b.width, b.sentences) for b in done.batches]
    assert (width, count) == (32, 3) and (rows, width) in translator.search_shapes()
    assert rows == min(r for r, w in translator.search_shapes() if w == 32 and r >= 3)
    assert found == [translator.translate([sentence])[0] for sentence in sentences]

    many = [short] * 30 + [long] * 3
    assert sorted({b.width for b in translator.translate_all(many).batches}) == [16, 32]


def test_a_call_of_a_power_of_two_sentences_fits_one_batch_at_a_width_the_budget_divides_unevenly():
    """512 source tokens per batch (2,048 over beam 4) give width 48 ten rows; a call of 16
    whose longest sentence needs width 48 (a server's share of 32 clients) is still one
    search, of 16 rows, not two: the width's largest row count is rounded up to a power of
    two, and that shape is among those the server compiles before it is ready."""
    search = SearchConfig(beam_size=4, max_len_b=2)
    translator = Translator(tiny_model(), NumberTokenizer(), search, batch_tokens=2048)
    assert {10, 16} <= {rows for rows, width in translator.search_shapes() if width == 48}
    long = " ".join(["9"] * 40)  # 40 tokens + EOS: width 48
    sentences = [long] + [" ".join(str(4 + (i + j) % 50) for j in range(3 + i % 9))
                          for i in range(15)]
    done = translator.translate_all(sentences)
    found = [nbest[0].text for nbest in done.nbest]
    assert [(b.rows, b.width, b.sentences) for b in done.batches] == [(16, 48, 16)]
    assert found[:2] == [translator.translate([sentence])[0] for sentence in sentences[:2]]


def test_ids_the_caller_encoded_are_searched_as_the_sentences_would_be():
    """A caller that has the sentences' ids (the server, which counts tokens with them) gets
    the hypotheses of the sentences, searched from those ids without encoding again; a long
    source is still cut to the model's positions, and ids that do not match the sentences in
    number are refused."""
    translator = Translator(tiny_model(max_len=50), NumberTokenizer(),
                            SearchConfig(beam_size=2, max_len_b=3))
    sentences = ["5 6 7", "", " ".join(["7"] * 60), "9 8"]
    ids = translator.tokenizer.encode(sentences)
    given = translator.translate_all(sentences, ids=ids)
    assert given.truncated == [3]
    assert ids[2] == [7] * 60  # the caller's ids are not cut
    assert given.nbest == translator.translate_nbest(sentences)
    # The ids are what is searched: another sentence's ids give that sentence's hypotheses.
    swapped = translator.translate_nbest(["5 6 7"], ids=translator.tokenizer.encode(["9 8"]))
    assert swapped == translator.translate_nbest(["9 8"]) != translator.translate_nbest(["5 6 7"])
    with pytest.raises(ValueError, match="3 rows of token ids for 4 sentences"):
        translator.translate_nbest(sentences, ids=ids[:3])


@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_batches_searched_at_once_give_the_same_translations_in_order(strategy):
    """Two search threads: the same hypotheses, progress and batch records, in input order,
    as one thread, over a call of many batches of several widths."""
    import random

    rng = random.Random(1)
    sentences = [" ".join(str(rng.randrange(4, 60)) for _ in range(rng.randrange(1, 40)))
                 for _ in range(50)]
    results = []
    for searches in (1, 2):
        translator = Translator(tiny_model(), NumberTokenizer(),
                                SearchConfig(strategy=strategy, beam_size=3, max_len_b=2),
                                batch_tokens=256, searches=searches, compact_after=3)
        done = []
        call = translator.translate_all(sentences, progress=done.append)
        batches = [(b.rows, b.width, b.sentences, b.steps) for b in call.batches]
        results.append((call.nbest, done, batches))
    assert len(results[0][2]) >= 5  # several batches were in flight at once
    assert results[1] == results[0]


def test_threads_share_one_translator_and_each_call_returns_its_own_records():
    """No copies per thread: calls from two threads at once each get the hypotheses,
    truncation and output-limit records of their own sentences, as each call alone does."""
    import concurrent.futures

    translator = Translator(tiny_model(max_len=50), NumberTokenizer(),
                            SearchConfig(beam_size=2, max_len_a=0, max_len_b=3),
                            batch_tokens=64, compact_after=None)
    calls = [[" ".join(["7"] * 60), "5 6", "9"],
             ["11 12 13 14", " ".join(["8"] * 55), "", "4 5"],
             ["20 21", "30 31 32 33 34 35"]]

    def records(done):
        return done.nbest, done.truncated, done.reached_limit, len(done.batches)

    alone = [records(translator.translate_all(call, first_line=10 * i))
             for i, call in enumerate(calls)]
    assert alone[0][1] == [0] and alone[1][1] == [11]  # lines from each call's first_line
    assert any(reached for _, _, reached, _ in alone)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for _ in range(3):
            futures = [pool.submit(translator.translate_all, call, first_line=10 * i)
                       for i, call in enumerate(calls)]
            assert [records(future.result()) for future in futures] == alone


def test_a_width_compacts_once_enough_of_its_batches_were_searched():
    """Compacting compiles programs at fewer rows, which pays only over many batches: the
    first `compact_after` batches of a width (counted over calls) search whole, later ones
    leave finished sentences behind; after `warm_up` every batch compacts."""
    import random

    rng = random.Random(2)
    sentences = [" ".join(str(rng.randrange(4, 60)) for _ in range(rng.randrange(1, 15)))
                 for _ in range(24)]  # one width (16), 4 sentences a batch at 64 tokens
    translator = Translator(tiny_model(), NumberTokenizer(), SearchConfig(strategy="greedy"),
                            batch_tokens=64, compact_after=3)
    stages = []
    for call in (sentences[:8], sentences[8:]):  # two batches, then four
        stages += [len(stats.stage_rows) for stats in translator.translate_all(call).batches]
    assert len(stages) == 6
    assert stages[:3] == [1, 1, 1] and max(stages[3:]) > 1, stages
    translator.warm_up()
    assert translator.compact_after == 0


def test_where_rows_cost_little_batches_keep_one_shape_per_width_and_never_compact(
        monkeypatch):
    """On a GPU or TPU a loop program costs seconds to compile and fewer rows save little:
    there a translator, even one told to compact from the start, searches every batch of a
    width whole and with the same rows, small calls included, and `warm_up` compiles one
    start and one loop program per width, which is all its calls need."""
    import random

    from nmt.models import translator as translator_module
    from nmt.runtime.compilation import CompileLog

    monkeypatch.setattr(translator_module, "cpu_backend", lambda: False)
    rng = random.Random(4)
    sentences = [" ".join(str(rng.randrange(4, 60)) for _ in range(rng.randrange(1, 15)))
                 for _ in range(24)]
    # A model no other test builds, so that its programs are compiled here, not found.
    translator = Translator(tiny_model(max_len=40), NumberTokenizer(),
                            SearchConfig(strategy="greedy", max_len_b=3), batch_tokens=64,
                            buckets=(16,), compact_after=0)
    assert translator.compact_after is None
    # One row count per width (64 tokens // width): 16, and the model's 40 positions.
    assert translator.search_shapes() == [(4, 16), (1, 40)]
    with CompileLog().active() as warming:
        translator.warm_up()
    functions = [record.function for record in warming.records]
    assert not any("_compact" in name for name in functions), functions
    resumes = [name for name in functions if "resume" in name]
    assert len(resumes) == len(translator.search_shapes()), functions
    with CompileLog().active() as translating:
        batches = translator.translate_all(sentences).batches
    assert translating.records == []
    assert len(batches) == 6
    assert all(stats.stage_rows == (stats.rows,) for stats in batches)
    with CompileLog().active() as one_sentence:
        batches = translator.translate_all(sentences[:1]).batches
    assert one_sentence.records == []
    assert [(stats.rows, stats.sentences) for stats in batches] == [(4, 1)]


def test_each_batch_shape_is_compiled_ahead_once_and_a_failed_search_waits_for_no_more():
    """The programs of a call's batch shapes are compiled on a thread of their own in the
    order the shapes come, each once over calls; when a search fails, the shapes still
    queued are dropped, not compiled before the error reaches the caller."""
    import random
    import threading

    rng = random.Random(3)
    sentences = [" ".join(str(rng.randrange(4, 60)) for _ in range(n)) for n in
                 (3, 5, 10, 14, 20, 25, 40, 45, 60)]  # widths 16, 32, 48, 64
    translator = Translator(tiny_model(), NumberTokenizer(), SearchConfig(strategy="greedy"),
                            batch_tokens=64, searches=1)
    compiled, threads = [], set()
    original = Translator._compile

    def recording(self, shape, halvings):
        compiled.append(shape)
        threads.add(threading.current_thread().name)
        original(self, shape, halvings)

    translator._compile = recording.__get__(translator)
    done = translator.translate_all(sentences)
    first = [nbest[0].text for nbest in done.nbest]
    shapes = [(stats.rows, stats.width) for stats in done.batches]
    assert compiled == list(dict.fromkeys(shapes)) and len(compiled) >= 4
    assert all(name.startswith("compile") for name in threads)
    assert translator.translate(sentences) == first and len(compiled) == len(set(shapes))

    fresh = Translator(tiny_model(), NumberTokenizer(), SearchConfig(strategy="greedy"),
                       batch_tokens=64, searches=1)
    started, release = [], threading.Event()

    def slow(self, shape, halvings):
        started.append(shape)
        if len(started) > 1:
            release.wait(5)  # the second shape compiles while the first batch fails

    def failing(self, *args):
        raise RuntimeError("search failed")

    fresh._compile = slow.__get__(fresh)
    fresh._search_one = failing.__get__(fresh)
    with pytest.raises(RuntimeError, match="search failed"):
        fresh.translate(sentences)
    release.set()
    assert len(started) <= 2  # the rest were cancelled


def test_compile_threads_use_the_cores_except_beside_a_search_on_a_cpu(monkeypatch):
    """Compiling shapes in parallel pays where the cores are idle (a server's warm-up, a
    search on a GPU); beside a search on a CPU the search needs them."""
    from nmt.models import translator as translator_module

    monkeypatch.setattr(translator_module.os, "sched_getaffinity", lambda pid: set(range(16)))
    for cpu in (True, False):
        monkeypatch.setattr(translator_module, "cpu_backend", lambda cpu=cpu: cpu)
        assert translator_module.compile_threads(9, searching=False) == 8
        assert translator_module.compile_threads(3, searching=False) == 3
        assert translator_module.compile_threads(0, searching=False) == 1
        assert translator_module.compile_threads(9, searching=True) == (1 if cpu else 8)
    monkeypatch.setattr(translator_module.os, "sched_getaffinity", lambda pid: {0, 1})
    assert translator_module.compile_threads(9, searching=False) == 2


def test_warm_up_compiles_shapes_in_parallel_each_once_and_stops_when_told(monkeypatch):
    """A server's warm-up compiles its shapes on several threads at once (a GPU's loop
    programs take 15-22 s each), every shape once, reporting each; an exception from the
    progress callback (the server stopping) leaves the shapes not yet started uncompiled."""
    import threading
    import time

    from nmt.models import translator as translator_module

    monkeypatch.setattr(translator_module.os, "sched_getaffinity", lambda pid: {0, 1})
    translator = Translator(tiny_model(), NumberTokenizer(), SearchConfig(strategy="greedy"),
                            batch_tokens=64)
    shapes = translator.search_shapes()
    assert len(shapes) >= 4
    together = threading.Barrier(2, timeout=10)  # broken unless two compile at once
    compiled, entered, lock = [], [], threading.Lock()

    def compile_in_pairs(self, shape, halvings):
        # The first two shapes to start (counted as they enter, not as they finish: a
        # thread done with the first can start the third before the second is recorded)
        # must be compiling at the same time.
        with lock:
            entered.append(shape)
            among_first_two = len(entered) <= 2
        if among_first_two:
            together.wait()
        with lock:
            compiled.append(shape)

    monkeypatch.setattr(Translator, "_compile", compile_in_pairs)
    reports = []
    translator.warm_up(lambda done, total: reports.append((done, total)))
    assert sorted(compiled) == sorted(shapes)
    assert reports == [(done, len(shapes)) for done in range(1, len(shapes) + 1)]

    started, release = [], threading.Event()

    def slow_after_the_first(self, shape, halvings):
        with lock:
            started.append(shape)
            first = len(started) == 1
        if not first:
            release.wait(5)

    def stop(done, total):
        raise KeyboardInterrupt

    monkeypatch.setattr(Translator, "_compile", slow_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        translator.warm_up(stop)
    release.set()
    time.sleep(0.3)
    # The first, the one running beside it, perhaps one more taken up meanwhile; no more.
    assert 2 <= len(started) <= 3 < len(shapes)


def test_bfloat16_products_translate_a_peaked_model_as_float32_does():
    """translate.py --dtype bfloat16: the search loop's products take bfloat16 operands (where
    its speed comes from) and a model with clear preferences translates as in float32."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from transformer.search.programs import programs_for
    from transformer.strategies import plan_search

    full = tiny_model()
    low = Transformer(get_preset("tiny", vocab_size=64, dtype="bfloat16", **SHALLOW),
                      rngs=nnx.Rngs(1))
    nnx.update(low, nnx.state(full))  # the same parameters (stored in float32 either way)
    rng = np.random.default_rng(3)
    sentences = [" ".join(str(t) for t in rng.integers(4, 64, size=rng.integers(2, 12)))
                 for _ in range(24)]
    search = SearchConfig(beam_size=3, max_len_b=6)
    want = Translator(full, NumberTokenizer(), search).translate(sentences)
    got = Translator(low, NumberTokenizer(), search).translate(sentences)
    assert sum(a == b for a, b in zip(want, got)) >= 22, list(zip(want, got))

    graphdef, state = nnx.split(low)
    strategy = plan_search(search)
    compiled = programs_for(graphdef, state).loop(strategy)
    max_len = search.max_output_len(16, low.config.max_len)
    int32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    start = compiled.start.jitted.trace(strategy, max_len, state, int32((4, 16)), int32((4,)))
    sentences_info, searched_info = start.out_info
    loop = compiled.resume.jitted.trace(strategy, max_len, state, sentences_info,
                                        searched_info, int32(()),
                                        jax.random.key(0), None).lower().as_text()
    products = [line for line in loop.splitlines() if "stablehlo.dot_general" in line]
    low_precision = [line for line in products if "xbf16>" in line.split("->")[0]]
    # Each decoder layer's 8 projection and FFN products, and the output projection over the
    # 64-token vocabulary into float32 logits.
    assert len(low_precision) >= 8 * low.config.decoder_layers + 1, products
    assert any(line.split("->")[-1].strip().endswith("x64xf32>") for line in low_precision)


def test_a_best_hypothesis_scored_below_neg_inf_is_still_returned():
    """A model whose training blew up scores its outputs below NEG_INF (-1e9), where the
    search's unfilled n-best places lie: the best is real all the same, so every sentence has
    a translation (validation and translate.py stopped with an IndexError)."""
    import numpy as np

    from nmt.models.translator import real_hypotheses
    from transformer.search.result import SearchResult
    from transformer.search.tokens import NEG_INF

    tokens = np.array([[[5, 3, 0], [6, 3, 0]]], np.int32)
    result = SearchResult(tokens, np.array([[-1.5e10, NEG_INF]], np.float32),
                          np.array([[2, 2]], np.int32), np.array([3], np.int32), 2, 2, (1,))
    [best] = real_hypotheses(result, 0, NumberTokenizer(), eos_id=3)
    assert best.tokens == (5,) and best.score == pytest.approx(-1.5e10)


@pytest.mark.parametrize("beam", [64, 256])
def test_the_attention_memory_a_beam_is_refused_by_is_at_most_what_its_search_allocates(beam):
    """The check that refuses a beam (`check_search_memory`) must never refuse one whose
    search would fit: its figure is a lower bound of the compiled step's temporary memory, and
    it is most of it at large beams (the scores over every beam's slots dominate)."""
    from nmt.models.batch_plan import attention_bytes
    from transformer.search import compile_search

    search = SearchConfig(beam_size=beam, max_len_b=8)
    translator = Translator(tiny_model(), NumberTokenizer(), search)
    heads = translator.model_config.num_heads
    shape = translator.search_shapes()[0]
    programs = compile_search(translator.graphdef, translator.state, shape, search,
                              halvings=False)
    allocated = max(program.memory_analysis().temp_size_in_bytes for program in programs)
    one_shape = dataclasses.replace(translator.plan, batch_tokens=shape[0] * shape[1] * beam,
                                    buckets=(shape[1],))
    assert one_shape.search_shapes() == [shape]
    estimate = attention_bytes(one_shape, search, heads, translator.model_config.max_len)
    assert estimate <= allocated
    if beam == 256:
        assert estimate > allocated / 2


def test_a_beam_whose_attention_cannot_fit_is_refused_naming_one_that_fits(monkeypatch):
    from nmt.models import batch_plan
    from nmt.runtime.memory import DeviceMemory

    monkeypatch.setattr(batch_plan, "device_memory",
                        lambda: DeviceMemory("the host", 2**30, 2**30))
    Translator(tiny_model(), NumberTokenizer(), SearchConfig(beam_size=64))
    with pytest.raises(ValueError, match=r"SearchConfig.beam_size 4096 needs up to [0-9.]+ GiB .* "
                                         r"more than the 1.0 GiB free on the host; give "
                                         r"SearchConfig.beam_size (\d+) or less") as refused:
        Translator(tiny_model(), NumberTokenizer(), SearchConfig(beam_size=4096))
    fits = int(re.search(r"give SearchConfig.beam_size (\d+)", str(refused.value)).group(1))
    Translator(tiny_model(), NumberTokenizer(), SearchConfig(beam_size=fits))
    with pytest.raises(ValueError, match="needs up to"):
        Translator(tiny_model(), NumberTokenizer(), SearchConfig(beam_size=fits + 1))
    # Where the memory is unknown nothing is refused.
    monkeypatch.setattr(batch_plan, "device_memory",
                        lambda: DeviceMemory("the host", None, None))
    Translator(tiny_model(), NumberTokenizer(), SearchConfig(beam_size=4096))


def test_a_batch_whose_attention_cannot_fit_even_in_greedy_search_names_the_batch_size(
        monkeypatch):
    """Greedy search has no beam to lower: the batch's tokens are what to give less of."""
    from nmt.models import batch_plan
    from nmt.runtime.memory import DeviceMemory

    monkeypatch.setattr(batch_plan, "device_memory",
                        lambda: DeviceMemory("the host", 2**20, 2**10))
    with pytest.raises(ValueError, match=r"^a batch of 4096 source tokens \(--batch-tokens\) "
                                         r"needs up to .* more than the 0.0 GiB free on the "
                                         r"host; give a smaller --batch-tokens\.$"):
        Translator(tiny_model(), NumberTokenizer(), SearchConfig(strategy="greedy"),
                   batch_tokens=4096)
