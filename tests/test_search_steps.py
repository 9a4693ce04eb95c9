"""The search loops driven through their seam (`transformer.search.step.StepFn`) with
scripted next-token distributions: no model, every probability known, so the results can be
checked against brute force and against hand-worked cases."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.search.beam import beam_outputs, beam_state, beam_steps
from transformer.search.greedy import greedy_outputs, greedy_state, greedy_steps
from transformer.strategies import Beam, Greedy, Sample, Stopping

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB = 6  # 4 and 5 are words; UNK may be produced too


@dataclasses.dataclass(frozen=True)
class Ids:
    pad_id: int = PAD
    bos_id: int = BOS
    eos_id: int = EOS


IDS = Ids()


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class History:
    """A scripted decoder's cache: the tokens each row was fed, [rows, max_len]. Beam search
    must move it with its beams (`follow_parents`), or a row's history is another beam's."""

    fed: jax.Array
    length: jax.Array  # []

    @classmethod
    def empty(cls, rows: int, max_len: int) -> "History":
        return cls(jnp.full((rows, max_len), PAD, jnp.int32), jnp.zeros((), jnp.int32))

    def follow_parents(self, parent: jax.Array) -> "History":
        batch, k = parent.shape
        rows = (jnp.arange(batch)[:, None] * k + parent).reshape(-1)
        return History(self.fed[rows], self.length)

    def take_rows(self, keep: jax.Array) -> "History":
        return History(self.fed[keep], self.length)


def prefix_step(table: np.ndarray):
    """A step whose log-probabilities depend on the whole prefix, not only the last token:
    table [max_len, VOCAB (first word), VOCAB (last token), VOCAB (next)]."""
    table = jnp.asarray(table)

    def step(last, cache: History):
        fed = jax.lax.dynamic_update_slice_in_dim(cache.fed, last[:, None], cache.length, 1)
        first = jnp.where(cache.length == 0, last, fed[:, 1])  # the first word after BOS
        return table[cache.length, first, last], History(fed, cache.length + 1)

    return step


def random_table(seed: int, max_len: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(0, 2, size=(max_len, VOCAB, VOCAB, VOCAB))
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # log-probabilities


def brute_force(table: np.ndarray, limit: int, alpha: float, min_len: int = 0):
    """Every hypothesis (ending in EOS, EOS forced at the limit) with its penalised score,
    best first."""
    words = [UNK, 4, 5]
    scored = []
    for length in range(1, limit + 1):
        for body in itertools.product(words, repeat=length - 1):
            if length < min_len and length < limit:
                continue
            tokens = [BOS, *body, EOS]
            logprob = sum(table[t, tokens[1] if t else tokens[0], tokens[t], tokens[t + 1]]
                          for t in range(length))
            scored.append((logprob / ((5 + length) / 6) ** alpha, list(body)))
    return sorted(scored, key=lambda s: -s[0])


def run_beam(table, strategy: Beam, limit: int, batch: int = 1):
    k, max_len = strategy.size, limit
    state = beam_state(History.empty(batch * k, max_len), batch, k, max_len, IDS)
    limits = jnp.full((batch,), limit, jnp.int32)
    done = jax.jit(beam_steps, static_argnums=(0, 2, 3, 5))(
        prefix_step(table), state, strategy, IDS, limits, max_len, jnp.int32(0))
    tokens, scores, lengths = beam_outputs(done, PAD, strategy.nbest)
    return [[tokens[b, n, :lengths[b, n] - 1].tolist() for n in range(strategy.nbest)]
            for b in range(batch)], scores


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_a_wide_exact_beam_finds_the_brute_force_best_with_its_history_moved(seed, alpha):
    """A beam as wide as every live prefix, with the exact rule, must return the brute-force
    n best; the distribution depends on the first word, so a cache not moved with its beam
    would score continuations of another hypothesis."""
    limit = 4
    table = random_table(seed, limit)
    strategy = Beam(size=27, nbest=3, alpha=alpha, stopping=Stopping.BOUND_AT_LIMIT,
                    eos_among_best_k=False)
    (found,), scores = run_beam(table, strategy, limit)
    want = brute_force(table, limit, alpha)[:3]
    assert found == [body for _, body in want]
    np.testing.assert_allclose(scores[0], [score for score, _ in want], atol=1e-4)


def test_a_beam_of_two_keeps_the_path_greedy_search_drops():
    """Hand-worked: the first step gives 4 p=0.6 and 5 p=0.4; after 4 nothing is likely
    (EOS 0.3, UNK 0.4, 5 0.3), after 5 EOS is 0.9. Greedy takes 4 UNK EOS (0.24); a beam of
    two keeps 5 and ends with 5 EOS (0.36), then 4 UNK EOS."""
    limit = 3
    table = np.full((limit, VOCAB, VOCAB, VOCAB), np.log(1e-6))
    table[0, :, BOS, 4], table[0, :, BOS, 5] = np.log(0.6), np.log(0.4 - 4e-6)
    table[1, :, 4, EOS], table[1, :, 4, UNK] = np.log(0.3), np.log(0.4)
    table[1, :, 4, 5] = np.log(0.3 - 4e-6)
    table[1, :, 5, EOS], table[1, :, 5, UNK] = np.log(0.9), np.log(0.1 - 4e-6)
    table[2, :, :, EOS] = 0.0
    (found,), scores = run_beam(table, Beam(size=2, nbest=2, alpha=0.0), limit)
    assert found == [[5], [4, UNK]]
    np.testing.assert_allclose(np.exp(scores[0]), [0.4 * 0.9, 0.6 * 0.4], rtol=1e-4)

    state = greedy_state(History.empty(1, limit), 1, limit, IDS)
    done = greedy_steps(prefix_step(table), state, Greedy(), IDS, jnp.array([limit]), limit,
                        jnp.int32(0), jax.random.key(0))
    tokens, logprob, lengths = greedy_outputs(done, PAD, 1)
    assert tokens[0, 0, :lengths[0, 0]].tolist() == [4, UNK, EOS]
    np.testing.assert_allclose(np.exp(logprob[0, 0]), 0.6 * 0.4, rtol=1e-4)


def test_k_finished_stops_at_k_hypotheses_where_exact_goes_on_to_a_better_one():
    """EOS has p 0.1 at every step and the word 4 p 0.9: at alpha 2 the longest hypothesis
    scores best, but the two that finish first are EOS and 4 EOS. k-finished (k = 2) stops
    there; exact goes on and finds the brute-force best, 4 4 4 4 EOS."""
    limit = 5
    table = np.full((limit, VOCAB, VOCAB, VOCAB), np.log(1e-6))
    table[:, :, :, EOS] = np.log(0.1)
    table[:, :, :, 4] = np.log(0.9 - 4e-6)
    early = Beam(size=2, nbest=1, alpha=2.0, stopping=Stopping.K_FINISHED)
    exact = dataclasses.replace(early, stopping=Stopping.BOUND_AT_LIMIT, eos_among_best_k=False)
    (early_found,), _ = run_beam(table, early, limit)
    (exact_found,), exact_scores = run_beam(table, exact, limit)
    best_score, best = brute_force(table, limit, 2.0)[0]
    assert best == [4, 4, 4, 4] and exact_found == [best]
    np.testing.assert_allclose(exact_scores[0, 0], best_score, atol=1e-4)
    assert early_found == [[4]]  # the better of the two that finished first


def test_at_the_limit_eos_is_forced_and_scored_by_its_own_probability_unless_free():
    """A distribution that never ends: every hypothesis runs to the limit, where EOS (p 1e-6)
    is forced; its log-probability counts, except with `forced_eos_free` (transformers)."""
    limit = 3
    table = np.full((limit, VOCAB, VOCAB, VOCAB), np.log(1e-6))
    table[:, :, :, 4] = math.log(1 - 5e-6)
    (found,), scores = run_beam(table, Beam(size=2, alpha=0.0), limit)
    assert found == [[4, 4]]
    np.testing.assert_allclose(scores[0, 0], 2 * math.log(1 - 5e-6) + math.log(1e-6),
                               rtol=1e-5)
    (_,), free = run_beam(table, Beam(size=2, alpha=0.0, forced_eos_free=True), limit)
    np.testing.assert_allclose(free[0, 0], 2 * math.log(1 - 5e-6), atol=1e-5)


def run_greedy_steps(table, strategy, seed: int, limit: int, rows: int = 64):
    """greedy_outputs (tokens, scores, lengths) of `rows` rows searched under `strategy`."""
    state = greedy_state(History.empty(rows, limit), rows, limit, IDS)
    done = greedy_steps(prefix_step(table), state, strategy, IDS, jnp.full((rows,), limit),
                        limit, jnp.int32(0), jax.random.key(seed))
    return greedy_outputs(done, PAD, 1)


def test_sampling_at_a_low_temperature_follows_the_likeliest_token_and_top_k_bounds_draws():
    """The step's distribution is all the sampler sees: at temperature 0.01 it draws the
    likeliest token, and with top_k 1 nothing else either; every draw is an allowed token."""
    limit = 6
    table = random_table(3, limit)

    def run(strategy, seed):
        return run_greedy_steps(table, strategy, seed, limit)[0][:, 0]

    greedy = run(Greedy(), 0)
    assert (run(Sample(temperature=0.01), 1) == greedy).all()
    assert (run(Sample(top_k=1), 2) == greedy).all()
    drawn = run(Sample(), 3)
    assert not (drawn == greedy).all()  # full temperature: other paths are taken
    assert not np.isin(drawn, [BOS]).any()
    for row in drawn:
        ends = np.flatnonzero(row == EOS)
        assert len(ends) == 1 and (row[ends[0] + 1:] == PAD).all() and (row[:ends[0]] != PAD).all()


def test_no_temperature_lets_a_banned_token_be_drawn():
    """Banned tokens stay banned at any temperature: 1e9 must not lift their NEG_INF to the
    others' level, and 1e-39 (every score / T overflowing) must still follow greedy, not
    draw token 0 (PAD)."""
    limit = 6
    table = random_table(4, limit)

    def run(strategy, seed):
        return run_greedy_steps(table, strategy, seed, limit)

    greedy = run(Greedy(), 0)[0][:, 0]
    tiny_t, tiny_scores, _ = run(Sample(temperature=1e-39), 1)
    assert (tiny_t[:, 0] == greedy).all() and (tiny_scores > -100).all()
    for seed in range(3):
        tokens, scores, _ = run(Sample(temperature=1e9, min_len=2), seed)
        assert (scores > -1000).all()
        for row in tokens[:, 0]:
            ends = np.flatnonzero(row == EOS)
            assert len(ends) == 1 and ends[0] >= 1 and not np.isin(row[:ends[0]], [PAD, BOS]).any()
