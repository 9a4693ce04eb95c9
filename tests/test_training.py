"""Training: loss formula, schedules, overfitting, accumulation and data parallelism."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SHALLOW, xla_flags

from transformer import training
from transformer.config import get_preset
from transformer.training import OptimizerConfig

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
import multiprocess_worker as worker  # noqa: E402


def shallow_tiny(**changes):
    """The tiny preset with one layer each side: nothing here depends on depth."""
    return get_preset("tiny", **SHALLOW, **changes)


# ----------------------------------------------------------------------------- config


def test_optimizer_config_round_trips_and_validates():
    config = OptimizerConfig(schedule="inverse_sqrt", clip_norm=1.0, accum_steps=2)
    assert OptimizerConfig.from_dict(config.to_dict()) == config
    for field, value in [("schedule", "cosine"), ("warmup_steps", 0), ("accum_steps", 0),
                         ("label_smoothing", 1.0), ("clip_norm", 0.0), ("adam_b2", 1.0),
                         ("peak_lr", -1.0), ("weight_decay", -0.1), ("rdrop", -0.5),
                         ("rdrop", float("nan")), ("rdrop", float("inf"))]:
        with pytest.raises(ValueError, match=field):
            OptimizerConfig(**{field: value})
    with pytest.raises(ValueError, match="Unknown OptimizerConfig fields"):
        OptimizerConfig.from_dict({"lr": 1.0})


# ----------------------------------------------------------------------------- schedule


def test_noam_schedule_matches_the_paper_formula():
    schedule = training.learning_rate_schedule(OptimizerConfig(warmup_steps=4000, lr_scale=2.0),
                                               512)
    for count in [0, 1, 999, 3999, 4000, 15999, 100_000]:
        s = count + 1  # the paper's step number of update `count`
        expected = 2.0 * 512 ** -0.5 * min(s ** -0.5, s * 4000 ** -1.5)
        assert float(schedule(count)) == pytest.approx(expected, rel=1e-6)
    assert float(schedule(0)) > 0  # the first update is not wasted on lr = 0
    peak = 2.0 * 512 ** -0.5 * 4000 ** -0.5
    assert float(schedule(3999)) == pytest.approx(peak, rel=1e-6)


def test_inverse_sqrt_schedule():
    schedule = training.learning_rate_schedule(
        OptimizerConfig(schedule="inverse_sqrt", peak_lr=5e-4, warmup_steps=100), 512)
    for count, expected in [(0, 5e-6), (49, 2.5e-4), (99, 5e-4), (399, 2.5e-4),
                            (9999, 5e-5)]:
        assert float(schedule(count)) == pytest.approx(expected, rel=1e-6)


def test_linear_schedule_warms_up_then_reaches_zero_just_after_decay_steps():
    schedule = training.learning_rate_schedule(
        OptimizerConfig(schedule="linear", peak_lr=3e-3, warmup_steps=100, decay_steps=500), 128)
    # count c makes update s = c + 1: peak at s = 100, half way down at s = 300.5, and the
    # last update, s = 500, still learns: the line reaches zero at s = 501, never taken.
    for count, expected in [(0, 3e-5), (49, 1.5e-3), (99, 3e-3), (299, 3e-3 * 201 / 401),
                            (499, 3e-3 / 401), (500, 0.0), (10_000, 0.0)]:
        assert float(schedule(count)) == pytest.approx(expected, rel=1e-5, abs=1e-12)


@pytest.mark.parametrize("decay_steps", [100, 50])  # 2.5: test_model.py, wrongly typed
def test_linear_schedule_needs_decay_steps_past_the_warm_up(decay_steps):
    with pytest.raises(ValueError, match=r"decay_steps \(--decay-steps\) must be .* above"):
        OptimizerConfig(schedule="linear", warmup_steps=100, decay_steps=decay_steps)
    with pytest.raises(ValueError, match="needs OptimizerConfig.decay_steps"):  # unfitted
        training.learning_rate_schedule(OptimizerConfig(schedule="linear"), 128)


def test_optimizer_clips_and_decays_matrices_only():
    config = OptimizerConfig(schedule="inverse_sqrt", peak_lr=0.5, warmup_steps=1,
                             clip_norm=1.0, weight_decay=0.1)
    optimizer = training.make_optimizer(config, d_model=8)
    params = {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)}
    zero = jax.tree_util.tree_map(jnp.zeros_like, params)
    updates, _ = optimizer.update(zero, optimizer.init(params), params)
    np.testing.assert_allclose(updates["kernel"], -0.5 * 0.1 * 2.0, rtol=1e-6)  # decay only
    np.testing.assert_allclose(updates["bias"], 0.0)
    # Clipping happens before Adam: two steps with a huge then a small gradient equal plain
    # Adam fed the huge gradient scaled down to norm 1 (Adam's output depends on the ratio).
    clipped = training.make_optimizer(dataclasses.replace(config, weight_decay=0.0), d_model=8)
    plain = training.make_optimizer(
        dataclasses.replace(config, weight_decay=0.0, clip_norm=None), d_model=8)
    huge = {"kernel": jnp.full((2, 3), 1e6), "bias": jnp.zeros(3)}
    small = {"kernel": jnp.full((2, 3), 0.1), "bias": jnp.zeros(3)}
    scaled = jax.tree_util.tree_map(lambda g: g / (1e6 * math.sqrt(6)), huge)
    results = []
    for optimizer, first in [(clipped, huge), (plain, scaled)]:
        opt_state = optimizer.init(params)
        _, opt_state = optimizer.update(first, opt_state, params)
        updates, _ = optimizer.update(small, opt_state, params)
        results.append(updates["kernel"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


def test_optimizer_state_is_the_same_tree_for_every_clip_and_decay():
    """A run resumes when --clip-norm or --weight-decay changes, and the numbers are optax's
    adam and adamw (after clip_by_global_norm when clipping)."""
    base = OptimizerConfig(schedule="inverse_sqrt", peak_lr=0.1, warmup_steps=2)
    params = {"kernel": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "bias": jnp.full((3,), 0.5)}
    grads = [jax.tree_util.tree_map(lambda p, i=i: jnp.sin(p * (i + 3)) * 10 ** i, params)
             for i in range(3)]
    schedule = training.learning_rate_schedule(base, d_model=8)
    structures = set()
    for clip_norm in (None, 1.0):
        for weight_decay in (0.0, 0.1):
            config = dataclasses.replace(base, clip_norm=clip_norm, weight_decay=weight_decay)
            optimizer = training.make_optimizer(config, d_model=8)
            if weight_decay:
                reference = optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2,
                                        eps=config.adam_eps, weight_decay=weight_decay,
                                        mask=training._decay_mask)
            else:
                reference = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2,
                                       eps=config.adam_eps)
            if clip_norm:
                reference = optax.chain(optax.clip_by_global_norm(clip_norm), reference)
            state, ref_state = optimizer.init(params), reference.init(params)
            structures.add(jax.tree_util.tree_structure(state))
            for grad in grads:
                updates, state = optimizer.update(grad, state, params)
                expected, ref_state = reference.update(grad, ref_state, params)
                for name in params:
                    np.testing.assert_array_equal(updates[name], expected[name],
                                                  err_msg=f"{clip_norm} {weight_decay} {name}")
    assert len(structures) == 1, structures


# ----------------------------------------------------------------------------- loss


def _numpy_loss(logits, targets, eps):
    """The definition: cross entropy against (1-eps) on the target, eps/(V-1) elsewhere."""
    logits = logits.astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    vocab = logits.shape[-1]
    loss = nll = correct = tokens = 0.0
    for b, t in np.ndindex(targets.shape):
        y = targets[b, t]
        if y == 0:
            continue
        q = np.full(vocab, eps / (vocab - 1))
        q[y] = 1.0 - eps
        loss += -(q * log_probs[b, t]).sum()
        nll += -log_probs[b, t, y]
        correct += float(np.argmax(logits[b, t]) == y)
        tokens += 1
    return {"loss_sum": loss, "nll_sum": nll, "correct": correct, "tokens": tokens}


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_loss_matches_direct_numpy_computation(eps):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32) * 3
    targets = np.array([[4, 5, 6, 3, 0], [1, 3, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    sums = training.token_loss_sums(jnp.asarray(logits), jnp.asarray(targets), eps)
    expected = _numpy_loss(logits, targets, eps)
    for name, value in expected.items():
        assert float(sums[name]) == pytest.approx(value, rel=1e-5), name
    assert expected["tokens"] == 6


def test_padding_and_all_pad_rows_do_not_change_the_loss():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 11)).astype(np.float32)
    targets = np.array([[5, 6, 3, 0], [7, 3, 0, 0]], np.int32)
    base = training.token_loss_sums(jnp.asarray(logits), jnp.asarray(targets), 0.1)

    garbage = logits.copy()
    garbage[targets == 0] = np.float32(1e30)  # anything at padded positions is ignored
    extra_logits = np.concatenate([garbage, rng.normal(size=(1, 4, 11)).astype(np.float32)])
    extra_targets = np.concatenate([targets, np.zeros((1, 4), np.int32)])
    padded = training.token_loss_sums(jnp.asarray(extra_logits), jnp.asarray(extra_targets), 0.1)
    for name in base:
        assert float(padded[name]) == pytest.approx(float(base[name]), rel=1e-6), name


@pytest.mark.parametrize("rdrop", [0.0, 2.0])
def test_non_finite_logits_at_padding_reach_neither_the_loss_nor_its_gradient(rdrop):
    rng = np.random.default_rng(4)
    logits = jnp.asarray(rng.normal(size=(2, 5, 11)), jnp.float32)
    targets = jnp.asarray([[4, 5, 6, 3, 0], [4, 5, 6, 3, 0]], jnp.int32)  # a pair of passes
    broken = logits.at[:, 4, 0].set(jnp.nan).at[:, 4, 1].set(jnp.inf)

    def loss(x):
        return training.token_loss_sums(x, targets, 0.1, rdrop=rdrop)["loss_sum"]

    assert float(loss(broken)) == pytest.approx(float(loss(logits)), rel=1e-6)
    grad = jax.grad(loss)(broken)
    np.testing.assert_array_equal(grad[:, 4], 0.0)
    np.testing.assert_allclose(grad, jax.grad(loss)(logits), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("preset_changes", [{}, {"share_embeddings": False, "output_bias": True}],
                         ids=["tied", "own-projection-with-bias"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_chunked_loss_equals_the_whole_batch_loss_and_its_gradients(eps, preset_changes):
    """The logits a chunk at a time (every row, 2 or 3 positions: the last chunk padded),
    with their gradient taken in the forward pass, give the sums and every parameter's
    gradient of the whole-batch loss."""
    config = shallow_tiny(dropout=0.0, **preset_changes)
    mesh = training.make_mesh(jax.devices()[:1])
    graphdef, _, state = training.create_train_state(config, OptimizerConfig(), mesh)
    batch = {name: jnp.asarray(x) for name, x in worker.make_batch(3, packed=False).items()}
    rows, length = batch["tgt_out"].shape
    assert 0 < int((batch["tgt_out"] == 0).sum()) and length % 2 and length % 3

    def loss(params, chunk):
        sums = training._forward_sums(graphdef, params, batch, eps, None, loss_chunk=chunk)
        return sums["loss_sum"] / 37.0, sums

    gradients = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)  # chunk 0: whole
    whole_grads, whole = gradients(state.params, 0)
    flat_whole = jax.tree_util.tree_leaves_with_path(whole_grads)
    for positions in (2, 3):
        chunked_grads, chunked = gradients(state.params, positions * rows)
        for name in whole:
            assert float(chunked[name]) == pytest.approx(float(whole[name]), rel=1e-5), name
        flat_chunked = jax.tree_util.tree_leaves(chunked_grads)
        assert len(flat_whole) == len(flat_chunked)
        for (path, expected), got in zip(flat_whole, flat_chunked):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7,
                                       err_msg=jax.tree_util.keystr(path))
        assert any(float(jnp.abs(g).max()) > 0 for g in flat_chunked)


# ----------------------------------------------------------------------------- R-Drop


def _numpy_rdrop(logits, targets, eps, weight):
    """Liang et al.'s loss CE1 + CE2 + weight * (KL(p1||p2) + KL(p2||p1)) / 2 over rows paired
    (2i, 2i + 1), halved, with every other sum halved too."""
    both = _numpy_loss(logits, targets, eps)
    lp = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum(-1,
                                                                                  keepdims=True))
    kl = 0.0
    for pair, t in np.ndindex(targets.shape[0] // 2, targets.shape[1]):
        if targets[2 * pair, t] == 0:
            continue
        p, q = lp[2 * pair, t], lp[2 * pair + 1, t]
        kl += 0.5 * (np.sum(np.exp(p) * (p - q)) + np.sum(np.exp(q) * (q - p)))
    expected = {name: value / 2 for name, value in both.items()}
    expected["loss_sum"] += weight * kl / 2
    expected["kl_sum"] = kl
    return expected


def _paired(rng, rows, length, vocab):
    """Logits of `rows` pairs of passes that differ a little, and their (shared) targets."""
    base = rng.normal(size=(rows, length, vocab)) * 2
    logits = np.repeat(base, 2, axis=0) + rng.normal(size=(2 * rows, length, vocab)) * 0.5
    targets = rng.integers(4, vocab, (rows, length)).astype(np.int32)
    targets[0, length - 2:] = 0
    targets[-1] = 0                                   # an all-pad pair
    return logits.astype(np.float32), np.repeat(targets, 2, axis=0)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_rdrop_loss_matches_its_definition(eps):
    logits, targets = _paired(np.random.default_rng(3), 3, 5, 9)
    sums = training.token_loss_sums(jnp.asarray(logits), jnp.asarray(targets), eps, rdrop=4.0)
    expected = _numpy_rdrop(logits, targets, eps, 4.0)
    assert expected["kl_sum"] > 0.1
    for name, value in expected.items():
        assert float(sums[name]) == pytest.approx(value, rel=1e-5), name


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_rdrop_logit_gradient_in_the_forward_pass_is_autodiffs(eps):
    """The chunked loss takes its logits' gradient from a formula (the KL term's included):
    it must be what autodiff gives of the sums' definition."""
    logits, targets = _paired(np.random.default_rng(4), 3, 4, 7)
    logits, targets = jnp.asarray(logits), jnp.asarray(targets)
    autodiff = jax.grad(lambda x: training.token_loss_sums(x, targets, eps, rdrop=3.0)
                        ["loss_sum"])(logits)
    formula = training._loss_sum_logit_grads(logits, targets, eps, 0, rdrop=3.0)
    np.testing.assert_allclose(formula, autodiff, rtol=1e-4, atol=1e-6)


def test_rdrop_chunked_equals_whole_batch_with_dropout_on():
    """Two dropout passes through the model, the loss made 2 positions at a time or at once:
    the same sums and parameter gradients (the same dropout key, so the same masks)."""
    config = shallow_tiny(dropout=0.3)
    mesh = training.make_mesh(jax.devices()[:1])
    graphdef, _, state = training.create_train_state(config, OptimizerConfig(), mesh)
    batch = {name: jnp.asarray(x) for name, x in worker.make_batch(3, packed=True).items()}
    key = jax.random.key(7)

    def loss(params, chunk):
        sums = training._forward_sums(graphdef, params, batch, 0.1, key, loss_chunk=chunk,
                                      rdrop=2.0)
        return sums["loss_sum"] / 37.0, sums

    gradients = jax.jit(jax.grad(loss, has_aux=True), static_argnums=1)  # chunk 0: whole
    whole_grads, whole = gradients(state.params, 0)
    chunked_grads, chunked = gradients(state.params, 2 * 2 * batch["tgt_out"].shape[0])
    assert float(whole["kl_sum"]) > 0
    for name in whole:
        assert float(chunked[name]) == pytest.approx(float(whole[name]), rel=1e-5), name
    for expected, got in zip(jax.tree_util.tree_leaves(whole_grads),
                             jax.tree_util.tree_leaves(chunked_grads)):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-7)


def _one_step(optimizer_config, dropout, loss_chunk=None):
    config = dataclasses.replace(optimizer_config, loss_chunk=loss_chunk)
    mesh = training.make_mesh(jax.devices()[:1])
    graphdef, _, state = training.create_train_state(shallow_tiny(dropout=dropout),
                                                     config, mesh)
    step = training.make_train_step(graphdef, config, mesh)
    state, metrics = step(state, training.shard_batch(worker.make_batch(0), mesh))
    return jax.tree_util.tree_leaves(state.params), metrics


def test_rdrop_weight_zero_is_the_plain_step_exactly():
    plain_params, plain = _one_step(OptimizerConfig(), dropout=0.3)
    zero_params, zero = _one_step(OptimizerConfig(rdrop=0.0), dropout=0.3)
    assert "kl" not in zero
    for name in plain:
        assert float(zero[name]) == float(plain[name]), name
    for a, b in zip(plain_params, zero_params):
        np.testing.assert_array_equal(a, b)


def test_rdrop_step_is_finite_and_its_kl_is_zero_without_dropout(loss_chunk=64):
    """Without dropout both passes are the same computation: no KL, and the loss and
    gradient norm of the plain step. With dropout the passes differ: a positive KL, a finite
    loss. (The loss in chunks; the whole-batch loss is compared with it above.)"""
    _, plain = _one_step(OptimizerConfig(), 0.0, loss_chunk)
    _, same = _one_step(OptimizerConfig(rdrop=5.0), 0.0, loss_chunk)
    assert abs(float(same["kl"])) < 1e-6
    for name in ("loss", "nll", "accuracy", "tokens", "grad_norm"):
        assert float(same[name]) == pytest.approx(float(plain[name]), rel=1e-5), name
    _, noisy = _one_step(OptimizerConfig(rdrop=5.0), 0.3, loss_chunk)
    assert bool(noisy["is_finite"]) and float(noisy["kl"]) > 1e-4


def test_eval_step_ignores_all_pad_rows_and_longer_padding():
    """End to end through the model: appending padding columns and all-pad rows changes nothing."""
    mesh = training.make_mesh(jax.devices()[:1])
    graphdef, static_state, state = training.create_train_state(shallow_tiny(),
                                                                OptimizerConfig(), mesh)
    assert not jax.tree_util.tree_leaves(static_state)
    eval_step = training.make_eval_step(graphdef, mesh)
    batch = worker.make_batch(0, rows=4)
    widened = {name: np.pad(x, ((0, 3), (0, 2))) for name, x in batch.items()}
    sums, wide_sums = eval_step(state.params, batch), eval_step(state.params, widened)
    for name in sums:
        np.testing.assert_allclose(wide_sums[name], sums[name], rtol=1e-5, err_msg=name)
    assert float(sums["tokens"]) == (batch["tgt_out"] != 0).sum()


def test_eval_step_smooths_the_loss_as_the_training_run_does():
    """Guards make_eval_step's optimizer_config: validation loss uses the run's label smoothing
    (here none, so loss equals NLL), not OptimizerConfig()'s default 0.1."""
    mesh = training.make_mesh(jax.devices()[:1])
    optimizer_config = OptimizerConfig(label_smoothing=0.0)
    graphdef, _, state = training.create_train_state(shallow_tiny(), optimizer_config, mesh)
    sums = training.make_eval_step(graphdef, mesh, optimizer_config)(state.params,
                                                                 worker.make_batch(0, rows=4))
    assert float(sums["loss_sum"]) == pytest.approx(float(sums["nll_sum"]), rel=1e-6)


# ----------------------------------------------------------------------------- training


def test_tiny_model_overfits_a_fixed_batch():
    model_config = shallow_tiny(dropout=0.0)
    optimizer_config = OptimizerConfig(schedule="inverse_sqrt", peak_lr=3e-3, warmup_steps=30,
                                       label_smoothing=0.0)
    mesh = training.make_mesh(jax.devices()[:1])
    graphdef, _, state = training.create_train_state(model_config, optimizer_config, mesh)
    train_step = training.make_train_step(graphdef, optimizer_config, mesh)
    batch = training.shard_batch(worker.make_batch(0, packed=False), mesh)
    for _ in range(300):
        state, metrics = train_step(state, batch)
    assert bool(metrics["is_finite"])
    assert float(metrics["loss"]) < 0.05
    assert float(metrics["accuracy"]) == 1.0
    assert int(state.step) == 300
    assert float(metrics["learning_rate"]) == pytest.approx(3e-3 * math.sqrt(30 / 300), rel=1e-5)


def test_state_is_donated_and_non_finite_loss_is_flagged():
    mesh = training.make_mesh(jax.devices()[:1])
    optimizer_config = OptimizerConfig()
    graphdef, _, state = training.create_train_state(shallow_tiny(), optimizer_config, mesh)
    train_step = training.make_train_step(graphdef, optimizer_config, mesh)
    batch = training.shard_batch(worker.make_batch(0), mesh)
    old_leaves = jax.tree_util.tree_leaves(state)
    state, metrics = train_step(state, batch)
    assert bool(metrics["is_finite"])
    assert all(leaf.is_deleted() for leaf in old_leaves)  # updated in place, not copied

    broken = state.replace(params=jax.tree_util.tree_map(lambda p: p * jnp.nan, state.params))
    _, metrics = train_step(broken, batch)
    assert not bool(metrics["is_finite"])


def test_each_update_draws_new_dropout_masks():
    """Guards the dropout key fold_in(rng, step): from the same parameters, the updates of two
    different steps must see different masks (so different losses), and the same step the same."""
    mesh = training.make_mesh(jax.devices()[:1])
    optimizer_config = OptimizerConfig()
    graphdef, _, state = training.create_train_state(shallow_tiny(dropout=0.3),
                                                     optimizer_config, mesh)
    train_step = training.make_train_step(graphdef, optimizer_config, mesh)
    batch = training.shard_batch(worker.make_batch(0), mesh)
    losses = []
    for step in (0, 0, 1):
        start = jax.tree_util.tree_map(jnp.copy, state).replace(step=jnp.asarray(step, jnp.int32))
        losses.append(float(train_step(start, batch)[1]["loss"]))
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


def _close(reference: dict, other: dict, rtol=1e-5, atol=1e-6):
    """All metrics and parameters agree, except the attention key biases.

    A key bias adds the same score to every key of a query, which softmax cancels, so its
    true gradient is 0 and what is computed is rounding noise (~1e-9). Adam divides by the
    noise's own magnitude, which turns it into steps of +-lr, in a direction that depends on
    summation order; those parameters cannot agree across device counts and do not matter.
    """
    compared = 0
    for name, value in reference.items():
        if "['key']['bias']" in name:
            continue
        np.testing.assert_allclose(other[name], value, rtol=rtol, atol=atol, err_msg=name)
        compared += 1
    assert compared > 20


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_accumulating_two_micro_batches_equals_one_batch_twice_as_large(packed):
    # Without dropout: micro-batches draw their own dropout keys, a large batch draws one.
    large = worker.run(num_steps=2, dropout=0.0, accum_steps=1, devices=jax.devices()[:1],
                       packed=packed)
    accumulated = worker.run(num_steps=2, dropout=0.0, accum_steps=2,
                             devices=jax.devices()[:1], packed=packed)
    _close(large, accumulated)
    # The micro-batches of make_batch hold different numbers of tokens, which is what
    # dividing by the global count (not averaging per micro-batch) gets right.
    batch = worker.make_batch(0, packed=packed)
    assert (batch["tgt_out"][0::2] != 0).sum() != (batch["tgt_out"][1::2] != 0).sum()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(out, devices, processes=1, process_id=0, port=None, dropout=0.1):
    command = [sys.executable, os.path.join(TESTS, "multiprocess_worker.py"),
               "--devices", str(devices), "--num-processes", str(processes),
               "--process-id", str(process_id), "--dropout", str(dropout), "--out", str(out)]
    if port is not None:
        command += ["--port", str(port)]
    env = {**os.environ, "PYTHONPATH": ROOT, "XLA_FLAGS": xla_flags()}  # devices: its own
    return subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(process) -> None:
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """3 steps with dropout on one process with 4 CPU devices."""
    out = tmp_path_factory.mktemp("four") / "run.npz"
    _finish(_worker(out, devices=4))
    return dict(np.load(out))


def test_one_device_equals_four_devices_with_dropout(four_devices):
    # Dropout masks hash (key, global element index), so they do not depend on how the batch
    # is sharded; the keys themselves come from threefry splits, partitionable by default.
    assert jax.config.jax_threefry_partitionable
    one = worker.run(num_steps=3, dropout=0.1, devices=jax.devices()[:1])
    _close(one, four_devices)
    assert one["metric/loss"].shape == (3,)


def test_two_processes_equal_one_process_with_four_devices(four_devices, tmp_path):
    port = _free_port()
    outs = [tmp_path / f"process{i}.npz" for i in range(2)]
    processes = [_worker(outs[i], devices=2, processes=2, process_id=i, port=port)
                 for i in range(2)]
    for process in processes:
        _finish(process)
    for out in outs:
        _close(four_devices, dict(np.load(out)))
