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
    assert ct2["batch_sentences"] == 64  # CTranslate2's max_batch_size, the default
    [marian] = [r for r in records if r["system"] == "transformers"]
    assert marian.get("greedy_identical", len(lines)) == len(lines), marian  # or "skipped"


def test_an_end_to_end_command_that_fails_is_a_record_and_a_long_sentence_is_cut(
        run_dir, tmp_path, monkeypatch, capsys):
    """CTranslate2's script cuts a sentence past the model's 64 positions as translate.py
    does (uncut, CTranslate2 aborts), and a command that fails (here: no reference file) is
    one "failed" record; the others still run."""
    from argparse import Namespace

    from nmt.convert.ctranslate2 import export_ctranslate2
    from nmt.models.model_files import read_model_files
    from translate_model import sentences

    monkeypatch.setattr(exported, "SHELL_SENTENCE", " ".join(sentences(4, seed=5, min_words=8)))
    (tmp_path / "test.de").write_text("\n".join(sentences(3, seed=2)) + "\n", encoding="utf-8")
    monkeypatch.setattr(exported, "engine_end_to_end", lambda *args: [])  # translate.py's own
    _, _, values = read_model_files(run_dir)
    args = Namespace(test_prefix=str(tmp_path / "test"), src="de", tgt="en", dtypes=[],
                     compute_types=["float32"], inter_threads=[1], threads=1, beam=2,
                     batch_sentences=8, bleu_tokenize=None, repeats=1, device="cpu",
                     model=str(run_dir))
    ct2 = export_ctranslate2(run_dir, tmp_path / "ct2", "float32")
    failed = exported.end_to_end(args, ct2, values["search"], values, {"sentences": 3})
    test_set, one = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert failed == 1
    assert "failed (1)" in test_set["failed"] and "test.en" in test_set["failed"]
    assert test_set["batch_sentences"] == one["batch_sentences"] == 8
    assert "failed" not in one and one["output"] and one["seconds"] > 0


def test_repeated_reports_the_median_of_an_even_number_of_runs(monkeypatch):
    times = iter([4.0, 1.0, 3.0, 2.0])
    monkeypatch.setattr(exported, "wall", lambda *args: (next(times), "out"))
    assert exported.repeated(4, ["cmd"], {}) == {"seconds": 2.5, "runs": [4.0, 1.0, 3.0, 2.0],
                                                 "output": "out"}
