"""translate.py as a user runs it: arguments, stdin, files, n-best, errors, evaluation, plots.

Every run is a subprocess on a tiny untrained model (tests/translate_model.py). The runs share
one JAX compilation cache (FLAX_NMT_CACHE in a temporary directory), so each search shape is
compiled once per session. Expected translations come from `Translator` in this process,
one sentence per call, so a CLI run that batches, sorts and chunks must reproduce them.
Checks that end before anything is translated (bad paths, damaged model files) and the
evaluation's bookkeeping (with a fake translator) run in this process: no JAX start-up each.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from data.config import DataError
from data.lines import stream_chunks
from nmt.translation import command as translate_cli, evaluation, streams
from translate_model import SEARCH, search_config, sentences

REPO = Path(__file__).resolve().parents[1]
LONG = " ".join(["fahrrad"] * 70)  # 70+ pieces, more than the tiny model's 63
BATCH = ["--batch-tokens", 64]  # several batches per call; the shapes of `expected`
LONG_LINE = 24  # 1-based line number of LONG in LINES
EMPTY_LINE = 10


def _lines() -> list[str]:
    lines = sentences(38, seed=5, max_words=5)  # short: few bucket widths to compile
    lines.insert(EMPTY_LINE - 1, "")
    lines.insert(LONG_LINE - 1, LONG)
    return lines


LINES = _lines()


@pytest.fixture(scope="module")
def expected(run_dir, env) -> list[str]:
    """Each line of LINES translated alone (`translate_alone`)."""
    return translate_alone(run_dir, env, LINES)


def translate_alone(run_dir: Path, env: dict[str, str], lines: list[str]) -> list[str]:
    """Each line translated alone (one `Translator.translate` call per line) with the
    model's stored search settings and --batch-tokens 64, the batch shapes the CLI tests use.

    Computed in a subprocess that fills the shared compilation cache, which keeps this
    process's JAX configuration untouched and lets the CLI runs start without compiling.
    """
    code = (
        "import json, sys\n"
        "from nmt.translation.command import enable_compilation_cache\n"
        "from nmt.models.model_dir import load_model\n"
        "from nmt.models.translator import Translator\n"
        "enable_compilation_cache()\n"
        "model, tokenizer, values = load_model(sys.argv[1])\n"
        "translator = Translator(model, tokenizer, values['search'], batch_tokens=64)\n"
        "lines = json.load(sys.stdin)\n"
        "print(json.dumps([translator.translate([line])[0] for line in lines]))\n")
    result = subprocess.run([sys.executable, "-c", code, str(run_dir)], cwd=REPO, env=env,
                            input=json.dumps(lines), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _run(args: list, env: dict[str, str], input: bytes | None = None, timeout: int = 240
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "translate.py", *map(str, args)], cwd=REPO, env=env,
                          input=input, capture_output=True, timeout=timeout)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _out_lines(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, _text(result.stderr)
    return _text(result.stdout).split("\n")[:-1]


def _stdin(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


# ----------------------------------------------------------------------------- in-process


def _parse(*argv: str) -> argparse.Namespace:
    return translate_cli.build_parser().parse_args(["--model", "m", *argv])


def test_search_flags_override_the_stored_config():
    stored = search_config()
    assert translate_cli.search_config(stored, _parse()) == stored
    config = translate_cli.search_config(stored, _parse("--beam", "5", "--alpha", "1",
                                                        "--max-len-a", "1.5", "--max-len-b", "3",
                                                        "--min-len", "2", "--nbest", "4"))
    assert (config.beam_size, config.alpha, config.max_len_a, config.max_len_b, config.min_len,
            config.nbest, config.strategy) == (5, 1.0, 1.5, 3, 2, 4, "beam")
    assert translate_cli.search_config(stored, _parse("--greedy")).strategy == "greedy"
    sample = translate_cli.search_config(stored, _parse("--sample", "--temperature", "0.7",
                                                        "--top-k", "10"))
    assert (sample.strategy, sample.temperature, sample.top_k) == ("sample", 0.7, 10)
    with pytest.raises(ValueError, match="nbest"):
        translate_cli.search_config(stored, _parse("--nbest", str(SEARCH["beam_size"] + 1)))
    with pytest.raises(ValueError, match="beam search"):
        translate_cli.search_config(stored, _parse("--greedy", "--nbest", "2"))
    with pytest.raises(ValueError, match="--sample"):
        translate_cli.search_config(stored, _parse("--top-k", "5"))


def test_stream_chunks_take_waiting_lines_and_block_only_when_none():
    read_fd, write_fd = os.pipe()
    try:
        chunks = stream_chunks(read_fd, max_lines=3)
        os.write(write_fd, b"a\nb\nc\nd\ne\npartial")
        assert next(chunks) == (1, ["a", "b", "c"])
        assert next(chunks) == (4, ["d", "e"])  # waits for no more than what is there
        # Nothing complete is waiting: the reader blocks until a line arrives.
        threading.Timer(0.2, os.write, (write_fd, b" line\r\nlast")).start()
        assert next(chunks) == (6, ["partial line"])
        os.close(write_fd)
        write_fd = -1
        assert next(chunks) == (7, ["last"])  # a last line without "\n" counts
        assert next(chunks, None) is None
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_stream_chunks_name_the_line_with_invalid_utf8():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"ok\nfine\n" + b"x\n" * 5 + b"bad \xff\n")
    os.close(write_fd)
    chunks = stream_chunks(read_fd, max_lines=4)
    assert next(chunks) == (1, ["ok", "fine", "x", "x"])
    assert next(chunks) == (5, ["x", "x", "x"])  # the lines before the bad one
    with pytest.raises(DataError, match=r"<stdin> line 8: invalid UTF-8"):
        next(chunks)
    os.close(read_fd)


def test_stream_chunks_warn_of_carriage_returns_inside_a_line(caplog):
    """Old Mac line endings on stdin are one line, as from a file: said once, where first."""
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"Ein Mann.\r\nZwei.\nEins.\rZwei.\rDrei.\rVier.\nAuch\rhier.\n")
    os.close(write_fd)
    with caplog.at_level(logging.WARNING, logger="data"):
        chunks = list(stream_chunks(read_fd, max_lines=2))
    os.close(read_fd)
    assert [line for _, lines in chunks for line in lines][2:] == [
        "Eins.\rZwei.\rDrei.\rVier.", "Auch\rhier."]
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith("<stdin> line 3: a carriage return (\\r) inside the line")
    assert "tr '\\r' '\\n'" in warning


def test_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.de"
    path.write_bytes("\ufeffEin Hund.\nZwei.\n".encode())
    assert streams.read_lines(path) == ["Ein Hund.", "Zwei."]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, "\ufeffEin Hund.\nZwei.\n".encode())
    os.close(write_fd)
    assert list(stream_chunks(read_fd, max_lines=1)) == [(1, ["Ein Hund."]),
                                                                       (2, ["Zwei."])]
    os.close(read_fd)


def test_evaluation_keeps_every_pair_of_a_dataset_or_test_file(tmp_path):
    """Pairs with an empty side stay (an empty source scores an empty hypothesis) and nothing
    is stripped, exactly as the same pairs read with --src-file/--ref-file: a test-only
    dataset, a .tsv, a .jsonl and a .parquet --test-file all give the same pairs."""
    import datasets

    sources = ["Der Hund läuft.", "", " Zwei Kinder. ", "Die Katze."]
    references = ["The dog runs.", "Empty.", "Two children.", ""]
    test = datasets.Dataset.from_dict({"de": sources, "en": [r or None for r in references]})
    datasets.DatasetDict({"test": test}).save_to_disk(str(tmp_path / "hf"))
    model_values = {"source_lang": "de", "target_lang": "en"}
    by_dataset = evaluation.evaluation_data(
        _parse("--evaluate", "--dataset", str(tmp_path / "hf")), model_values)
    assert by_dataset == (sources, references, f"{tmp_path / 'hf'}[test] de->en")
    (tmp_path / "test.de").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    (tmp_path / "test.en").write_text("".join(r + "\n" for r in references), encoding="utf-8")
    by_files = evaluation.evaluation_data(
        _parse("--evaluate", "--src-file", str(tmp_path / "test.de"), "--ref-file",
               str(tmp_path / "test.en")), {})
    assert by_files[:2] == by_dataset[:2]

    pairs = list(zip(sources, references))
    (tmp_path / "test.tsv").write_text("".join(f"{s}\t{r}\n" for s, r in pairs),
                                       encoding="utf-8")
    (tmp_path / "test.jsonl").write_text("".join(
        json.dumps({"translation": {"de": s, "en": r}}) + "\n" for s, r in pairs),
        encoding="utf-8")
    test.to_parquet(str(tmp_path / "test.parquet"))
    for name in ("test.tsv", "test.jsonl", "test.parquet"):
        by_test_file = evaluation.evaluation_data(
            _parse("--evaluate", "--test-file", str(tmp_path / name)), model_values)
        assert by_test_file == (sources, references, f"{tmp_path / name} de->en"), name
    with pytest.raises(translate_cli.UsageError, match="test.jsonl needs --src and --tgt"):
        evaluation.evaluation_data(
            _parse("--evaluate", "--test-file", str(tmp_path / "test.jsonl")), {})
    with pytest.raises(translate_cli.UsageError, match="exactly one of"):
        translate_cli.check_args(_parse("--evaluate", "--test-file", "t.tsv", "--test-prefix",
                                        "t"))



def test_a_test_files_messages_speak_of_translate_pys_flags(tmp_path, caplog):
    """A --test-file line without its target, and a CSV-quoted field, are told in
    translate.py's words: its own flags for aligned files (it has no --train-prefix), and the
    quotes translated and scored (not trained on)."""
    tsv = tmp_path / "test.tsv"
    tsv.write_text("Ein Mann.\tA man.\nDie Katze.\n", encoding="utf-8")
    with pytest.raises(translate_cli.InputError) as raised:
        evaluation.evaluation_data(_parse("--evaluate", "--test-file", str(tsv)), {})
    assert str(raised.value) == (
        f"{tsv} line 2: the target column is missing (no TAB); add a TAB and the target to "
        "that line, or give the pairs as aligned text files with --test-prefix PREFIX or "
        "--src-file with --ref-file")
    tsv.write_text('"Ein ""Mann"""\tA man.\n', encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="data"):
        evaluation.evaluation_data(_parse("--evaluate", "--test-file", str(tsv)), {})
    assert [r for r in caplog.records if "the quotes are read as text (translated and scored)"
            in r.getMessage() and "trained" not in r.getMessage()]

def _fake_translator():
    """Translates by upper-casing, with the interface run_evaluation uses."""
    def translate_all(lines, progress=None, first_line=1, source=""):
        return SimpleNamespace(nbest=[[SimpleNamespace(text=line.upper(), score=0.0)]
                                      for line in lines], reached_limit=[])

    return SimpleNamespace(translate_all=translate_all, search=search_config(),
                           describe=lambda: "fake float32")


def test_split_sentences_is_on_unless_a_mode_gives_each_lines_own_results():
    for flags in (["--nbest", "2"], ["--plot-attention", "a.png", "Hallo."],
                  ["--score", "--test-prefix", "t"]):
        with pytest.raises(translate_cli.UsageError,
                           match=f"--split-sentences .* does not apply with {flags[0]}"):
            translate_cli.check_args(_parse("--split-sentences", *flags))
        args = _parse(*flags)  # not asked for: off
        translate_cli.check_args(args)
        assert args.split_sentences is False
    for flags in (["Hallo. Tschüss."], ["--evaluate", "--src-file", "a", "--ref-file", "b"]):
        args = _parse(*flags)
        translate_cli.check_args(args)
        assert args.split_sentences is True
    args = _parse("--no-split-sentences", "Hallo. Tschüss.")
    translate_cli.check_args(args)
    assert args.split_sentences is False
    with pytest.raises(translate_cli.UsageError, match="--html .* does not apply with --evaluate"):
        translate_cli.check_args(_parse("--html", "--evaluate", "--src-file", "a",
                                        "--ref-file", "b"))



def test_evaluate_splits_lines_with_nbest_as_without_it(tmp_path):
    """--evaluate scores the best hypothesis of each line (fairseq-generate's rule), so --nbest
    changes the search only: lines are split as without it, --split-sentences is accepted
    with it, and --no-split-sentences still turns splitting off."""
    source, reference = tmp_path / "test.de", tmp_path / "test.en"
    source.write_text("Ein Mann. Eine Frau.\n", encoding="utf-8")
    reference.write_text("EIN MANN. EINE FRAU.\n", encoding="utf-8")
    evaluate = ["--evaluate", "--src-file", str(source), "--ref-file", str(reference), "-q"]
    for flags, split in ((["--nbest", "1"], True), (["--nbest", "2", "--split-sentences"], True),
                         (["--nbest", "1", "--no-split-sentences"], False)):
        args = _parse(*evaluate, *flags)
        translate_cli.check_args(args)
        assert args.split_sentences is split, flags
        calls = []

        def translate_all(lines, **kwargs):
            calls.append(list(lines))
            return SimpleNamespace(nbest=[[SimpleNamespace(text=line.upper(), score=0.0)]
                                          for line in lines], reached_limit=[])

        translator = SimpleNamespace(translate_all=translate_all, search=search_config(),
                                     describe=lambda: "fake float32")
        report, _ = evaluation.run_evaluation(translator, args, {}, io.StringIO())
        assert calls == ([["Ein Mann.", "Eine Frau."]] if split else [["Ein Mann. Eine Frau."]])
        assert report["split_sentences"] is split and "seed" not in report


def test_the_report_records_the_splitting_and_the_seed_of_a_sample(tmp_path):
    source, reference = tmp_path / "test.de", tmp_path / "test.en"
    source.write_text("ein mann fährt fahrrad\n", encoding="utf-8")
    reference.write_text("EIN MANN FÄHRT FAHRRAD\n", encoding="utf-8")
    report_file = tmp_path / "report.json"
    args = _parse("--evaluate", "--src-file", str(source), "--ref-file", str(reference),
                  "--no-split-sentences", "--sample", "--seed", "7", "--report",
                  str(report_file), "-q")
    translate_cli.check_args(args)
    translator = _fake_translator()
    translator.search = search_config(strategy="sample", nbest=1)
    evaluation.run_evaluation(translator, args, {}, io.StringIO())
    report = json.loads(report_file.read_text())
    assert (report["split_sentences"], report["seed"], round(report["bleu"])) == (False, 7, 100)

def test_split_lines_are_translated_in_one_call_and_records_name_lines():
    """All sentences of a chunk go to one call, told the input line of each sentence, so
    that its truncation warnings and output-limit records name input lines, not places in
    that call."""
    calls = []

    def translate_all(sentences, progress=None, first_line=1, source="", line_numbers=None):
        calls.append((list(sentences), list(line_numbers), source))
        return SimpleNamespace(
            nbest=[[SimpleNamespace(text=s.upper(), score=0.0)] for s in sentences],
            reached_limit=[n for n, s in zip(line_numbers, sentences) if "limit" in s])

    translator = SimpleNamespace(translate_all=translate_all)
    lines = [" One. Two!\t", "", "Long one. At the limit.", "  ", "A limit. Long too."]
    done = []
    out, reached = streams.translate_paragraphs(translator, lines, "in.de", 11, "en",
                                                done.append)
    assert out == [" ONE. TWO!\t", "", "LONG ONE. AT THE LIMIT.", "  ", "A LIMIT. LONG TOO."]
    assert calls == [(["One.", "Two!", "Long one.", "At the limit.", "A limit.", "Long too."],
                      [11, 11, 13, 13, 15, 15], "in.de")]
    assert done == [5]
    assert reached == [13, 15]
    assert streams.translate_paragraphs(translator, ["", " "], "in.de", 1, "en") == (
        ["", " "], [])
    assert len(calls) == 1  # blank lines need no call


def test_split_lines_are_joined_with_the_target_languages_spaces():
    """A Japanese line's sentences, which touch, come back spaced in English (--tgt or the
    model's target language)."""
    english = {"今日は晴れです。": "It is sunny today.", "明日は雨でしょう！": "It will rain!"}

    def translate_all(sentences, progress=None, first_line=1, source="", line_numbers=None):
        return SimpleNamespace(nbest=[[SimpleNamespace(text=english[s], score=0.0)]
                                      for s in sentences], reached_limit=[])

    translator = SimpleNamespace(translate_all=translate_all)
    out, _ = streams.translate_paragraphs(translator, ["今日は晴れです。明日は雨でしょう！"],
                                          "in.ja", 1, "ja", target="en")
    assert out == ["It is sunny today. It will rain!"]
    args = argparse.Namespace(split_sentences=True, html=False, src=None, tgt=None)
    assert translate_cli.paragraphs(args, {"source_lang": "ja", "target_lang": "en"}) == (
        streams.Paragraphs("ja", False, "en"))
    args.tgt = "de"
    assert translate_cli.paragraphs(args, {}) == streams.Paragraphs("en", False, "de")


def _reitet_ein_mann():
    """The alignment of "Reitet ein Mann." with "A man rides.": target word j attends to
    source word [2, 0, 1, 3][j]."""
    from nmt.models.alignment import Alignment

    weights = np.eye(4, dtype=np.float32)[[2, 0, 1, 3]]
    return Alignment([(0, 1), (2, 5), (6, 11), (11, 12)],
                     [(0, 6), (7, 10), (11, 15), (15, 16)], weights)


def test_html_lines_keep_inline_tags_around_the_words_the_alignment_gives():
    """--html: each line is HTML; a sentence with inline tags is translated once, whole, and
    the translator's alignment of it with its translation places the tags."""
    calls = []

    def translate_all(sentences, progress=None, first_line=1, source="", line_numbers=None):
        calls.append(list(sentences))
        translated = {"A man rides.": "Reitet ein Mann.", "Bye.": "Tschüss."}
        return SimpleNamespace(nbest=[[SimpleNamespace(text=translated[s], score=0.0)]
                                      for s in sentences], reached_limit=[])

    def align(sources, targets):
        assert (sources, targets) == (["A man rides."], ["Reitet ein Mann."])
        return [_reitet_ein_mann()]

    translator = SimpleNamespace(translate_all=translate_all, align=align)
    lines = ['<p>A <b>man</b> <a href="/x">rides</a>.</p>', "<ul><li>Bye.</li></ul>"]
    out, _ = streams.translate_paragraphs(translator, lines, "in.html", 1, "en", html=True)
    # The link goes with "rides" to the front, <b> stays around "man".
    assert out == ['<p><a href="/x">Reitet</a> ein <b>Mann</b>.</p>', "<ul><li>Tschüss.</li></ul>"]
    assert calls == [["A man rides.", "Bye."]]


def test_sentences_without_letters_are_their_own_translations_never_searched_or_aligned():
    """A sentence without letters (a number, a bullet) comes back as it is, as on the
    server, with its tags where they were under --html: the model, which would make words of
    it, never sees it, no alignment is asked for it, and the sentence after it still gets
    its own alignment."""
    searched = []

    def translate_all(sentences, progress=None, first_line=1, source="", line_numbers=None):
        searched.append((list(sentences), list(line_numbers)))
        translated = {"A man rides.": "Reitet ein Mann.", "One.": "Eins."}
        return SimpleNamespace(nbest=[[SimpleNamespace(text=translated[s], score=0.0)]
                                      for s in sentences], reached_limit=[])

    aligned = []

    def align(sources, targets):
        aligned.append((list(sources), list(targets)))
        return [_reitet_ein_mann()]

    translator = SimpleNamespace(translate_all=translate_all, align=align)
    lines = ["<p><b>12</b> 345 678</p>", '<p>A <b>man</b> <a href="/x">rides</a>.</p>']
    out, _ = streams.translate_paragraphs(translator, lines, "in.html", 1, "en", html=True)
    assert out == ["<p><b>12</b> 345 678</p>", '<p><a href="/x">Reitet</a> ein <b>Mann</b>.</p>']
    assert searched == [(["A man rides."], [2])]
    assert aligned == [(["A man rides."], ["Reitet ein Mann."])]
    searched.clear()
    out, _ = streams.translate_paragraphs(translator, ["12 345", "• 3.", "One."], "in.de", 1,
                                          "en")
    assert out == ["12 345", "• 3.", "Eins."]
    assert searched == [(["One."], [3])]
    # Into Japanese, the spaces after them stay: "1. 2.3." would read as another number.
    out, _ = streams.translate_paragraphs(translator, ["1. 2. 3.", "One. 100%. One."], "in.de",
                                          1, "en", target="ja")
    assert out == ["1. 2. 3.", "Eins.100%. Eins."]


def _upper_translator(calls: list) -> SimpleNamespace:
    """A translator that upper-cases each sentence and records the sentences and their line
    numbers of each call."""
    def translate_all(sentences, progress=None, first_line=1, source="", line_numbers=None):
        calls.append((list(sentences), list(line_numbers)))
        return SimpleNamespace(nbest=[[SimpleNamespace(text=s.upper(), score=0.0)]
                                      for s in sentences], reached_limit=[])

    return SimpleNamespace(translate_all=translate_all)


def test_html_input_is_one_document_whose_scripts_comments_and_kept_elements_span_lines():
    """--html reads its lines as one page: a script, style, comment or translate="no"
    element over several lines (and chunks) stays as written, the text around them is
    translated, and each input line gives one output line, its sentences told their line."""
    page = ["<html><head><style>", "p { color: red; }", "</style>", "<script>",
            'if (a < b) { alert("Hello world."); }', "</script></head><body>", "<!--",
            "Internal note.", "-->", "<p>A man rides.", "A dog runs.</p>",
            '<p translate="no">', "Keep this.", "</p>", "</body></html>"]
    chunks = [(1, page[:5]), (6, page[5:8]), (9, page[8:])]  # cut inside each element
    calls, out = [], io.StringIO()
    count, _ = streams.translate_chunks(_upper_translator(calls), chunks, out, "page.html",
                                        False, paragraphs=streams.Paragraphs("en", html=True))
    assert count == len(page)
    translated = {10: "<p>A MAN RIDES.", 11: "A DOG RUNS.</p>"}
    assert out.getvalue().splitlines() == [translated.get(n, line)
                                           for n, line in enumerate(page, 1)]
    assert calls == [(["A man rides.", "A dog runs."], [10, 11])]


def test_scores_are_printed_before_the_files_are_written(tmp_path):
    source, reference = tmp_path / "test.de", tmp_path / "test.en"
    source.write_text("ein mann fährt fahrrad\nzwei kinder spielen am strand\n",
                      encoding="utf-8")
    reference.write_text("EIN MANN FÄHRT FAHRRAD\nZWEI KINDER SPIELEN AM STRAND\n",
                         encoding="utf-8")
    hyp_file = tmp_path / "missing" / "hyp.en"  # cannot be written: the scores must be out
    args = _parse("--evaluate", "--src-file", str(source), "--ref-file", str(reference),
                  "--hyp-file", str(hyp_file), "--quiet")
    out = io.StringIO()
    with pytest.raises(OSError):
        evaluation.run_evaluation(_fake_translator(), args, {}, out)
    assert out.getvalue().startswith("BLEU = 100.00 ")


def test_a_bleu_tokenizer_that_cannot_run_fails_before_translating(tmp_path, monkeypatch):
    mecab = pytest.importorskip("sacrebleu.tokenizers.tokenizer_ja_mecab")
    monkeypatch.setattr(mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    source, reference = tmp_path / "test.en", tmp_path / "test.ja"
    source.write_text("a cat .\n", encoding="utf-8")
    reference.write_text("猫 。\n", encoding="utf-8")

    def translate_all(*args, **kwargs):
        raise AssertionError("BLEU's tokenizer must be checked before translating")

    translator = SimpleNamespace(translate_all=translate_all, search=search_config())
    args = _parse("--evaluate", "--src-file", str(source), "--ref-file", str(reference))
    with pytest.raises(translate_cli.UsageError, match=r"ja-mecab \(sacreBLEU's choice for "
                                                       r"target language 'ja'\).*sacrebleu\[ja\]"):
        evaluation.run_evaluation(translator, args, {"target_lang": "ja"}, io.StringIO())
    for flags, message in ((["--score"], "does not apply with --score"),
                           (["Hello."], "only applies with --evaluate")):
        if flags == ["--score"]:
            flags += ["--src-file", str(source), "--ref-file", str(reference)]
        with pytest.raises(translate_cli.UsageError, match=f"--bleu-tokenize {message}"):
            translate_cli.check_args(_parse(*flags, "--bleu-tokenize", "char"))


def test_bad_paths_fail_before_the_model_loads(tmp_path, monkeypatch):
    def no_model():
        raise AssertionError("the model must not be loaded before the paths are checked")

    monkeypatch.setattr(translate_cli, "enable_compilation_cache", no_model)
    three, two = tmp_path / "three.de", tmp_path / "two.en"
    (tmp_path / "no-model").mkdir()  # there, but never read: the paths fail first
    three.write_text("a\nb\nc\n")
    two.write_text("a\nb\n")
    evaluate = ["--evaluate", "--src-file", three, "--ref-file", three]
    usage, fault = translate_cli.UsageError, translate_cli.InputError  # exit status 2, 1
    for argv, error, message in [
        ([*evaluate, "--hyp-file", tmp_path / "missing" / "hyp.en"], usage,
         f"--hyp-file {tmp_path / 'missing' / 'hyp.en'}: directory {tmp_path / 'missing'} "
         "does not exist"),
        ([*evaluate, "--report", tmp_path], usage, f"--report {tmp_path}: is a directory"),
        (["--evaluate", "--src-file", three, "--ref-file", two], fault,
         f"{three} has 3 lines but {two} has 2"),
        (["--evaluate", "--src-file", tmp_path / "none.de", "--ref-file", two], fault,
         f"{tmp_path / 'none.de'}: file not found"),
        (["--output", tmp_path / "missing" / "out.en", "Hallo."], usage, "--output"),
        (["--output", "", "Hallo."], usage, "--output was given an empty path"),  # was stdout
        (["--plot-attention", "", "Hallo."], usage, "--plot-attention was given an empty"),
        # An empty path to read names its flag, not the current directory it would mean.
        (["--input", ""], usage, "--input was given an empty path; give a file name, or -"),
        (["--model", "", "Hallo."], usage, "--model was given an empty path; give a run"),
        (["--evaluate", "--src-file", "", "--ref-file", two], usage,
         "--src-file was given an empty path"),
        (["--evaluate", "--src-file", two, "--ref-file", ""], usage,
         "--ref-file was given an empty path"),
        (["--evaluate", "--test-prefix", ""], usage, "--test-prefix was given an empty path"),
        (["--score", "--test-file", ""], usage, "--test-file was given an empty path"),
        (["--evaluate", "--dataset", ""], usage, "--dataset was given an empty path"),
    ]:
        args = translate_cli.build_parser().parse_args(
            ["--model", str(tmp_path / "no-model"), *map(str, argv)])
        with pytest.raises(error) as info:
            translate_cli.run(args)
        assert message in str(info.value)


def test_a_test_prefix_in_the_models_languages_is_read_before_it_loads(run_dir, tmp_path,
                                                                       monkeypatch):
    """Without --src/--tgt the languages come from the model's config.json, read without its
    weights: a missing test file is named before the model loads, as with the flags."""
    def no_model():
        raise AssertionError("the model must not be loaded before the test set is read")

    monkeypatch.setattr(translate_cli, "enable_compilation_cache", no_model)
    for flag in ("--evaluate", "--score"):
        args = translate_cli.build_parser().parse_args(
            ["--model", str(run_dir), flag, "--test-prefix", str(tmp_path / "test")])
        with pytest.raises(translate_cli.InputError, match=r"test\.de: file not found"):
            translate_cli.run(args)


@pytest.mark.parametrize("damage", ["spm.model", "config.json", "search setting"])
def test_damaged_model_file_is_named(run_dir, tmp_path, monkeypatch, damage):
    model = tmp_path / "model"
    shutil.copytree(run_dir / "model", model)
    if damage == "spm.model":
        (model / "spm.model").write_bytes((model / "spm.model").read_bytes()[:200])
    elif damage == "config.json":
        (model / "config.json").write_text("{bad")
    else:
        values = json.loads((model / "config.json").read_text())
        values["search"]["bogus"] = 1
        (model / "config.json").write_text(json.dumps(values))
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    args = translate_cli.build_parser().parse_args(["--model", str(model), "Hallo."])
    with pytest.raises(translate_cli.InputError) as info:
        translate_cli.run(args)
    message = str(info.value)
    assert str(model / ("spm.model" if damage == "spm.model" else "config.json")) in message
    assert "\n" not in message and ("bogus" in message if damage == "search setting" else True)


# ----------------------------------------------------------------------------- subprocesses


def test_arguments_and_compilation_cache(run_dir, tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "FLAX_NMT_CACHE": str(cache)}
    args = ["--model", run_dir, LINES[0], "", LINES[1]]
    first = _out_lines(_run(args, env))
    assert len(first) == 3 and first[1] == "" and first[0] and first[2]
    entries = sorted(p.name for p in (cache / "jax").iterdir())
    assert any(name.startswith("jit__beam_resume") for name in entries), entries
    programs = sorted(p.name for p in (cache / "programs").iterdir())
    assert {name.split("-")[0] for name in programs} == {"_beam_start", "_beam_resume"}
    # The second start loads the search's programs whole (JAX_LOG_COMPILES reports every
    # trace: none of them), and adds nothing to either cache.
    second = _run(args, {**env, "JAX_LOG_COMPILES": "1"})
    assert _out_lines(second) == first
    traced = re.findall(r"Finished tracing (\w+)", _text(second.stderr))
    assert traced and not [name for name in traced if name.startswith("_beam")], traced
    assert sorted(p.name for p in (cache / "jax").iterdir()) == entries
    assert sorted(p.name for p in (cache / "programs").iterdir()) == programs
    # With the stored programs gone (as after an upgrade) JAX's cache serves them, and they
    # are compiled again to be stored: what XLA:CPU writes of a served one fails to run.
    shutil.rmtree(cache / "programs")
    assert _out_lines(_run(args, env)) == first
    assert sorted(p.name for p in (cache / "programs").iterdir()) == programs
    fourth = _run(args, {**env, "JAX_LOG_COMPILES": "1"})
    assert _out_lines(fourth) == first
    assert not [name for name in re.findall(r"Finished tracing (\w+)", _text(fourth.stderr))
                if name.startswith("_beam")]
    assert sorted(p.name for p in (cache / "jax").iterdir()) == entries


def test_the_collector_is_off_while_the_command_starts_and_on_after(run_dir, env):
    """translate.py starts without Python's garbage collector walking JAX's objects, and
    collects again once the model is loaded (a long input must not pile up garbage)."""
    probe = f"""
import gc, sys
sys.argv = ["translate.py", "--model", {str(run_dir)!r}, {LINES[0]!r}]
import translate
from nmt.runtime import cli
from nmt.translation import command
load, on_at_load = command.load, []

def probed_load(args):
    on_at_load.append(gc.isenabled())
    return load(args)

def probed_exit(code):
    print("probe", on_at_load, gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr)
    sys.exit(code)

command.load, cli.exit_quickly = probed_load, probed_exit
translate.run()
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env={**env, "NMT_ALLOCATOR": "system"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
    assert "probe [False] True True" in result.stderr, result.stderr[-3000:]


def test_stdin_keeps_order_across_batches_and_chunks(run_dir, env, expected):
    # --batch-tokens 64 and --chunk-lines 7 give several chunks of several batches each.
    result = _run(["--model", run_dir, *BATCH, "--chunk-lines", 7],
                  env, input=_stdin(LINES))
    assert _out_lines(result) == expected
    assert expected[EMPTY_LINE - 1] == ""
    warnings = re.findall(r"<stdin> line (\d+): .*truncated", _text(result.stderr))
    assert warnings == [str(LONG_LINE)]  # the global line number, not the chunk's
    assert "Traceback" not in _text(result.stderr)


def test_stdin_answers_each_line_before_the_next_arrives(run_dir, env, expected):
    """As in a terminal: a line is translated and flushed while stdin is still open."""
    process = subprocess.Popen([sys.executable, "translate.py", "--model", str(run_dir),
                                *map(str, BATCH), "--quiet"], cwd=REPO, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        for i in range(2):
            process.stdin.write(_stdin([LINES[i]]))
            process.stdin.flush()
            assert _text(process.stdout.readline()) == expected[i] + "\n"
        process.stdin.close()
        assert process.wait(timeout=60) == 0, _text(process.stderr.read())
        assert process.stdout.read() == b""
    finally:
        process.kill()
        process.wait()
        for stream in (process.stdout, process.stderr):
            stream.close()


def test_input_and_output_files(run_dir, env, expected, tmp_path):
    source, output = tmp_path / "in.de", tmp_path / "out.en"
    source.write_bytes(_stdin(LINES))
    result = _run(["--model", run_dir, *BATCH, "--input", source, "--output", output], env)
    assert result.returncode == 0, _text(result.stderr)
    assert result.stdout == b""
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == expected
    stderr = _text(result.stderr)
    assert re.findall(r"line (\d+): .*truncated", stderr) == [str(LONG_LINE)]
    assert f"{source} line {LONG_LINE}" in stderr
    # stderr is a pipe, as a log: no bar redrawn with "\r", and the count at the end.
    assert "\r" not in stderr and f"translated {len(LINES)} lines in" in stderr


def test_output_to_a_pipe_a_link_or_stdout(run_dir, env, expected, tmp_path):
    """--output into a FIFO (or >(cmd), /dev/stdout) writes into it; through a symbolic link
    it replaces the file the link names; - is stdout. A FIFO was replaced by a regular file
    (its reader got nothing), and a link by a file of its own."""
    import threading

    source = tmp_path / "in.de"
    source.write_bytes(_stdin(LINES))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = _run(["--model", run_dir, *BATCH, "--input", source, "--output", fifo], env)
    reader.join(timeout=60)
    assert result.returncode == 0, _text(result.stderr)
    assert _text(received[0]).split("\n")[:-1] == expected and fifo.is_fifo()
    target, link = tmp_path / "target.en", tmp_path / "link.en"
    target.write_text("old\n")
    link.symlink_to(target)
    result = _run(["--model", run_dir, *BATCH, "--input", source, "--output", link], env)
    assert result.returncode == 0, _text(result.stderr)
    assert link.is_symlink() and target.read_text().split("\n")[:-1] == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de", "link.en", "pipe",
                                                          "target.en"]
    result = _run(["--model", run_dir, *BATCH, "--input", source, "--output", "-"], env)
    assert _out_lines(result) == expected and not (REPO / "-").exists()
    if Path("/dev/full").exists():  # a device that fails: named, in one line
        result = _run(["--model", run_dir, *BATCH, "--input", source, "--output", "/dev/full"],
                      env)
        assert result.returncode == 1 and "/dev/full: no space left" in _text(result.stderr)


def test_split_sentences_translate_each_sentence_and_keep_each_line(run_dir, env):
    """--split-sentences (the default): one output line per input line, each the translations
    of its sentences (each as if translated alone) in the line's own whitespace."""
    sentences = ["Ein Mann fährt Fahrrad.", "Eine Frau liest das Buch!",
                 "Der Hund läuft im Park.", "Zwei Kinder spielen am Strand.",
                 "Die Katze schläft auf dem Sofa.", LONG + ".", "Der Hund läuft."]
    alone = translate_alone(run_dir, env, sentences)
    s = sentences
    lines = [f"  {s[0]} {s[1]}  ", "", f"{s[2]}\t{s[3]}", "   ", s[4], f"{s[5]} {s[6]}"]
    t = [text.strip() for text in alone]
    expected = [f"  {t[0]} {t[1]}  ", "", f"{t[2]}\t{t[3]}", "   ", t[4], f"{t[5]} {t[6]}"]
    result = _run(["--model", run_dir, *BATCH, "--chunk-lines", 4], env,  # on by default
                  input=_stdin(lines))
    assert _out_lines(result) == expected
    stderr = _text(result.stderr)
    assert re.findall(r"<stdin> line (\d+): .*truncated", stderr) == ["6"], stderr
    arguments = _run(["--model", run_dir, *BATCH, "--split-sentences", "--quiet", lines[0],
                      lines[2]], env)
    assert _out_lines(arguments) == [expected[0], expected[2]]


def test_nbest_format_and_count(run_dir, env, expected):
    picked = [0, EMPTY_LINE - 1, 1]  # few lines: n-best search compiles anew per width
    lines = [LINES[i] for i in picked]
    nbest = SEARCH["beam_size"]
    out = _out_lines(_run(["--model", run_dir, *BATCH, "--nbest", nbest, "--quiet"], env,
                          input=_stdin(lines)))
    assert len(out) == nbest * len(lines)
    for i in range(len(lines)):
        rows = [line.split("\t") for line in out[i * nbest:(i + 1) * nbest]]
        assert all(len(row) == 3 for row in rows), rows
        assert [int(row[0]) for row in rows] == [i] * nbest  # 0-based input line
        scores = [float(row[1]) for row in rows]
        assert scores == sorted(scores, reverse=True)
        assert rows[0][2] == expected[picked[i]]
    assert out[nbest] == "1\t0.0000\t"  # the empty line


def test_invalid_utf8_names_the_line(run_dir, env, expected, tmp_path):
    data = _stdin(LINES[:2]) + b"Der Hund l\xe4uft.\n" + _stdin(LINES[3:5])
    result = _run(["--model", run_dir, *BATCH, "--quiet"], env, input=data)
    stderr = _text(result.stderr)
    assert result.returncode == 1
    assert "<stdin> line 3: invalid UTF-8 (byte 0xe4" in stderr and "Traceback" not in stderr
    assert _text(result.stdout).split("\n")[:-1] == expected[:2]  # lines before it translated
    bad = tmp_path / "latin1.de"
    bad.write_bytes(data)
    result = _run(["--model", run_dir, "--input", bad], env)
    assert result.returncode == 1 and result.stdout == b""
    assert f"{bad} line 3: invalid UTF-8" in _text(result.stderr)


def _main(argv: list, capsys, monkeypatch) -> tuple[int, str, str]:
    """translate.py's main in this process: (exit status, stdout, stderr). The command as a
    process is tested above; these are its refusals, which need no process of their own."""
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    code = translate_cli.main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err.strip()


@pytest.mark.parametrize("what", ["missing", "incomplete"])
def test_bad_model_directory_is_one_sentence(run_dir, tmp_path, what, capsys, monkeypatch):
    model = tmp_path / "run"
    if what == "incomplete":
        (model / "model").mkdir(parents=True)
        for name in ("config.json", "spm.model"):
            (model / "model" / name).write_bytes((run_dir / "model" / name).read_bytes())
    code, out, stderr = _main(["--model", model, "Hallo."], capsys, monkeypatch)
    # A path that is not there is a usage error (2); a model directory short of a file, a
    # fault of what it holds (1).
    assert code == (2 if what == "missing" else 1) and out == ""
    assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr
    assert ("no such directory" if what == "missing" else "params.msgpack") in stderr


def test_invalid_search_flags_exit_2(run_dir, capsys, monkeypatch):
    code, out, stderr = _main(["--model", run_dir, "--nbest", SEARCH["beam_size"] + 2,
                               "Hallo."], capsys, monkeypatch)
    assert code == 2 and out == ""
    assert stderr.splitlines()[-1].startswith("translate.py: error: invalid search settings")
    assert "nbest" in stderr and "Traceback" not in stderr


def test_nbest_lines_are_the_hypotheses_found_only(run_dir, capsys, monkeypatch):
    """An output limit of one token leaves EOS as the one hypothesis: one line, never the
    search's unfilled places."""
    code, out, _ = _main(["--model", run_dir, "--nbest", 3, "--max-len-a", 0, "--max-len-b", 1,
                          "-q", "Ein Hund."], capsys, monkeypatch)
    assert code == 0 and len(out.splitlines()) == 1, out
    assert out.startswith("0\t") and float(out.split("\t")[1]) > -1e3, out


@pytest.mark.parametrize("flags, message", [
    (["--beam", "0"], "--beam must be >= 1, got 0"),
    (["--max-len-a", "0", "--max-len-b", "0"], "--max-len-b must be >= 1 when --max-len-a is 0"),
    (["--max-len-a", "-1"], "--max-len-a must be >= 0, got -1.0"),
    (["--searches", "0"], "--searches must be >= 1, got 0"),
    (["--greedy", "--beam", "5"], "--beam 5 needs beam search; drop --greedy/--sample"),
    (["--sample", "--beam", "5"], "--beam 5 needs beam search; drop --greedy/--sample"),
    (["--greedy", "--nbest", "2"], "--nbest 2 needs beam search; drop --greedy/--sample"),
    (["--nbest", "5", "--beam", "2"], "--nbest (5) must be <= --beam (2); raise --beam to "
                                      "at least 5 or lower --nbest."),
    (["--temperature", "0.5"], "--temperature and --top-k only apply with --sample"),
    (["--beam-rules", "greedy"], "--beam-rules: invalid choice: 'greedy' (choose from "
                                 "'heuristic', 'exact', 'k-finished', 'transformers')"),
])
def test_a_bad_beam_or_limit_is_one_line_naming_the_flag(run_dir, flags, message, monkeypatch,
                                                          capsys):
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    try:
        code = translate_cli.main(["--model", str(run_dir), *flags, "Hallo."])
    except SystemExit as exit:  # argparse's own checks (choices) exit from parse_args
        code = exit.code
    assert code == 2
    stderr = capsys.readouterr().err.strip()
    assert len(stderr.splitlines()) == 1 and message in stderr, stderr


def test_every_log_line_names_the_command(run_dir, tmp_path, monkeypatch, capsys):
    """The translator's warnings (a sentence truncated) and the reader's (a carriage return
    inside a line) begin with translate.py: as the command's own do."""
    source = tmp_path / "in.de"
    source.write_text(f"Hallo.\n{LONG}\nEins.\rZwei.\n")
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    assert translate_cli.main(["--model", str(run_dir), "--input", str(source)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any("truncated" in line for line in err) and any("carriage" in line for line in err)
    assert all(line.startswith("translate.py: ") for line in err), err


def test_translations_at_the_output_limit_are_kept_and_counted_once(run_dir, env):
    """min_len 2 = the limit 0 * source + 2: every translation is one token and a forced EOS.
    Each is written, and one warning at the end counts them with their line numbers."""
    result = _run(["--model", run_dir, "--max-len-a", "0", "--max-len-b", "2", "--min-len", "2",
                   "--input", "-"], env, input=_stdin(["Ein Mann.", "", "Der Hund läuft.",
                                                       "Zwei Kinder spielen."]))
    lines = _out_lines(result)
    assert len(lines) == 4 and lines[1] == "" and all(lines[i] for i in (0, 2, 3))
    warnings = [line for line in _text(result.stderr).splitlines() if "output limit" in line]
    assert len(warnings) == 1, _text(result.stderr)
    assert "3 translation(s) reached the output limit (0 x source tokens + 2" in warnings[0]
    assert "line(s) 1, 3, 4;" in warnings[0]


def test_top_k_beyond_the_vocabulary_is_a_usage_error(run_dir, monkeypatch):
    monkeypatch.setattr(translate_cli, "enable_compilation_cache", lambda: None)
    args = translate_cli.build_parser().parse_args(
        ["--model", str(run_dir), "--sample", "--top-k", "100000", "Hallo."])
    with pytest.raises(translate_cli.UsageError, match="--top-k 100000.*300 tokens"):
        translate_cli.run(args)


def test_evaluate_equals_sacrebleu(run_dir, env, expected, tmp_path):
    source, reference = tmp_path / "test.de", tmp_path / "test.en"
    hyp_file, report_file = tmp_path / "hyp.en", tmp_path / "report.json"
    source.write_bytes(_stdin(LINES))
    # Half the references are the model's own output, so BLEU is far from 0 and from 100.
    refs = [hyp if i % 2 else "A dog runs in the park ." for i, hyp in enumerate(expected)]
    reference.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    result = _run(["--model", run_dir, *BATCH, "--evaluate", "--src-file", source, "--ref-file",
                   reference, "--hyp-file", hyp_file, "--report", report_file], env)
    out = _out_lines(result)
    assert out[0].startswith("BLEU = ") and out[1].startswith("chrF2 = ")
    assert out[2].startswith("BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a")
    assert out[3].startswith("chrF signature: nrefs:1|case:mixed")
    assert hyp_file.read_text(encoding="utf-8").split("\n")[:-1] == expected

    report = json.loads(report_file.read_text())
    assert 5 < report["bleu"] < 95 and report["sentences"] == len(LINES)
    assert report["engine"] == "jax float32"
    sacrebleu = subprocess.run([sys.executable, "-m", "sacrebleu", str(reference), "-i",
                                str(hyp_file), "-m", "bleu", "chrf", "-b", "-w", "4"],
                               capture_output=True, text=True, timeout=120)
    assert sacrebleu.returncode == 0, sacrebleu.stderr
    bleu, chrf = json.loads(sacrebleu.stdout)  # -b with two metrics: a JSON list
    assert (round(report["bleu"], 4), round(report["chrf"], 4)) == (bleu, chrf)
    assert out[0].startswith(f"BLEU = {report['bleu']:.2f} ")
    assert out[1] == f"chrF2 = {report['chrf']:.2f}"
    # --test-prefix PREFIX reads PREFIX.de and PREFIX.en: the languages stored with the model.
    # --bleu-tokenize changes BLEU's tokenizer only, as `sacrebleu -tok char` would.
    by_prefix = _run(["--model", run_dir, *BATCH, "--quiet", "--evaluate", "--test-prefix",
                      tmp_path / "test", "--bleu-tokenize", "char", "--report", report_file],
                     env)
    by_char = _out_lines(by_prefix)
    assert by_char[1::2] == out[1::2]  # chrF and its signature
    assert by_char[2] == out[2].replace("tok:13a", "tok:char")
    as_char = subprocess.run([sys.executable, "-m", "sacrebleu", str(reference), "-i",
                              str(hyp_file), "-m", "bleu", "-tok", "char", "-b", "-w", "4"],
                             capture_output=True, text=True, timeout=120)
    char_bleu = json.loads(report_file.read_text())["bleu"]
    assert round(char_bleu, 4) == float(as_char.stdout) and char_bleu != report["bleu"]


def test_attention_plot_is_a_png(run_dir, env, expected, tmp_path):
    pytest.importorskip("matplotlib")  # the optional "plot" dependency
    plot = tmp_path / "attention.png"
    result = _run(["--model", run_dir, *BATCH, "--plot-attention", plot, "--attention-layer", 0,
                   "--attention-head", 1, LINES[0]], env)
    assert _out_lines(result) == expected[:1]
    data = plot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 2000
