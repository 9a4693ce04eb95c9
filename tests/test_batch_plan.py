"""nmt.models.batch_plan.BatchPlan: how calls become search batches, without a model."""

import random

import numpy as np
import pytest

from data.config import INFERENCE_BUCKETS, buckets_up_to
from data.tokenizer import SpecialIds
from nmt.models.batch_plan import BatchPlan

SPECIAL = SpecialIds()


def plan(rows_per_sentence: int = 4, batch_tokens: int = 4096, on_cpu: bool = True,
         buckets=buckets_up_to(256, INFERENCE_BUCKETS)) -> BatchPlan:
    return BatchPlan(batch_tokens, tuple(buckets), rows_per_sentence, on_cpu)


def calls(seed: int, count: int, longest: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[5] * rng.randrange(1, longest) for _ in range(count)]


def test_small_calls_get_a_small_power_of_two_budget_on_a_cpu():
    def budget(rows: list[int], rows_per_sentence: int = 4, on_cpu: bool = True) -> int:
        return plan(rows_per_sentence, on_cpu=on_cpu).budget([[5] * n for n in rows])

    assert budget([3]) == 4  # (3 + EOS) * beam 4 = 16 beam tokens -> 4 source tokens
    assert budget([4]) == 8  # 20 beam tokens round up to 32
    assert budget([63, 63]) == 128  # 512 beam tokens
    assert budget([3] * 1000) == 1024  # never above the user's 4096 / beam 4
    assert budget([3], rows_per_sentence=1) == 4
    # On a GPU or TPU every call gets the whole budget: one batch shape per width.
    assert budget([3], on_cpu=False) == 1024
    assert budget([3], rows_per_sentence=1, on_cpu=False) == 4096


@pytest.mark.parametrize("on_cpu", [True, False])
@pytest.mark.parametrize("rows_per_sentence", [1, 4])
def test_every_batch_of_any_call_has_a_shape_of_search_shapes(on_cpu, rows_per_sentence):
    """What the server compiles before it is ready must cover every call it can get."""
    batch_plan = plan(rows_per_sentence, batch_tokens=2048, on_cpu=on_cpu)
    shapes = set(batch_plan.search_shapes())
    for seed, count in enumerate((1, 2, 5, 16, 33, 200, 1000)):
        for longest in (4, 40, 255):  # the translator cuts longer sources to max_len
            for src, index in batch_plan.call_batches(calls(seed, count, longest), SPECIAL):
                assert src.shape in shapes, (count, longest, src.shape)
    assert sorted(shapes, key=lambda s: (s[1], s[0])) == batch_plan.search_shapes()


def test_off_a_cpu_each_width_has_one_row_count():
    batch_plan = plan(rows_per_sentence=4, batch_tokens=4096, on_cpu=False)
    widths = [width for _, width in batch_plan.search_shapes()]
    assert widths == sorted(set(widths)) == list(batch_plan.buckets)
    assert dict((w, r) for r, w in batch_plan.search_shapes())[16] == 1024 // 16


def test_a_call_that_fits_one_batch_on_a_cpu_is_one_batch_in_input_order():
    batch_plan = plan(rows_per_sentence=4, batch_tokens=2048)
    ids = [[9] * 40] + [[5] * n for n in (3, 7, 2)]  # widths 48 and 16
    ((src, index),) = batch_plan.call_batches(ids, SPECIAL)
    assert src.shape[1] == 48 and src.shape[0] in batch_plan.row_counts(48)
    np.testing.assert_array_equal(index[:4], [0, 1, 2, 3])
    assert (index[4:] == -1).all() and (src[4:] == SPECIAL.pad).all()
    assert [int((row != SPECIAL.pad).sum()) for row in src[:4]] == [41, 4, 8, 3]  # + EOS
    # The width's full budget is ten rows (2048 / 4 // 48); sixteen still make one search.
    assert {10, 16} <= batch_plan.row_counts(48)
    assert len(batch_plan.call_batches([[9] * 40] * 16, SPECIAL)) == 1


def test_a_large_call_is_cut_by_length_and_every_sentence_is_in_one_batch_once():
    batch_plan = plan(rows_per_sentence=4, batch_tokens=1024)
    ids = calls(7, 300, 60)
    batches = batch_plan.call_batches(ids, SPECIAL)
    assert len(batches) > 1
    seen = np.concatenate([index[index >= 0] for _, index in batches])
    assert sorted(seen.tolist()) == list(range(len(ids)))
    for src, index in batches:
        assert src.shape[0] * src.shape[1] <= 1024 // 4 or src.shape[0] == 1
        for row, i in zip(src, index):
            if i >= 0:
                assert int((row != SPECIAL.pad).sum()) == len(ids[i]) + 1
