"""bench.linen_baseline: the yardstick step is timed without its compilation."""

from bench import linen_baseline
from transformer.config import get_preset


def test_without_warmup_no_timed_step_includes_compiling():
    args = linen_baseline.parse_args(["--preset", "small", "--vocab", "64", "--batch", "2",
                                      "--src-len", "4", "--tgt-len", "4", "--steps", "1",
                                      "--warmup", "0"])
    record = linen_baseline.measure(args, get_preset("tiny", vocab_size=64))
    assert record["compile_s"] > 0
    assert record["step_s"] < record["compile_s"] / 5, record  # a few ms against seconds
