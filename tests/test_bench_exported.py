"""bench.exported searches CTranslate2 and transformers' export under the output limit and
source length that ours and `translate.py --engine ctranslate2` use: greedy outputs agree."""

import json
import sys

import pytest

pytest.importorskip("ctranslate2")

from bench import exported  # noqa: E402


def test_greedy_of_the_exports_agrees_with_ours_also_past_the_models_positions(
        run_dir, tmp_path, monkeypatch, capsys, caplog):
    from translate_model import sentences

    # The tiny model has 64 positions: the last source is cut, as every engine cuts it.
    long = " ".join(sentences(4, seed=5, min_words=8))
    lines = [*sentences(4, seed=2), long]
    for lang, text in (("de", lines), ("en", lines)):
        (tmp_path / f"test.{lang}").write_text("\n".join(text) + "\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", [
        "exported", "--model", str(run_dir), "--test-prefix", str(tmp_path / "test"),
        "--src", "de", "--tgt", "en", "--beam", "2", "--dtypes", "float32",
        "--compute-types", "float32", "--inter-threads", "1", "--threads", "1"])
    exported.main()
    assert "test set line 5: a sentence of" in caplog.text
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [ct2] = [r for r in records if r["system"] == "ctranslate2 float32"
             and r["search"] == "greedy"]
    assert ct2["greedy_identical"] == len(lines)
    [marian] = [r for r in records if r["system"] == "transformers"]
    assert marian.get("greedy_identical", len(lines)) == len(lines), marian  # or "skipped"
