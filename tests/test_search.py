"""Greedy, beam and sampling search: correctness against brute force and bookkeeping."""

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from transformer.config import BEAM_RULES, SearchConfig, get_preset
from transformer.model import Transformer
from transformer.search import (
    NEG_INF,
    length_penalty,
    pad_sources,
    search,
    search_with_state,
    top_k_over_vocab,
)
from transformer.search.programs import forget_programs, programs_for
from transformer.search.tokens import allowed_scores, best_allowed
from transformer.strategies import plan_search

PAD, BOS, EOS = 0, 2, 3


def token_lists(result) -> list[list[list[int]]]:
    """[batch][nbest] hypotheses as token lists without EOS and padding."""
    return [result.token_ids(row, EOS) for row in range(len(result.tokens))]


def sharp_model(vocab: int = 64, seed: int = 0, sharpness: float = 4.0) -> Transformer:
    """A random tiny model whose next-token distributions are peaked, like a trained one's.

    A freshly initialised model predicts nearly uniform distributions, under which EOS at the
    first step always wins; scaling the (tied) embeddings makes search decisions non-trivial.
    """
    model = Transformer(get_preset("tiny", vocab_size=vocab), rngs=nnx.Rngs(seed))
    table = model.src_embedding.table.embedding
    table[...] = table[...] * sharpness
    return model


def sources(rng: np.random.Generator, lengths: list[int], vocab: int) -> np.ndarray:
    rows = [list(rng.integers(4, vocab, size=n - 1)) + [EOS] for n in lengths]
    return pad_sources(rows, PAD)


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced_logits(graphdef, state, src, tgt_in):
    """A split model's teacher-forced logits [batch, tgt_len, vocab] (jitted: eager passes
    took seconds each)."""
    model = nnx.merge(graphdef, state)
    return model.decode(model.encode(src), model.source_mask(src), tgt_in)[0]


def token_logprobs(model: Transformer, src_row: np.ndarray, hypothesis: list[int]) -> np.ndarray:
    """log p(token) [len] of each token of `hypothesis` (EOS included), teacher-forced, one
    sentence at a time. The target is padded to a multiple of 16 (few compiled shapes); the
    causal mask keeps the padding out of the positions read."""
    width = 16 * -(-len(hypothesis) // 16)
    tgt_in = np.full((1, width), PAD, np.int32)
    tgt_in[0, : len(hypothesis)] = [BOS] + hypothesis[:-1]
    logits = teacher_forced_logits(*nnx.split(model), jnp.asarray(src_row[None]), tgt_in)[0]
    logprobs = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    return logprobs[np.arange(len(hypothesis)), hypothesis]


def teacher_forced_logprobs(model: Transformer, src_row: np.ndarray,
                            hypotheses: list[list[int]]) -> np.ndarray:
    """The summed log p(token) of each of many hypotheses of one source (EOS included, BOS
    and PAD excluded), in one batched pass.

    Hypotheses are padded at the end; the causal mask keeps the padding out of the
    positions that are summed.
    """
    width = max(len(h) for h in hypotheses)
    tgt_in = np.full((len(hypotheses), width), PAD, np.int32)
    targets = np.full((len(hypotheses), width), PAD, np.int32)
    for i, hypothesis in enumerate(hypotheses):
        tgt_in[i, : len(hypothesis)] = [BOS] + hypothesis[:-1]
        targets[i, : len(hypothesis)] = hypothesis
    src = jnp.asarray(np.repeat(src_row[None], len(hypotheses), axis=0))
    logits, _ = model.decode(model.encode(src), model.source_mask(src), jnp.asarray(tgt_in))
    logprobs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    picked = np.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    return np.array([picked[i, : len(h)].sum() for i, h in enumerate(hypotheses)])


def test_beam_size_one_equals_greedy():
    rng = np.random.default_rng(0)
    for seed in range(3):
        model = sharp_model(seed=seed)
        src = sources(rng, [9, 4, 7, 2], 64)
        config = SearchConfig(max_len_a=1.0, max_len_b=6, alpha=0.0)
        greedy = search(model, src, dataclasses.replace(config, strategy="greedy"))
        beam = search(model, src, dataclasses.replace(config, beam_size=1))
        np.testing.assert_array_equal(beam.tokens, greedy.tokens)
        np.testing.assert_allclose(beam.scores, greedy.scores, atol=1e-5)
        assert (greedy.lengths > 1).any(), "degenerate model: every output is just EOS"


@pytest.mark.parametrize("penalty", ["gnmt", "power"])
def test_exact_beam_search_best_equals_exhaustive_search_up_to_length_4(penalty):
    # Vocabulary of 7: PAD, UNK, BOS, EOS and tokens 4..6, so 4 tokens may be produced
    # (UNK, 4, 5, 6) and every sequence of up to 4 tokens ending in EOS can be enumerated.
    vocab, alpha, limit = 7, 0.6, 4
    power = penalty == "power"
    producible = [1, 4, 5, 6]
    rng = np.random.default_rng(1)
    non_trivial = 0
    for seed in range(5):
        model = sharp_model(vocab=vocab, seed=seed, sharpness=6.0)
        src = sources(rng, [5, 3], vocab)
        # 64 beams hold every live prefix (at most 4^3), so the search is exhaustive.
        config = SearchConfig(beam_size=64, nbest=1, alpha=alpha, max_len_a=0, max_len_b=limit,
                              length_penalty=penalty, beam_rules="exact")
        result = search(model, src, config)
        candidates = [list(body) + [EOS] for n in range(limit)
                      for body in itertools.product(producible, repeat=n)]
        penalties = np.array([float(length_penalty(jnp.array(len(c)), alpha, power))
                              for c in candidates])
        for row in range(src.shape[0]):
            scores = teacher_forced_logprobs(model, src[row], candidates) / penalties
            best_score, best = float(scores.max()), candidates[int(scores.argmax())]
            found = result.tokens[row, 0, : result.lengths[row, 0]].tolist()
            assert found == best
            assert result.scores[row, 0] == pytest.approx(best_score, abs=1e-4)
            non_trivial += len(best) > 1
    assert non_trivial >= 2, "the brute-force optimum should not always be the empty output"


def test_length_penalty_is_the_gnmt_formula():
    """Guards lp = ((5 + len) / 6) ** alpha itself: the search tests score hypotheses with the
    module's own length_penalty, so a wrong base or exponent there passes them all."""
    lengths = np.array([1, 2, 7, 30])
    np.testing.assert_allclose(length_penalty(jnp.asarray(lengths), 0.6),
                               ((5.0 + lengths) / 6.0) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(jnp.asarray(lengths), 0.0), 1.0)


def test_power_length_penalty_is_length_to_the_alpha():
    """transformers' and CTranslate2's normaliser (SearchConfig.length_penalty = "power")."""
    lengths = np.array([1, 2, 7, 30])
    np.testing.assert_allclose(length_penalty(jnp.asarray(lengths), 1.3, power=True),
                               lengths ** 1.3, rtol=1e-6)


def constant_logits_model(logits: dict[int, float], vocab: int = 8) -> Transformer:
    """A tiny model whose next-token logits are `logits` (0 for other ids) at every step,
    whatever the source and history: the decoder's last LayerNorm outputs a fixed unit vector
    u (scale 0, bias u) and the tied embedding holds logit * u in the rows of `logits`."""
    model = Transformer(get_preset("tiny", vocab_size=vocab), rngs=nnx.Rngs(0))
    unit = jnp.zeros(model.config.d_model).at[0].set(1.0)
    norm = model.decoder_layers[-1].feed_forward_norm.norm
    norm.scale[...] = jnp.zeros_like(norm.scale[...])
    norm.bias[...] = unit
    table = jnp.zeros((vocab, model.config.d_model))
    for token, logit in logits.items():
        table = table.at[token].set(logit * unit)
    model.src_embedding.table.embedding[...] = table
    return model


def longer_wins_model() -> tuple[Transformer, np.ndarray]:
    """p(EOS) = 0.5 and p(4) = 0.45 at every step: "4 x n, EOS" scores
    (n log 0.45 + log 0.5) / lp(n + 1), which alpha = 3 makes best at a limit of 12, while
    EOS alone wins the first step. Returns the model and those 12 scores."""
    e_eos, e_four = 60.0, 54.0       # with 6 other ids at logit 0: p = 0.5, 0.45, 0.05 / 6
    model = constant_logits_model({EOS: float(np.log(e_eos)), 4: float(np.log(e_four))})
    n = np.arange(12)
    return model, (n * np.log(0.45) + np.log(0.5)) / ((5.0 + n + 1) / 6.0) ** 3.0


def test_exact_rule_goes_on_while_a_longer_hypothesis_can_still_win():
    """Guards the exact rule's bound best_live_logprob / lp(limit): bounded with the live
    prefix's current length instead, search stops after EOS wins the first step although the
    length bonus makes a longer output better."""
    model, scores = longer_wins_model()
    config = SearchConfig(beam_size=2, alpha=3.0, max_len_a=0, max_len_b=12, beam_rules="exact")
    result = search(model, sources(np.random.default_rng(9), [4], 8), config)
    best = int(scores.argmax())
    assert best == 11 and scores[best] > scores[0]
    assert result.tokens[0, 0, : result.lengths[0, 0]].tolist() == [4] * best + [EOS]
    assert result.scores[0, 0] == pytest.approx(scores[best], abs=1e-4)


@pytest.mark.parametrize("rules", ["heuristic", "k-finished", "transformers"])
def test_early_rules_stop_once_k_hypotheses_finished_where_exact_goes_on(rules):
    """The documented difference: with k = 2, "EOS" and "4 EOS" finish at the first two
    steps; the best live beam, "4 4", scored as if it ended now, (2 log 0.45) / lp(2), is
    below both, so heuristic and transformers stop, and k-finished stops on the count alone.
    They return EOS alone (score log 0.5), where exact finds "4 x 11, EOS" (previous test)."""
    model, scores = longer_wins_model()
    config = SearchConfig(beam_size=2, nbest=2, alpha=3.0, max_len_a=0, max_len_b=12,
                          beam_rules=rules)
    result = search(model, sources(np.random.default_rng(9), [4], 8), config)
    assert token_lists(result)[0] == [[], [4]]
    np.testing.assert_allclose(result.scores[0], scores[:2], atol=1e-4)
    assert result.steps == 2


@pytest.mark.parametrize("rules", BEAM_RULES)
def test_every_rule_agrees_with_exact_where_the_best_hypothesis_finishes_first(rules):
    """Without a length bonus (alpha = 0) log-probabilities only fall, so once EOS alone and
    "4 EOS" are the two best finished hypotheses no live beam can pass them: every rule
    returns exactly what exact search returns, n-best included."""
    model, _ = longer_wins_model()
    config = SearchConfig(beam_size=2, nbest=2, alpha=0.0, max_len_a=0, max_len_b=12)
    src = sources(np.random.default_rng(9), [4, 7], 8)
    exact = search(model, src, dataclasses.replace(config, beam_rules="exact"))
    result = search(model, src, dataclasses.replace(config, beam_rules=rules))
    assert token_lists(result) == [[[], [4]]] * 2
    np.testing.assert_array_equal(result.tokens, exact.tokens)
    np.testing.assert_allclose(result.scores, exact.scores, atol=1e-6)
    np.testing.assert_allclose(result.scores[0], [np.log(0.5), np.log(0.45 * 0.5)], atol=1e-4)


def test_stored_settings_with_the_former_name_of_exact_search_as_before():
    """Models saved when exact search was called "fairseq" keep searching as they did."""
    stored = SearchConfig().to_dict() | {"beam_rules": "fairseq"}
    assert SearchConfig.from_dict(stored).beam_rules == "exact"
    with pytest.raises(ValueError, match="beam_rules must be one of"):
        SearchConfig(beam_rules="fairseq")


def test_the_default_rule_is_the_heuristic_and_exact_is_never_worse():
    """exact returns the beam's best; the default may stop earlier, never with a better score
    (a higher score would mean exact's bound stopped too soon). On sharp random models the
    two agree on most sentences, and the heuristic never runs more steps."""
    assert SearchConfig().beam_rules == "heuristic"
    rng = np.random.default_rng(11)
    same = total = 0
    for seed in range(3):
        model = sharp_model(seed=seed)
        src = sources(rng, [9, 4, 7, 2, 12, 6], 64)
        config = SearchConfig(beam_size=4, alpha=1.0, max_len_a=1.0, max_len_b=8)
        heuristic = search(model, src, config)
        exact = search(model, src, dataclasses.replace(config, beam_rules="exact"))
        assert np.all(heuristic.scores[:, 0] <= exact.scores[:, 0] + 1e-5)
        assert heuristic.steps <= exact.steps
        same += int(np.sum(np.all(heuristic.tokens == exact.tokens, axis=(1, 2))))
        total += src.shape[0]
    assert same >= total // 2, f"only {same} of {total} sentences agree"


@pytest.mark.parametrize("rules", BEAM_RULES)
def test_nbest_lists_are_complete_sorted_and_scored_by_length_normalised_logprob(rules):
    model = sharp_model(seed=3)
    rng = np.random.default_rng(2)
    src = sources(rng, [8, 5, 3], 64)
    config = SearchConfig(beam_size=5, nbest=5, alpha=0.6, max_len_b=7, max_len_a=0.5,
                          beam_rules=rules)
    result = search(model, src, config)
    for row in range(src.shape[0]):
        seen = set()
        assert np.all(result.scores[row] > NEG_INF / 2), "an n-best slot is empty"
        assert np.all(np.diff(result.scores[row]) <= 1e-6), "n-best must be sorted best first"
        for rank in range(config.nbest):
            length = int(result.lengths[row, rank])
            hypothesis = result.tokens[row, rank, :length].tolist()
            assert tuple(hypothesis) not in seen, "n-best holds duplicates"
            seen.add(tuple(hypothesis))
            logprobs = token_logprobs(model, src[row], hypothesis)
            if rules == "transformers" and length == result.limits[row]:
                logprobs[-1] = 0.0  # its forced EOS adds 0
            expected = logprobs.sum() / float(length_penalty(jnp.array(length), config.alpha))
            assert result.scores[row, rank] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_outputs_that_reach_the_limit_are_kept_and_flagged_and_pad_rows_end_at_once(strategy):
    """EOS is the least likely token at every step, so every real sentence runs to its limit
    a * source + b and ends there with a forced EOS; `reached_limit` flags exactly those.
    Rows of PAD only (which fill a batch to its compiled shape) get limit 1 and must not keep
    the loop running: the search takes as many steps as the longest real limit."""
    model = constant_logits_model({EOS: -5.0, 4: 3.0, 5: 2.0})
    src = pad_sources([[6, 7, EOS], [6, EOS]], PAD, batch_size=4, width=12)
    config = SearchConfig(strategy=strategy, beam_size=2, max_len_a=1.0, max_len_b=2)
    result = search(model, src, config)
    np.testing.assert_array_equal(result.limits, [5, 4, 1, 1])
    np.testing.assert_array_equal(result.lengths[:, 0], [5, 4, 1, 1])
    np.testing.assert_array_equal(result.reached_limit(), [True, True, True, True])
    assert token_lists(result)[:2] == [[[4, 4, 4, 4]], [[4, 4, 4]]]
    assert result.steps == 5  # the longest real limit, not 14, the limit for the width



@pytest.mark.parametrize("strategy, beam", [("greedy", 1), ("beam", 4), ("beam", 1)])
def test_outputs_end_at_eos_and_are_padded_after_it(strategy, beam):
    model = sharp_model(seed=4)
    rng = np.random.default_rng(3)
    src = sources(rng, [6, 3, 9, 2, 5], 64)
    result = search(model, src, SearchConfig(strategy=strategy, beam_size=beam, nbest=1,
                                             max_len_b=5, max_len_a=1.0))
    for tokens, length in zip(result.tokens.reshape(-1, result.tokens.shape[-1]),
                              result.lengths.reshape(-1)):
        assert tokens[length - 1] == EOS
        assert EOS not in tokens[: length - 1]
        assert np.all(tokens[length:] == PAD)
        assert PAD not in tokens[:length] and BOS not in tokens[:length]


def test_length_limits_follow_a_times_source_length_plus_b_and_min_len():
    model = sharp_model(seed=5)
    rng = np.random.default_rng(4)
    src = sources(rng, [10, 3, 6], 64)  # EOS included
    src_lens = np.array([10, 3, 6])
    config = SearchConfig(beam_size=3, max_len_a=0.5, max_len_b=2)
    for strategy in ("greedy", "beam"):
        result = search(model, src, dataclasses.replace(config, strategy=strategy))
        assert np.all(result.lengths[:, 0] <= (0.5 * src_lens + 2).astype(int))
        exact = search(model, src, dataclasses.replace(config, strategy=strategy,
                                                       min_len=4, max_len_b=4, max_len_a=0))
        np.testing.assert_array_equal(exact.lengths[:, 0], [4, 4, 4])
        at_least = search(model, src, dataclasses.replace(config, strategy=strategy,
                                                          min_len=5, max_len_b=9, max_len_a=0))
        assert np.all(at_least.lengths[:, 0] >= 5) and np.all(at_least.lengths[:, 0] <= 9)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_min_len_holds_even_where_eos_is_the_likeliest_token(strategy):
    """The decoder's last LayerNorm is set to output the EOS embedding's direction, so EOS has
    the highest logit at every step: only the min_len ban keeps outputs from ending at once."""
    model = sharp_model(seed=5)
    norm = model.decoder_layers[-1].feed_forward_norm.norm
    eos_row = model.src_embedding.table.embedding[...][EOS]
    norm.scale[...] = jnp.zeros_like(norm.scale[...])
    norm.bias[...] = 20.0 * eos_row / jnp.linalg.norm(eos_row)
    src = sources(np.random.default_rng(4), [10, 3, 6], 64)
    config = SearchConfig(strategy=strategy, beam_size=3, max_len_a=0, max_len_b=9)
    assert np.all(search(model, src, config).lengths[:, 0] == 1)   # EOS first, unbanned
    lengths = search(model, src, dataclasses.replace(config, min_len=5)).lengths
    np.testing.assert_array_equal(lengths[:, 0], [5, 5, 5])


def test_batched_search_equals_one_sentence_at_a_time():
    model = sharp_model(seed=6)
    rng = np.random.default_rng(5)
    rows = [list(rng.integers(4, 64, size=n - 1)) + [EOS] for n in (11, 3, 7, 5, 14)]
    batch = pad_sources(rows, PAD)
    for config in (SearchConfig(strategy="greedy"), SearchConfig(beam_size=4, nbest=2)):
        together = token_lists(search(model, batch, config))
        # Each row alone, at the batch's width: one compiled shape (padding invariance has
        # its own tests in test_model.py).
        alone = [token_lists(search(model, batch[i : i + 1], config))[0]
                 for i in range(len(rows))]
        assert together == alone


def test_only_settings_a_search_reads_compile_a_new_program():
    # The compiled program is keyed on the settings it reads; others (sampling's in beam
    # search, the beam's in greedy search, the length limit's a and b when the loop length
    # stays) must reuse it, or translating with varied host-side settings recompiles.
    model = sharp_model(vocab=32, seed=9)
    src = sources(np.random.default_rng(8), [11, 5], 32)
    beam = SearchConfig(beam_size=3, nbest=2, max_len_a=0, max_len_b=7)
    greedy = dataclasses.replace(beam, strategy="greedy", nbest=1)

    programs = programs_for(*nnx.split(model))
    beam_resume = programs.loop(plan_search(beam)).resume
    greedy_resume = programs.loop(plan_search(greedy)).resume

    def new_programs(jitted, config: SearchConfig) -> int:
        before = jitted.programs()
        search(model, src, config)  # whole, one batch shape: one program per config
        return jitted.programs() - before

    new_programs(beam_resume, beam)
    new_programs(greedy_resume, greedy)
    assert new_programs(beam_resume, beam) == 0
    # 0.5 * 11 + 2: the same loop length (7), other per-sentence limits.
    assert new_programs(beam_resume, dataclasses.replace(
        beam, temperature=0.5, top_k=4, max_len_a=0.5, max_len_b=2)) == 0
    assert new_programs(beam_resume, dataclasses.replace(beam, beam_size=4)) == 1
    assert new_programs(beam_resume, dataclasses.replace(beam, beam_rules="transformers")) == 1
    assert new_programs(beam_resume, dataclasses.replace(beam, beam_rules="exact")) == 1
    assert new_programs(greedy_resume, dataclasses.replace(
        greedy, beam_size=6, alpha=0.1, length_penalty="power", temperature=0.5)) == 0
    assert new_programs(greedy_resume, dataclasses.replace(greedy, min_len=2)) == 1


def test_forgotten_programs_are_compiled_anew_and_search_the_same():
    # A benchmark of many models in one process drops each model's programs after it (their
    # machine code's memory maps are limited per process); a search after that compiles again.
    model = sharp_model(vocab=32, seed=3)
    src = sources(np.random.default_rng(4), [9, 6], 32)
    config = SearchConfig(beam_size=3, max_len_a=0, max_len_b=6)
    graphdef, state = nnx.split(model)
    before = programs_for(graphdef, state)
    first = search(model, src, config)
    forget_programs()
    again = programs_for(graphdef, state)
    assert again is not before and again.loop(plan_search(config)).resume.programs() == 0
    second = search(model, src, config)
    assert again.loop(plan_search(config)).resume.programs() == 1
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(second.tokens))


def test_the_beam_start_program_encodes_and_decodes_nothing():
    # Each batch shape compiles a start and a loop program before its first search; the first
    # beam step runs in the loop like every other, so the start is the encoder alone (a third
    # of its compilation when it also decoded the first position). A start with a decoder
    # step would hold logits over the vocabulary.
    vocab = 37
    model = sharp_model(vocab=vocab, seed=5)
    graphdef, state = nnx.split(model)
    src = sources(np.random.default_rng(5), [11, 5], vocab)
    config = SearchConfig(beam_size=3, max_len_a=0, max_len_b=7)
    strategy = plan_search(config)
    loop = programs_for(graphdef, state).loop(strategy)
    limits = np.full((len(src),), 7, np.int32)
    text = loop.start.jitted.trace(strategy, 7, state, src, limits).lower().as_text()
    assert f"x{vocab}xf32>" not in text
    # The loop program does hold them: the check above would see a decoder step.
    assert f"x{vocab}xf32>" in loop.resume.jitted.trace(
        strategy, 7, state, *loop.start(strategy, 7, state, src, limits),
        np.int32(0), jax.random.key(0), None).lower().as_text()


def test_a_search_call_neither_hashes_nor_rebuilds_the_model_graph(monkeypatch):
    # jit hashes static arguments at every call, and a graph's hash walks the whole model;
    # with the graph closed over (search.programs.GraphPrograms), a warm search of a split
    # model must not hash it or merge it again (40% of a server's search time when it did).
    model = sharp_model(vocab=32, seed=4)
    graphdef, state = nnx.split(model)
    src = sources(np.random.default_rng(2), [9, 4, 6, 2], 32)
    calls = []
    graph_type, merge = type(graphdef), nnx.merge
    graph_hash = graph_type.__hash__
    for config in (SearchConfig(beam_size=3, nbest=2), SearchConfig(strategy="greedy")):
        for compact in (False, True):
            warm = search_with_state(graphdef, state, src, config, compact=compact)
            with monkeypatch.context() as patch:
                patch.setattr(graph_type, "__hash__",
                              lambda self: calls.append("hash") or graph_hash(self))
                patch.setattr(nnx, "merge", lambda *a, **k: calls.append("merge") or merge(*a, **k))
                again = search_with_state(graphdef, state, src, config, compact=compact)
            assert calls == [], (config.strategy, compact, calls)
            assert token_lists(again) == token_lists(warm)


def test_finished_sentences_do_not_change_when_others_continue():
    """A sentence that finishes early is frozen: later steps of the batch leave it alone."""
    model = sharp_model(seed=7)
    rng = np.random.default_rng(6)
    short = list(rng.integers(4, 64, size=2)) + [EOS]
    long = list(rng.integers(4, 64, size=20)) + [EOS]
    config = SearchConfig(beam_size=3, nbest=3, max_len_a=1.0, max_len_b=1)
    with_long = search(model, pad_sources([short, long], PAD), config)
    alone = search(model, pad_sources([short], PAD, batch_size=1), config)
    width = alone.tokens.shape[-1]
    assert np.all(with_long.tokens[0, :, width:] == PAD)
    np.testing.assert_array_equal(with_long.tokens[0, :, :width], alone.tokens[0])
    np.testing.assert_allclose(with_long.scores[0], alone.scores[0], atol=1e-5)


def halving_row_steps(rows: int, ends: np.ndarray) -> int:
    """Row-steps of a search that halves its rows whenever at most half still search, given
    the step after which each sentence is done (the policy of `_search_in_stages`)."""
    alive = list(ends)
    width, step, total = rows, 0, 0
    while alive:
        stop_at = width // 2 if width > 1 else 0
        while sum(end > step for end in alive) > stop_at:
            step += 1
            total += width
        alive = [end for end in alive if end > step]
        while width // 2 >= len(alive) and width > 1:
            width //= 2
    return total


COMPACTED_CONFIGS = [SearchConfig(strategy="greedy"), SearchConfig(strategy="sample"),
                     SearchConfig(beam_size=3, nbest=3, max_len_a=1.0, max_len_b=1)] + [
    SearchConfig(beam_size=4, nbest=2, alpha=1.0, beam_rules=rules)
    for rules in ("exact", "k-finished", "transformers")]


@pytest.mark.parametrize("config", COMPACTED_CONFIGS,
                         ids=lambda c: f"{c.strategy}-{c.beam_rules}-{c.max_len_b}")
def test_leaving_finished_sentences_behind_changes_no_hypothesis(config):
    """Finished sentences leave the batch (8 rows -> 4 -> 2 -> 1 here): every hypothesis,
    score and length stays what searching the whole batch to the end gives, and only the
    work shrinks. A row gathered from the wrong sentence, or a finished sentence's outputs
    read after it left, changes the hypotheses."""
    model = sharp_model(seed=3)
    src = sources(np.random.default_rng(4), [2, 14, 5, 3, 9, 2, 12, 4], 64)
    compacted = search(model, src, config, rng=jax.random.key(5), compact=True)
    whole = search(model, src, config, rng=jax.random.key(5))
    np.testing.assert_array_equal(compacted.tokens, whole.tokens)
    np.testing.assert_array_equal(compacted.lengths, whole.lengths)
    np.testing.assert_allclose(compacted.scores, whole.scores, rtol=1e-5, atol=1e-5)
    assert compacted.steps == whole.steps
    assert whole.row_steps == len(src) * whole.steps
    assert compacted.row_steps < whole.row_steps
    if config.strategy != "beam":  # one hypothesis: done after as many steps as tokens
        assert compacted.row_steps == halving_row_steps(len(src), compacted.lengths[:, 0])


def test_sampling_with_top_k_1_is_greedy_and_sampling_is_seeded():
    model = sharp_model(seed=8, sharpness=1.0)
    rng = np.random.default_rng(7)
    src = sources(rng, [7, 5, 9, 4], 64)
    greedy = search(model, src, SearchConfig(strategy="greedy"))
    top1 = search(model, src, SearchConfig(strategy="sample", top_k=1), rng=jax.random.key(3))
    np.testing.assert_array_equal(top1.tokens, greedy.tokens)
    sample = SearchConfig(strategy="sample", temperature=1.5)
    a = search(model, src, sample, rng=jax.random.key(0))
    b = search(model, src, sample, rng=jax.random.key(0))
    c = search(model, src, sample, rng=jax.random.key(1))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)
    with pytest.raises(ValueError, match="rng"):
        search(model, src, sample)


def test_top_k_sampling_only_draws_from_the_k_most_likely_tokens():
    model = sharp_model(seed=9, sharpness=1.0)
    src = sources(np.random.default_rng(8), [6] * 8, 64)
    config = SearchConfig(strategy="sample", top_k=3, temperature=2.0, max_len_a=0, max_len_b=2,
                          min_len=1)
    result = search(model, src, config, rng=jax.random.key(5))
    first = result.tokens[:, 0, 0]
    srcj = jnp.asarray(src)
    logits, _ = model.decode(model.encode(srcj), model.source_mask(srcj),
                             jnp.full((8, 1), BOS))
    logits = np.asarray(logits[:, 0]).copy()
    logits[:, [PAD, BOS, EOS]] = NEG_INF  # banned at step 0 (min_len=1 forbids EOS)
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    assert all(token in allowed for token, allowed in zip(first, top3))


def test_pad_sources_pads_every_row_to_the_longest():
    padded = pad_sources([[5, EOS], [6, 7, 8, EOS]], PAD, batch_size=3)
    np.testing.assert_array_equal(padded, [[5, EOS, 0, 0], [6, 7, 8, EOS], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="batch_size"):
        pad_sources([[5], [6], [7]], PAD, batch_size=2)


@pytest.mark.parametrize("n, k", [(8000, 8), (8000, 1), (1000, 8), (7, 4), (5, 2)])
@pytest.mark.parametrize("min_len", [0, 3])
def test_best_allowed_equals_top_k_of_the_masked_vocabulary(n, k, min_len):
    """The search takes the k best allowed tokens from the k + 3 best of all: the same
    values and tokens as a top-k over logits with PAD, BOS (and EOS before min_len) masked,
    ties, rows at their limit, banned tokens among the best and vocabularies smaller than
    k + 3 included."""
    config = get_preset("tiny", vocab_size=n)
    rng = np.random.default_rng(n + k + min_len)
    for low, high in [(0, 4), (-1000, 1000)]:
        logits = rng.integers(low, high, size=(10, n)).astype(np.float32)
        logits[0, [PAD, BOS, EOS]] = 1e6             # every banned token beats the rest
        logits[1] = 7.0                              # nothing but ties
        at_limit = jnp.asarray(rng.random(10) < 0.3)
        for step in (0, 1, 5):
            step = jnp.int32(step)
            masked = allowed_scores(jnp.asarray(logits), step, at_limit, min_len, config)
            want_values, want_tokens = jax.lax.top_k(masked, k)
            values, tokens = jax.jit(best_allowed, static_argnums=(1, 4, 5))(
                jnp.asarray(logits), k, step, at_limit, min_len, config)
            np.testing.assert_array_equal(values, want_values)
            np.testing.assert_array_equal(tokens, want_tokens)


@pytest.mark.parametrize("n, k", [(8000, 8), (8000, 1), (4096, 8), (2056, 2), (1000, 8), (37, 3)])
def test_top_k_over_vocab_equals_lax_top_k_ties_included(n, k):
    """Grouped top-k must pick the same values and the same indices, also among equal values
    (random small integers make ties everywhere, NEG_INF entries mimic banned tokens)."""
    rng = np.random.default_rng(n + k)
    for low, high in [(0, 6), (-1000, 1000)]:
        scores = rng.integers(low, high, size=(12, n)).astype(np.float32)
        scores[:, rng.integers(0, n, size=n // 10)] = NEG_INF
        scores[0] = NEG_INF                      # a row with nothing but ties
        scores[1, -k:] = 1e6                     # the best entries all in the last group
        want_values, want_indices = jax.lax.top_k(jnp.asarray(scores), k)
        values, indices = jax.jit(top_k_over_vocab, static_argnums=1)(jnp.asarray(scores), k)
        np.testing.assert_array_equal(values, want_values)
        np.testing.assert_array_equal(indices, want_indices)
        assert indices.dtype == jnp.int32


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_a_min_len_beyond_32_bits_searches_as_one_at_the_models_positions(strategy):
    """Every output then ends at its limit, which gives way to no min_len; this min_len once
    ended in an OverflowError inside the compiled search."""
    model = sharp_model(seed=5)
    src = sources(np.random.default_rng(4), [10, 3, 6], 64)
    config = SearchConfig(strategy=strategy, beam_size=3, max_len_a=0.5, max_len_b=4)
    at_positions = search(model, src, dataclasses.replace(config, min_len=model.config.max_len),
                          rng=jax.random.key(0))
    beyond = search(model, src, dataclasses.replace(config, min_len=3_000_000_000),
                    rng=jax.random.key(0))
    np.testing.assert_array_equal(beyond.tokens, at_positions.tokens)
    np.testing.assert_array_equal(beyond.lengths[:, 0], [9, 5, 7])  # 0.5 x source + 4
