"""bench.products: the train step's matrix products, read from XLA's optimized program."""

from __future__ import annotations

import json

import pytest

from bench import common, products
from bench.products import Product, products_in_hlo
from transformer.config import get_preset

# Two computations, as XLA prints them: a fusion whose dot reads its parameters, and the
# entry, whose dot reads instructions of its own. Both dots are named by operand only.
HLO = """\
%fused_computation.7 (param_0.1: f32[6,5], param_1.2: f32[5,3]) -> f32[6,3] {
  %param_0.1 = f32[6,5]{1,0} parameter(0)
  %param_1.2 = f32[5,3]{1,0} parameter(1)
  ROOT %dot_general.4 = f32[6,3]{1,0} dot(%param_0.1, %param_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot_general"}
}

ENTRY %main.9 (a.1: f32[6,5], b.1: f32[5,3], q.1: bf16[2,4,7,8], k.1: bf16[2,4,11,8]) -> f32[2,4,7,11] {
  %a.1 = f32[6,5]{1,0} parameter(0)
  %b.1 = f32[5,3]{1,0} parameter(1)
  %ynn_fusion.2 = f32[6,3]{1,0} fusion(%a.1, %b.1), kind=kCustom, calls=%fused_computation.7
  %q.1 = bf16[2,4,7,8]{3,2,1,0} parameter(2)
  %k.1 = bf16[2,4,11,8]{3,2,1,0} parameter(3)
  ROOT %dot.3 = f32[2,4,7,11]{3,2,1,0} dot(%q.1, %k.1), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
}
"""


def test_products_are_read_with_their_shapes_dimensions_and_dtypes():
    found = products_in_hlo(HLO)
    plain = Product((6, 5), (5, 3), (1,), (0,), (), (), "float32", "float32", "float32")
    scores = Product((2, 4, 7, 8), (2, 4, 11, 8), (3,), (3,), (0, 1), (0, 1),
                     "bfloat16", "bfloat16", "float32")
    assert found == {plain: 1, scores: 1}
    assert plain.flops == 2 * 6 * 5 * 3
    assert scores.flops == 2 * (2 * 4) * 7 * 11 * 8


def test_a_dot_it_cannot_read_is_an_error_not_a_product_less():
    # The fusion's dot names an instruction of the entry computation: a format change, not
    # a product to skip.
    broken = HLO.replace("dot(%param_0.1, %param_1.2)", "dot(%a.1, %param_1.2)")
    with pytest.raises(ValueError, match="dot_general.4: operand shapes not found"):
        products_in_hlo(broken)
    inline_shapes = HLO.replace("dot(%q.1, %k.1)", "dot(bf16[2,4,7,8]{3,2,1,0} %q.1, %k.1)")
    with pytest.raises(ValueError, match="dot.3: cannot read its operands"):
        products_in_hlo(inline_shapes)


def test_the_benchmark_finds_every_product_of_the_step_and_a_summary_that_adds_up(capsys):
    """On the real compiled step: the products found add up to the peers' FLOP formula for
    the model, to the FLOP; each kind is reported once and timed."""
    products.main(["--preset", "tiny", "--vocab", "61", "--batch", "3", "--src-len", "7",
                   "--tgt-len", "5", "--reps", "2", "--steps", "1", "--warmup", "0"])
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *kinds, summary = records
    assert summary["system"] == "summary" and kinds
    assert all(record["system"] == "product" for record in kinds)
    assert all(record["gflops_per_s_best"] >= record["gflops_per_s"] for record in kinds)
    assert summary["products_flop"] == common.train_flops(get_preset("tiny", vocab_size=61),
                                                          3, 7, 5)
    assert summary["products"] == sum(record["count"] for record in kinds)
    assert summary["kinds"] == len(kinds) == len({record["product"] for record in kinds})
    assert summary["products_s"] == pytest.approx(
        sum(record["total_ms"] for record in kinds) / 1e3, abs=1e-5 * len(kinds))
    assert summary["products_net_s"] == pytest.approx(
        summary["products_s"] - summary["products"] * summary["dispatch_s"],
        abs=1e-5 + summary["products"] * 1e-6)
    assert summary["step_s"] > 0


@pytest.mark.parametrize("flag, value, message", [("--reps", "0", "0 is below 1"),
                                                   ("--steps", "-2", "-2 is below 1"),
                                                   ("--warmup", "-1", "-1 is below 0"),
                                                   ("--batch", "8x", "'8x' is not an integer")])
def test_counts_that_cannot_be_timed_are_refused_by_name(flag, value, message, capsys):
    with pytest.raises(SystemExit):
        products.parse_args([flag, value])
    error = capsys.readouterr().err
    assert f"argument {flag}" in error and message in error
