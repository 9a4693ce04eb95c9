"""Packed batches: whole pairs in fixed-width rows, each pair exactly once per epoch, and a
packed batch that trains exactly as its pairs padded one per row."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from data.batching import (
    BatchIterator,
    Examples,
    PlannedBatch,
    batch_arrays,
    plan_batches,
    plan_stats,
)
from data.config import BatchConfig, DataError
from data.packing import PackedBatch, fit_width, pack_epoch, pack_rows, packed_arrays
from data.store import TokenStore
from transformer.config import get_preset
from transformer.layers import MultiHeadAttention, Packing
from transformer.model import Transformer
from transformer.training import _forward_sums

BOS, EOS, PAD = 2, 3, 0


def _pairs(src: list[list[int]], tgt: list[list[int]]) -> Examples:
    """Encoded pairs (ids without EOS or BOS) as the batching reads them."""
    return Examples.of_store(TokenStore.from_lists(src, tgt))


def _random_pairs(n: int, seed: int, longest: int = 12, vocab: int = 64) -> Examples:
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, vocab, rng.integers(1, longest))) for _ in range(n)]
    tgt = [list(rng.integers(4, vocab, rng.integers(1, longest))) for _ in range(n)]
    return _pairs(src, tgt)


# ----------------------------------------------------------------------------- layout


def test_a_hand_made_row_holds_ids_segments_and_positions():
    pairs = _pairs(src=[[11, 12], [13], [14, 15, 16]], tgt=[[21], [22, 23, 24], [25, 26]])
    batch = PackedBatch.of_rows(10, (np.array([0, 1]), np.array([2]), np.array([], int)))
    out = packed_arrays(pairs, batch)
    np.testing.assert_array_equal(out["src"], [[11, 12, EOS, 13, EOS, 0, 0, 0, 0, 0],
                                               [14, 15, 16, EOS, 0, 0, 0, 0, 0, 0],
                                               [0] * 10])
    np.testing.assert_array_equal(out["tgt_in"], [[BOS, 21, BOS, 22, 23, 24, 0, 0, 0, 0],
                                                  [BOS, 25, 26, 0, 0, 0, 0, 0, 0, 0],
                                                  [0] * 10])
    np.testing.assert_array_equal(out["tgt_out"], [[21, EOS, 22, 23, 24, EOS, 0, 0, 0, 0],
                                                   [25, 26, EOS, 0, 0, 0, 0, 0, 0, 0],
                                                   [0] * 10])
    np.testing.assert_array_equal(out["src_segments"], [[1, 1, 1, 2, 2, 0, 0, 0, 0, 0],
                                                        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
                                                        [0] * 10])
    np.testing.assert_array_equal(out["src_positions"], [[0, 1, 2, 0, 1, 0, 0, 0, 0, 0],
                                                         [0, 1, 2, 3, 0, 0, 0, 0, 0, 0],
                                                         [0] * 10])
    np.testing.assert_array_equal(out["tgt_segments"], [[1, 1, 2, 2, 2, 2, 0, 0, 0, 0],
                                                        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
                                                        [0] * 10])
    np.testing.assert_array_equal(out["tgt_positions"], [[0, 1, 0, 1, 2, 3, 0, 0, 0, 0],
                                                         [0, 1, 2, 0, 0, 0, 0, 0, 0, 0],
                                                         [0] * 10])


def test_every_pair_of_an_epoch_is_in_one_row_whole():
    pairs = _random_pairs(500, seed=1, longest=30)
    config = BatchConfig(batch_tokens=640, max_len=32, num_devices=4, seed=3)
    for epoch in (0, 1):
        plan = pack_epoch(pairs.src_len, pairs.tgt_len, config, epoch)
        assert {len(b.rows) for b in plan} == {config.rows_per_batch} == {20}
        rows = [row for batch in plan for row in batch.rows]
        placed = np.concatenate(rows)
        assert sorted(placed.tolist()) == list(range(500))  # each pair once, none split
        for row in rows:
            assert pairs.src_len[row].sum() <= 32 and pairs.tgt_len[row].sum() <= 32
    first, second = (pack_epoch(pairs.src_len, pairs.tgt_len, config, e)[0] for e in (0, 1))
    assert [r.tolist() for r in first.rows] != [r.tolist() for r in second.rows]
    stats = plan_stats(pairs, config)
    assert stats.num_shapes == 1 and stats.all_pad_rows < config.rows_per_batch


def test_packing_is_deterministic_and_resumable():
    pairs = _random_pairs(300, seed=2)
    config = BatchConfig(batch_tokens=256, max_len=16, seed=5)
    first = BatchIterator(pairs, config, process_index=0, process_count=1)
    batches = [next(first) for _ in range(12)]
    resumed = BatchIterator(pairs, config, state={"epoch": 0, "position": 5},
                            process_index=0, process_count=1)
    for expected in batches[5:]:
        got = next(resumed)
        assert got.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])


def test_processes_read_their_own_rows():
    pairs = _random_pairs(200, seed=4)
    config = BatchConfig(batch_tokens=256, max_len=16, num_devices=2)
    batch = pack_epoch(pairs.src_len, pairs.tgt_len, config, 0)[0]
    whole = batch_arrays(pairs, batch)
    halves = [batch_arrays(pairs, batch, process_index=i, process_count=2) for i in range(2)]
    for key in whole:
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])


def test_width_and_budget_errors_name_both_values():
    with pytest.raises(DataError, match=r"--pack-width 16 is narrower than the longest pair "
                                        r"kept \(--max-tokens-per-sentence 32"):
        BatchConfig(max_len=32, pack_width=16)
    with pytest.raises(DataError, match=r"a batch of 100 tokens .* holds 1 packed rows of "
                                        r"width 64 \(--pack-width\), fewer than the 2 it needs "
                                        r".* --batch-tokens 128"):
        BatchConfig(batch_tokens=100, max_len=32, pack_width=64, num_devices=2)
    with pytest.raises(DataError, match="longer than the row width 8"):
        pack_rows(np.array([9]), np.array([3]), np.array([0]), 8)


def test_the_row_budget_is_checked_at_the_corpus_width_not_max_len():
    # 128 tokens hold 2 rows of max_len 64 but 5 of the corpus's width 24: 4 devices fit.
    pairs = _random_pairs(200, seed=6, longest=20)
    assert max(pairs.src_len.max(), pairs.tgt_len.max()) == 20
    config = BatchConfig(batch_tokens=128, max_len=64, num_devices=4)
    fitted = fit_width(config, pairs.src_len, pairs.tgt_len)
    assert (fitted.width, fitted.rows_per_batch) == (24, 4)
    assert {b.num_rows for b in pack_epoch(pairs.src_len, pairs.tgt_len, fitted, 0)} == {4}
    too_small = dataclasses.replace(config, batch_tokens=64)
    with pytest.raises(DataError, match=r"a batch of 64 tokens .* holds 2 packed rows of width "
                                        r"24 \(the longest pair kept, rounded up to a multiple "
                                        r"of 8\), fewer than the 4 it needs .* --batch-tokens 96 "
                                        r"or more, or lower --max-tokens-per-sentence"):
        fit_width(too_small, pairs.src_len, pairs.tgt_len)
    # A config never fitted to a corpus refuses to plan rather than make batches of 0 rows.
    with pytest.raises(DataError, match=r"holds 1 packed rows of width 64 "
                                        r"\(--max-tokens-per-sentence\), fewer than the 4"):
        pack_epoch(pairs.src_len, pairs.tgt_len, too_small, 0)


# ----------------------------------------------------------------------------- the model


def _model(seed: int = 0) -> Transformer:
    config = get_preset("tiny", vocab_size=64, dropout=0.0)
    return Transformer(config, rngs=nnx.Rngs(seed))


def _both_layouts(pairs, rows: tuple[np.ndarray, ...], width: int):
    """The same pairs packed in `rows`, and padded one pair per row."""
    packed = packed_arrays(pairs, PackedBatch.of_rows(width, rows))
    order = np.concatenate(rows)
    padded = batch_arrays(pairs, PlannedBatch(width, width, order))
    return {k: jnp.asarray(v) for k, v in packed.items()}, \
        {k: jnp.asarray(v) for k, v in padded.items()}, order


def test_a_packed_batch_has_the_loss_and_gradients_of_its_pairs_padded():
    pairs = _random_pairs(12, seed=5, longest=7)
    rows = tuple(pack_rows(pairs.src_len, pairs.tgt_len, np.arange(12), 16))
    assert max(len(r) for r in rows) >= 2  # several pairs share rows
    packed, padded, _ = _both_layouts(pairs, rows, 16)
    graphdef, params = nnx.split(_model(), nnx.Param)

    def loss(params, batch):
        sums = _forward_sums(graphdef, params, batch, 0.1, None)
        return sums["loss_sum"], sums

    (_, sums_p), grads_p = jax.value_and_grad(loss, has_aux=True)(params, packed)
    (_, sums_u), grads_u = jax.value_and_grad(loss, has_aux=True)(params, padded)
    assert float(sums_p["tokens"]) == float(sums_u["tokens"]) == float(pairs.tgt_len.sum())
    for key in ("loss_sum", "nll_sum", "correct"):
        np.testing.assert_allclose(sums_p[key], sums_u[key], rtol=1e-5)
    for (path, g_p), g_u in zip(jax.tree_util.tree_leaves_with_path(grads_p),
                                jax.tree.leaves(grads_u)):
        np.testing.assert_allclose(g_p, g_u, rtol=1e-4, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))


def test_each_pair_of_a_packed_row_gets_the_logits_it_gets_alone():
    pairs = _random_pairs(6, seed=6, longest=6)
    rows = (np.arange(3), np.arange(3, 6))
    packed, _, _ = _both_layouts(pairs, rows, 24)
    model = _model(1)
    logits = model(packed["src"], packed["tgt_in"], packing=Packing.of(packed))
    for r, row in enumerate(rows):
        start = 0
        for pair in row:
            alone = batch_arrays(pairs, PlannedBatch(8, 8, np.array([pair])))
            own = model(jnp.asarray(alone["src"]), jnp.asarray(alone["tgt_in"]))
            length = int(pairs.tgt_len[pair])
            np.testing.assert_allclose(logits[r, start:start + length], own[0, :length],
                                       atol=2e-5, rtol=1e-5)
            start += length


def test_attention_never_crosses_pairs():
    pairs = _random_pairs(4, seed=7, longest=5)
    packed, _, _ = _both_layouts(pairs, (np.arange(4),), 24)
    packing = Packing.of(packed)
    src_seg, tgt_seg = packed["src_segments"][0], packed["tgt_segments"][0]
    model = _model(2)
    # Encoder-decoder attention of every decoder layer.
    cross = np.asarray(model.cross_attention_weights(packed["src"], packed["tgt_in"], packing))
    real = np.asarray(tgt_seg != 0)  # the queries of pairs; padding's outputs are not used
    other = np.asarray(tgt_seg[:, None] != src_seg[None, :]) & real[:, None]
    assert other.sum() > 100 and np.all(cross[:, 0][..., other] == 0.0)
    np.testing.assert_allclose(cross[:, 0].sum(-1)[..., real], 1.0, rtol=1e-5)
    # Self-attention with the encoder's and the decoder's masks.
    attention = MultiHeadAttention(model.config, rngs=nnx.Rngs(3))
    x = jax.random.normal(jax.random.key(0), (1, 24, model.config.d_model))
    for mask, segments in ((packing.encoder_mask(), src_seg), (packing.decoder_mask(), tgt_seg)):
        query, (key, value) = attention.project_query(x), attention.project_key_value(x)
        _, weights = attention.attend(query, key, value, mask, return_weights=True)
        crossing = np.asarray((segments[:, None] != segments[None, :]) & (segments != 0)[:, None])
        assert crossing.sum() > 100 and np.all(np.asarray(weights)[0][:, crossing] == 0.0)
    decoder = np.asarray(packing.decoder_mask())[0, 0]
    assert not np.any(np.triu(decoder, k=1))  # and causal within each pair


def test_positions_restart_at_every_pair():
    pairs = _pairs(src=[[5, 6], [7]], tgt=[[8], [9, 10]])
    packed = packed_arrays(pairs, PackedBatch.of_rows(6, (np.array([0, 1]),)))
    model = _model()
    table = np.asarray(model.positional(jnp.zeros((1, 6, model.config.d_model)),
                                        positions=jnp.asarray(packed["src_positions"])))[0]
    alone = np.asarray(model.positional(jnp.zeros((1, 3, model.config.d_model))))[0]
    np.testing.assert_array_equal(table[:3], alone[:3])   # pair 1: positions 0, 1, 2
    np.testing.assert_array_equal(table[3:5], alone[:2])  # pair 2 starts again at 0


def test_bucketed_batches_stay_available():
    pairs = _random_pairs(100, seed=8)
    config = dataclasses.replace(BatchConfig(batch_tokens=256, max_len=16), packing=False)
    plan = plan_batches(pairs, config, 0)
    assert all(isinstance(batch, PlannedBatch) for batch in plan)


def test_packed_bfloat16_and_the_cudnn_path(monkeypatch):
    """bfloat16 trains packed rows like float32; cuDNN's kernel gets every mask spelled out
    over [batch, 1, queries, keys] (here a stand-in: the kernel needs an NVIDIA GPU)."""
    pairs = _random_pairs(8, seed=9, longest=6)
    rows = tuple(pack_rows(pairs.src_len, pairs.tgt_len, np.arange(8), 16))
    packed, _, _ = _both_layouts(pairs, rows, 16)
    config = get_preset("tiny", vocab_size=64, dropout=0.0)
    params = nnx.state(Transformer(config, rngs=nnx.Rngs(0)), nnx.Param)

    def loss(overrides):
        model_config = dataclasses.replace(config, **overrides)
        graphdef, _ = nnx.split(Transformer(model_config, rngs=nnx.Rngs(0)), nnx.Param)
        sums = _forward_sums(graphdef, params, packed, 0.0, None)
        return float(sums["loss_sum"] / sums["tokens"])

    bf16 = {"dtype": "bfloat16", "activation_dtype": "bfloat16"}
    xla_bf16 = loss(bf16)
    assert xla_bf16 == pytest.approx(loss({}), rel=2e-2)
    seen = []
    fused = jax.nn.dot_product_attention

    def cudnn_stand_in(query, key, value, mask=None, implementation=None):
        assert implementation == "cudnn"
        seen.append(mask.shape)
        return fused(query, key, value, mask=mask)

    monkeypatch.setattr(jax.nn, "dot_product_attention", cudnn_stand_in)
    assert loss({**bf16, "attention_impl": "cudnn"}) == xla_bf16
    rows_, width = packed["src"].shape
    assert len(seen) == config.encoder_layers + 2 * config.decoder_layers
    assert all(shape == (rows_, 1, width, width) for shape in seen), seen


def test_batches_use_the_tokenizers_ids():
    """Marian's ids (EOS 0, pad last, the decoder starting from pad): packed and bucketed
    batches alike are built with the examples' ids, not this project's 0/2/3."""
    from data.tokenizer import SpecialIds

    marian = SpecialIds(pad=9, unk=1, bos=9, eos=0)
    pairs = dataclasses.replace(_pairs([[5, 6], [7]], [[4], [8, 5]]), ids=marian)
    packed = packed_arrays(pairs, PackedBatch.of_rows(8, (np.array([0, 1]),)))
    np.testing.assert_array_equal(packed["src"], [[5, 6, 0, 7, 0, 9, 9, 9]])
    np.testing.assert_array_equal(packed["tgt_in"], [[9, 4, 9, 8, 5, 9, 9, 9]])
    np.testing.assert_array_equal(packed["tgt_out"], [[4, 0, 8, 5, 0, 9, 9, 9]])
    padded = batch_arrays(pairs, PlannedBatch(4, 4, np.array([0, 1])))
    np.testing.assert_array_equal(padded["src"], [[5, 6, 0, 9], [7, 0, 9, 9]])
    np.testing.assert_array_equal(padded["tgt_in"], [[9, 4, 9, 9], [9, 8, 5, 9]])
    np.testing.assert_array_equal(padded["tgt_out"], [[4, 0, 9, 9], [8, 5, 0, 9]])
