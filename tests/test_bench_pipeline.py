"""bench.pipeline's layouts: its bare command (docs/performance.md) runs, with packed rows
as wide as --max-len and twice it unless --pack-widths names them."""

import pytest

from bench import pipeline


@pytest.mark.parametrize("flags, widths", [([], [128, 256]), (["--max-len", "64"], [64, 128]),
                                           (["--pack-widths", "160"], [160])])
def test_the_packed_widths_hold_every_pair_kept(flags, widths, monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(pipeline, "MULTI30K", tmp_path)  # a corpus there, never read
    monkeypatch.setattr(pipeline, "bench_corpus", lambda name, spec, args, extra: seen.append(
        [name for name, _ in pipeline.layouts(args)]) or [])
    pipeline.main(flags)
    assert seen == [["bucketed", *(f"packed {width}" for width in widths)]]


def test_a_width_narrower_than_max_len_is_refused(capsys):
    with pytest.raises(SystemExit) as refused:
        pipeline.main(["--pack-widths", "64,128"])
    assert refused.value.code == 2
    assert "--pack-widths [64] narrower than --max-len 128" in capsys.readouterr().err
