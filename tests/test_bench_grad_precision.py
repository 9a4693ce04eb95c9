"""bench.grad_precision: per-parameter gradient error of the bfloat16 paths against float32."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from bench.grad_precision import gradients, make_batch, relative_errors, summary


def encoded(sources, targets):
    return datasets.Dataset.from_dict({"src_ids": sources, "tgt_ids": targets})


def test_batch_holds_the_first_pairs_that_fit_with_bos_eos_and_padding():
    sources = [[5, 6], [7] * 9, [8]]
    targets = [[9], [10], [11, 12, 13]]
    batch = make_batch(encoded(sources, targets), rows=5, width=4)
    np.testing.assert_array_equal(batch["src"], [[5, 6, 3, 0], [8, 3, 0, 0]])
    np.testing.assert_array_equal(batch["tgt_in"], [[2, 9, 0, 0], [2, 11, 12, 13]])
    np.testing.assert_array_equal(batch["tgt_out"], [[9, 3, 0, 0], [11, 12, 13, 3]])
    assert make_batch(encoded(sources, targets), rows=1, width=4)["src"].shape == (1, 4)


def test_no_pair_fitting_the_width_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--width 2"):
        make_batch(encoded([[5, 6, 7]], [[8, 9]]), rows=4, width=2)


@pytest.fixture(scope="module")
def tiny_batch():
    rng = np.random.default_rng(0)
    ids = lambda n: [[int(i) for i in rng.integers(4, 64, size=n)] for _ in range(8)]  # noqa: E731
    return make_batch(encoded(ids(5), ids(6)), rows=8, width=8)


def test_float32_gradients_are_their_own_reference(tiny_batch):
    reference = gradients("tiny", 64, tiny_batch, "float32", "float32")
    errors = relative_errors(gradients("tiny", 64, tiny_batch, "float32", "float32"), reference)
    assert errors and max(errors.values()) == 0.0
    assert not any(path.endswith("key/bias") for path in errors)
    assert any("embedding" in path for path in errors)


def test_bfloat16_gradients_differ_by_rounding_not_more(tiny_batch):
    reference = gradients("tiny", 64, tiny_batch, "float32", "float32")
    errors = relative_errors(gradients("tiny", 64, tiny_batch, "bfloat16", "bfloat16"),
                             reference)
    result = summary(errors, worst=2)
    assert 0.0 < result["median_rel_err"] < 0.05
    assert len(result["worst"]) == 2 and result["worst"][0][1] >= result["worst"][1][1]
    assert 0.0 < result["embedding_rel_err"] < 0.05
