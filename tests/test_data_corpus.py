"""Reading sentence pairs: every source format, the built-in gettext corpus, and bad input."""

import json
import logging
import os
import re
import struct
from pathlib import Path

import datasets
import pytest

from data.corpus import (
    SCORING,
    CorpusSpec,
    DataError,
    Reader,
    check_files,
    hash_split,
    load_corpus,
    read_file,
    read_file_texts,
    read_gettext_pairs,
    read_hf,
    read_hf_split,
    read_prefix,
)
from data.lines import iter_lines

MULTI30K = Path(os.environ["MULTI30K"])  # conftest.py: the shared copy unless set

PAIRS = [
    ("A dog runs.", "Ein Hund rennt."),
    ("Two men, one boat!", "Zwei Männer, ein Boot!"),
    ("Ünïcödé — “quotes” and \u2028 separator", "Ünïcödé — „Anführungszeichen“ und \u2028 Trenner"),
    ("It costs 5 %s.", "Es kostet 5 %s."),
    ("한국어 문장", "日本語の文です。"),
]


def write_prefix(prefix: Path, pairs, src="en", tgt="de") -> Path:
    Path(f"{prefix}.{src}").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    Path(f"{prefix}.{tgt}").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return prefix


def as_pairs(ds: datasets.Dataset) -> list[tuple[str, str]]:
    return list(zip(ds["source"], ds["target"]))


def write_all_formats(tmp_path: Path, pairs) -> dict[str, CorpusSpec]:
    """The same pairs in every supported format, as specs with an explicit validation set."""
    valid = write_prefix(tmp_path / "valid", pairs[:2])
    prefix = write_prefix(tmp_path / "train", pairs)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    flat = tmp_path / "flat.jsonl"
    flat.write_text("".join(json.dumps({"en": s, "de": t}) + "\n" for s, t in pairs))
    nested = tmp_path / "nested.jsonl"
    nested.write_text(
        "".join(json.dumps({"translation": {"de": t, "en": s}}) + "\n" for s, t in pairs)
    )
    hf = datasets.Dataset.from_dict({"translation": [{"en": s, "de": t} for s, t in pairs]})
    datasets.DatasetDict({"train": hf, "validation": hf.select(range(2))}).save_to_disk(
        str(tmp_path / "saved")
    )
    parquet = tmp_path / "train.parquet"
    hf.to_parquet(str(parquet))
    common = {"src": "en", "tgt": "de", "valid_prefix": str(valid)}
    return {
        "prefix": CorpusSpec(train_prefix=str(prefix), **common),
        "tsv": CorpusSpec(train_file=str(tsv), **common),
        "jsonl flat": CorpusSpec(train_file=str(flat), **common),
        "jsonl translation": CorpusSpec(train_file=str(nested), **common),
        "save_to_disk": CorpusSpec(dataset=str(tmp_path / "saved"), **common),
        "parquet": CorpusSpec(train_file=str(parquet), **common),
    }


def test_every_format_gives_identical_pairs(tmp_path):
    specs = write_all_formats(tmp_path, PAIRS)
    for name, spec in specs.items():
        corpus = load_corpus(spec)
        assert sorted(corpus) == ["train", "validation"], name
        assert as_pairs(corpus["train"]) == PAIRS, name
        assert as_pairs(corpus["validation"]) == PAIRS[:2], name


def test_reversed_direction_swaps_columns(tmp_path):
    prefix = write_prefix(tmp_path / "train", PAIRS)
    ds = read_prefix(prefix, "de", "en")
    assert as_pairs(ds) == [(t, s) for s, t in PAIRS]


def test_hub_name_offline_gives_one_sentence(monkeypatch):
    # Offline mode makes the hub call fail at once instead of after its retries.
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as info:
        load_corpus(CorpusSpec(dataset="wmt14", dataset_config="de-en"))
    message = str(info.value)
    assert "\n" not in message
    assert "'wmt14'" in message and "--train-prefix" in message
    assert info.value.__cause__ is None


def test_a_test_sets_dataset_errors_name_translates_flags_not_trains(tmp_path, monkeypatch):
    """read_hf_split reads translate.py's --dataset: a file, or a hub name that cannot load,
    is sent to its --test-file and --test-prefix (train.py's flags would be refused there)."""
    import huggingface_hub.constants

    pairs = tmp_path / "trans.jsonl"
    pairs.write_text('{"de": "a", "en": "b"}\n')
    with pytest.raises(DataError) as info:
        read_hf_split(str(pairs), None, "test", "de", "en", SCORING)
    assert str(info.value) == (f"{pairs}: is a file, not a dataset: give a file of pairs with "
                               "--test-file, and --dataset a directory written by save_to_disk "
                               "or a hub name")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as info:
        read_hf_split("surely-not-a-cached/dataset", None, "test", "de", "en", SCORING)
    message = str(info.value)
    assert message.endswith("; use local files instead: --test-prefix PREFIX with --src/--tgt "
                            "(reads PREFIX.SRC and PREFIX.TGT), --src-file with --ref-file, a "
                            ".tsv/.jsonl/.parquet file with --test-file, or a directory written "
                            "by save_to_disk"), message
    assert "--train" not in message and "--valid" not in message


def test_missing_language_in_dataset_names_expected_and_found(tmp_path):
    hf = datasets.Dataset.from_dict({"translation": [{"en": "a", "de": "b"}]})
    hf.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match=r"'en' and 'fr'.*\['de', 'en'\]"):
        read_hf(str(tmp_path / "saved"), None, "en", "fr")
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text('{"en": "a", "de": "b"}\n{"en": "c", "fr": "d"}\n')
    with pytest.raises(DataError, match=r"x.jsonl line 2: expected language keys 'en' and 'de', "
                                        r"found \['en', 'fr'\]"):
        read_file(jsonl, "en", "de")


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_prefix(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_text("eins\nzwei\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_prefix(tmp_path / "train", "en", "de")
    message = str(info.value)
    assert f"{tmp_path / 'train.en'} has {len(PAIRS)} lines" in message
    assert f"{tmp_path / 'train.de'} has 2" in message


def test_invalid_utf8_names_file_and_line(tmp_path):
    write_prefix(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_bytes(b"eins\nzwei\ndr\xe4i\nvier\nf\xfcnf\n")
    with pytest.raises(DataError, match=r"train\.de line 3: invalid UTF-8 \(byte 0xe4"):
        read_prefix(tmp_path / "train", "en", "de")


@pytest.mark.parametrize("text, codec, hint", [
    ("今日は晴れです。", "cp932", "it looks like Shift-JIS: convert it with iconv -f CP932 -t "
                                  "UTF-8; not LATIN1"),
    ("今日は晴れです。", "euc_jp", "it looks like EUC-JP: convert it with iconv -f EUC-JP"),
    ("今天天气很好。明天会下雨吗？", "gbk",
     "it looks like GB18030: convert it with iconv -f GB18030"),
    # Korean and Chinese share EUC's bytes: both are named, Korean first.
    ("오늘은 날씨가 좋습니다.", "euc_kr", "it looks like EUC-KR or GB18030: convert it with "
                                       "iconv -f EUC-KR -t UTF-8 or iconv -f GB18030 -t UTF-8"),
    ("Müller und Café, Straße. Äpfel für Öl", "latin-1",
     "convert it to UTF-8 from its encoding (`file -i` or `uchardet` tells it), e.g. iconv -f "
     "LATIN1 -t UTF-8 if it is Latin-1"),
])
def test_invalid_utf8_names_the_encoding_its_bytes_read_as(tmp_path, text, codec, hint):
    """Japanese, Korean or Chinese bytes converted from Latin-1 give garbage that trains:
    the hint names the encoding they read as, and Latin-1 only where none fits."""
    write_prefix(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_bytes(b"eins\n" + text.encode(codec) + b"\n")
    with pytest.raises(DataError) as info:
        read_prefix(tmp_path / "train", "en", "de")
    assert hint in str(info.value)
    assert ("LATIN1 -t UTF-8 if" in str(info.value)) == (codec == "latin-1")


def test_invalid_utf8_counts_its_column_in_characters(tmp_path):
    write_prefix(tmp_path / "train", PAIRS)
    (tmp_path / "train.de").write_bytes("今日は".encode() + b"\x8d\n")
    with pytest.raises(DataError, match=r"train\.de line 1: invalid UTF-8 \(byte 0x8d at "
                                        r"column 4, the line's byte 10\)"):
        read_prefix(tmp_path / "train", "en", "de")


UTF16 = "it looks like UTF-16: convert it with iconv -f UTF-16 -t UTF-8"


@pytest.mark.parametrize("name, data, message", [
    # ASCII in UTF-16 without a byte order mark (iconv -t UTF-16LE) is valid UTF-8.
    ("train.en", "a red cat\nthe dog\n".encode("utf-16-le"), rf"line 1: 9 NUL bytes .*{UTF16}"),
    ("train.en", "a red cat\nthe dog\n".encode("utf-16-be"), rf"line 1: 10 NUL bytes .*{UTF16}"),
    ("pairs.tsv", "a red cat\teine Katze\n".encode("utf-16-le"), rf"line 1: .*{UTF16}"),
    ("train.en", b"a b\nc\x00d\n", r"line 2: 1 NUL byte \(\\x00\), the first at column 2, "
                                   r"and text holds none; remove it \(tr -d '\\000'"),
    ("pairs.tsv", b"a\tA\nb\x00\tB\n", r"line 2: 1 NUL byte .*; remove it"),
    ("pairs.jsonl", b'{"en": "a", "de": "A\x00"}\n', r"line 1: 1 NUL byte .*; remove it"),
    ("train.en", b"a b\nthe long line c\x00d\x00\n", r"line 2: 2 NUL bytes .*; remove them"),
])
def test_a_line_holding_nul_bytes_is_refused_naming_file_and_line(tmp_path, name, data, message):
    """NUL bytes are valid UTF-8 but no text: UTF-16 read as UTF-8 would train on garbage."""
    write_prefix(tmp_path / "train", [("a b", "A B"), ("c d", "C D")])
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=re.escape(str(tmp_path / name)) + " " + message):
        if name.startswith("train."):
            read_prefix(tmp_path / "train", "en", "de")
        else:
            read_file(tmp_path / name, "en", "de")


def test_translate_input_holding_nul_bytes_is_refused(tmp_path):
    """Standard input and --input files are read by `stream_chunks`: the lines before come out."""
    from data import lines

    path = tmp_path / "in.txt"
    path.write_bytes(b"Ein Hund.\n" + "Zwei.\n".encode("utf-16-le"))
    with open(path, "rb") as handle:
        chunks = lines.stream_chunks(handle.fileno(), 10, where=str(path))
        assert next(chunks) == (1, ["Ein Hund."])
        with pytest.raises(DataError, match=r"in\.txt line 2: 5 NUL bytes .*UTF-16"):
            next(chunks)


def test_missing_file_is_named(tmp_path):
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(DataError, match=r"train\.de: file not found"):
        read_prefix(tmp_path / "train", "en", "de")
    with pytest.raises(DataError, match=r"nothere\.tsv: file not found"):
        read_file(tmp_path / "nothere.tsv", "en", "de")


def test_a_prefix_with_its_language_suffix_or_a_directory_gets_the_fix(tmp_path):
    """`--train-prefix data/train.en` and `--train-prefix data` read `train.en.en` and
    `data.en`: the error says which files a prefix reads and what to give instead, from the
    first check (check_files) as from read_prefix."""
    write_prefix(tmp_path / "train", PAIRS)
    for prefix in (f"{tmp_path}/train.en", f"{tmp_path}/train.de"):
        spec = CorpusSpec(train_prefix=prefix, src="en", tgt="de")
        for check, flag in ((lambda: check_files(spec), "--train-prefix"),
                            (lambda: read_prefix(prefix, "en", "de"), "--train/valid/test-prefix")):
            with pytest.raises(DataError) as caught:
                check()
            assert str(caught.value) == (
                f"{prefix}.en: file not found; {flag} {prefix} with --src en --tgt de reads "
                f"{prefix}.en and {prefix}.de; drop the language suffix: {flag} {tmp_path}/train")
    spec = CorpusSpec(train_prefix=str(tmp_path), src="en", tgt="de", valid_prefix=str(tmp_path))
    with pytest.raises(DataError, match=f"{re.escape(str(tmp_path))} is a directory: give "
                                        f"--train-prefix {re.escape(str(tmp_path))}/train$"):
        check_files(spec)


def test_a_directory_or_a_pipe_is_named_as_such_not_as_missing(tmp_path):
    """Either exists: "file not found" would send the user looking for the wrong thing."""
    (tmp_path / "train.en").write_text("a\n")
    (tmp_path / "train.de").mkdir()
    with pytest.raises(DataError, match=r"train\.de: is a directory; give a text file"):
        read_prefix(tmp_path / "train", "en", "de")
    (tmp_path / "train.de").rmdir()
    os.mkfifo(tmp_path / "train.de")
    spec = CorpusSpec(train_prefix=str(tmp_path / "train"), src="en", tgt="de")
    for check in (lambda: read_prefix(tmp_path / "train", "en", "de"),
                  lambda: check_files(spec)):
        with pytest.raises(DataError, match=r"train\.de: is not a regular file \(a pipe or a "
                                            r"device\?\); .* write it to a file first"):
            check()


def test_empty_corpus_is_an_error(tmp_path):
    write_prefix(tmp_path / "train", [("", "x"), ("  ", "")])
    with pytest.raises(DataError, match=r"no sentence pairs \(2 read, 2 with an empty side\)"):
        read_prefix(tmp_path / "train", "en", "de")


def test_empty_lines_are_dropped_and_counted(tmp_path, caplog):
    pairs = PAIRS[:2] + [("", "leer"), ("empty", "   ")] + PAIRS[2:]
    write_prefix(tmp_path / "train", pairs)
    with caplog.at_level(logging.INFO, logger="data"):
        ds = read_prefix(tmp_path / "train", "en", "de")
    assert as_pairs(ds) == PAIRS
    assert "dropped 2 of 7 pairs with an empty side (1 empty source, 1 empty target)" in caplog.text


def test_the_empty_side_counts_add_up_to_the_pairs_dropped(tmp_path, caplog):
    """A pair with two empty sides is counted once, as such, not as an empty source and an
    empty target; from the cache too."""
    tsv = tmp_path / "blank.tsv"
    tsv.write_text("a\tA\n\nb\t\n\tC\n")
    expected = ("dropped 3 of 4 pairs with an empty side (1 empty source, 1 empty target, 1 "
                "both empty)")
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="data"):
            assert as_pairs(read_file(tsv, "en", "de")) == [("a", "A")]
        assert expected in caplog.text


def test_old_mac_line_endings_are_warned_about_once_per_file(tmp_path, caplog):
    """Lines split on "\\n" only: a file whose lines end in "\\r" alone is one line, which
    is kept as it is but warned about, once for each file, with how to convert it."""
    (tmp_path / "mac.en").write_bytes(b"a b\rc d\re f\r")
    (tmp_path / "mac.de").write_bytes(b"A B\rC D\rE F\r")
    with caplog.at_level(logging.WARNING, logger="data"):
        pairs = as_pairs(read_prefix(tmp_path / "mac", "en", "de"))
    assert pairs == [("a b\rc d\re f", "A B\rC D\rE F")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    for warning, name in zip(warnings, ("mac.en", "mac.de")):
        assert warning.startswith(f"{tmp_path / name}: a carriage return (\\r) inside 1 "
                                  "of its lines (the first: line 1)")
        assert "tr '\\r' '\\n'" in warning and "dos2unix -c mac" in warning
    caplog.clear()
    (tmp_path / "dos.en").write_bytes(b"a b\r\nc d\r\n")
    (tmp_path / "dos.de").write_bytes(b"A B\nC D\n")
    with caplog.at_level(logging.WARNING, logger="data"):
        assert as_pairs(read_prefix(tmp_path / "dos", "en", "de")) == [("a b", "A B"),
                                                                       ("c d", "C D")]
    assert not caplog.records


def test_carriage_returns_are_warned_about_again_when_read_from_the_cache(tmp_path, caplog):
    """A second reading comes from the text cache and warns as the first did, naming the
    files read (a copy elsewhere shares the entry); an entry written before the warnings were
    kept still opens, with none to give."""
    from data.arrow_text import file_digest
    from data.config import default_cache_dir

    def warnings(prefix: Path) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="data"):
            assert as_pairs(read_prefix(prefix, "en", "de")) == [("one\rtwo", "eins zwei")]
        return [r.getMessage().split(" (old Mac")[0] for r in caplog.records
                if r.levelno == logging.WARNING]

    for copy in ("first", "copy"):
        (tmp_path / copy).mkdir()
        (tmp_path / copy / "mac.en").write_bytes(b"one\rtwo\r\n")
        (tmp_path / copy / "mac.de").write_bytes(b"eins zwei\n")
    first, copy = tmp_path / "first" / "mac", tmp_path / "copy" / "mac"
    expected = (f"{first}.en: a carriage return (\\r) inside 1 of its lines (the first: line 1), "
                "so each may be several sentences read as one: lines end in \\r alone")
    assert warnings(first) == [expected]
    assert warnings(first) == [expected]  # from the cache
    assert warnings(copy) == [expected.replace(str(first), str(copy))]
    key = file_digest([f"{first}.en", f"{first}.de"], "prefix")
    meta = default_cache_dir() / "text" / f"{key}.json"
    values = json.loads(meta.read_text())
    del values["carriage_returns"]
    meta.write_text(json.dumps(values))
    assert warnings(first) == []


def test_a_long_line_of_carriage_returns_is_named_as_such(tmp_path):
    from data import lines

    (tmp_path / "mac.txt").write_bytes(b"a b\r" * 40)
    with pytest.raises(DataError, match=r"mac\.txt line 1: longer than 64 bytes without a line "
                                        r"break \(\\n\), and it holds carriage returns "
                                        r"\(\\r\): .*tr '\\r' '\\n'"):
        list(lines.iter_lines(tmp_path / "mac.txt", max_line_bytes=64))
    with open(tmp_path / "mac.txt", "rb") as handle, pytest.raises(DataError, match="tr '"):
        list(lines.stream_chunks(handle.fileno(), 10, max_line_bytes=64))


def test_tsv_with_extra_tab_names_line(tmp_path):
    tsv = tmp_path / "bad.tsv"
    tsv.write_text("a\tb\nc\td\te\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.tsv line 2: 2 TABs, where source<TAB>target has "
                                        r"one; remove the stray TABs, or give the pairs as "
                                        r"aligned text files with --train-prefix, "
                                        r"--valid-prefix or --test-prefix$"):
        read_file(tsv, "en", "de")


def test_tsv_line_without_a_tab_is_told_its_target_is_missing_in_the_readers_words(tmp_path):
    """A line with no TAB lacks its target (no TABs to remove), and the fix names the flags of
    the command that reads the file: translate.py has no --train-prefix."""
    tsv = tmp_path / "short.tsv"
    tsv.write_text("a\tb\nDie Katze.\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"short\.tsv line 2: the target column is missing "
                                        r"\(no TAB\); add a TAB and the target to that line, "
                                        r"or give the pairs as aligned text files with "
                                        r"--train-prefix, --valid-prefix or --test-prefix$"):
        read_file(tsv, "en", "de")
    scoring = Reader("translated and scored", "--test-prefix PREFIX")
    for path in (tsv, tmp_path / "pairs.txt"):
        with pytest.raises(DataError, match=r"aligned text files with --test-prefix PREFIX$"):
            read_file_texts(path, "en", "de", scoring)


@pytest.mark.parametrize("name,text,fault", [
    ("cr.tsv", "a\tx\rb\ty\r", "2 TABs, where source<TAB>target has one"),
    ("cr.jsonl", '{"en": "a", "de": "x"}\r{"en": "b", "de": "y"}\r', "not valid JSON (Extra data)"),
])
def test_a_file_of_old_mac_lines_is_told_to_convert_its_line_ends(name, text, fault, tmp_path):
    """Lines ending in "\\r" alone read as one line: its TABs or its JSON fail, and the fix
    is converting the file, not removing TABs."""
    path = tmp_path / name
    path.write_bytes(text.encode())
    for read in (lambda: read_file(path, "en", "de"),
                 lambda: read_file_texts(path, "en", "de", SCORING)):
        with pytest.raises(DataError) as info:
            read()
        assert str(info.value) == (
            f"{path} line 1: {fault}, and the line holds carriage returns (\\r): lines end in "
            "\\r alone (old Mac line endings?) and are split on \\n only; convert the file "
            "with tr '\\r' '\\n' < FILE > FILE.unix (or dos2unix -c mac FILE)")


def test_a_key_twice_in_a_json_object_is_refused_naming_line_and_key(tmp_path):
    """A repeated key, flat or under "translation", would lose its first sentence unseen."""
    path = tmp_path / "twice.jsonl"
    for record, key in (('{"en": "a", "de": "x", "en": "b"}', "en"),
                        ('{"translation": {"en": "a", "de": "x", "de": "y"}}', "de")):
        path.write_text('{"en": "ok", "de": "gut"}\n' + record + "\n")
        with pytest.raises(DataError) as info:
            read_file_texts(path, "en", "de", SCORING)
        assert str(info.value) == (f"{path} line 2: the key {key!r} appears twice in one object "
                                   "(JSON readers keep only its last value); remove one of them")


def test_a_translation_that_is_not_an_object_is_named_as_such_not_sent_to_src_tgt(tmp_path):
    """A null translation is the row's fault (no --src/--tgt reads it); a flat record's own
    "translation" field that is not an object is metadata, and its language keys are read."""
    path = tmp_path / "null.jsonl"
    path.write_text('{"translation": {"en": "a", "de": "b"}}\n{"translation": null}\n')
    with pytest.raises(DataError) as info:
        read_file_texts(path, "en", "de", SCORING)
    assert str(info.value) == (f"{path} line 2: the translation is null, not an object of "
                               "language keys such as {'en': .., 'de': ..}; fix or remove that "
                               "entry")
    path.write_text('{"en": "a", "de": "b", "translation": "manual"}\n')
    assert read_file_texts(path, "en", "de", SCORING) == (["a"], ["b"])
    path.write_text('{"en": "a", "translation": "manual"}\n')  # metadata; a language missing
    with pytest.raises(DataError) as info:
        read_file_texts(path, "en", "de", SCORING)
    assert str(info.value) == (f"{path} line 1: expected language keys 'en' and 'de', found "
                               "['en', 'translation']; set --src/--tgt to keys that the data has")
    for record, shown in (('["A man.", "Ein Mann."]', "list ['A man.', 'Ein Mann.']"),
                          ('"Ein Mann.", "id": 1', "str 'Ein Mann.'")):
        path.write_text('{"translation": ' + record + '}\n')  # no language key beside it
        with pytest.raises(DataError) as info:
            read_file_texts(path, "en", "de", SCORING)
        assert str(info.value) == (f"{path} line 1: the translation is {shown}, not an object "
                                   "of language keys such as {'en': .., 'de': ..}; fix or "
                                   "remove that entry")
    saved = str(tmp_path / "saved")
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(
        {"translation": [{"en": "a", "de": "b"}, None]},
        features=datasets.Features({"translation": datasets.Translation(["de", "en"])}),
    )}).save_to_disk(saved)
    with pytest.raises(DataError) as info:
        read_hf_split(saved, None, "test", "en", "de")
    assert str(info.value).startswith(f"{saved}[test] row 1 (0-based), column 'translation': "
                                      "the translation is null, not an object of language keys")


def test_a_variable_languages_translation_column_is_read_by_language(tmp_path):
    """datasets.TranslationVariableLanguages rows ({"language": [..], "translation": [..]}):
    the first text of each language; a language the row lacks is a missing side."""
    features = datasets.Features(
        {"translation": datasets.TranslationVariableLanguages(["de", "en", "fr"])})
    rows = [{"en": "a", "de": ["x", "y"]}, {"en": "b", "fr": "z"}, {"en": "c", "de": "w"}]
    saved = str(tmp_path / "saved")
    dataset = datasets.Dataset.from_dict({"translation": rows}, features=features)
    datasets.DatasetDict({"train": dataset, "test": dataset}).save_to_disk(saved)
    assert read_hf_split(saved, None, "test", "en", "de") == (["a", "b", "c"], ["x", "", "w"],
                                                              "test")
    assert as_pairs(read_hf(saved, None, "de", "en")["train"]) == [("x", "a"), ("w", "c")]
    dataset.to_parquet(str(tmp_path / "variable.parquet"))
    assert read_file_texts(tmp_path / "variable.parquet", "en", "de", SCORING) == (
        ["a", "b", "c"], ["x", "", "w"])


def test_a_config_for_a_save_to_disk_directory_is_refused_not_ignored(tmp_path):
    saved = str(tmp_path / "saved")
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"en": ["a"], "de": ["b"]})}
                         ).save_to_disk(saved)
    for read in (lambda: read_hf_split(saved, "de-en", "test", "en", "de"),
                 lambda: read_hf(saved, "de-en", "en", "de")):
        with pytest.raises(DataError) as info:
            read()
        assert str(info.value) == (f"{saved}: --dataset-config de-en, but a save_to_disk "
                                   "directory has no configurations; drop --dataset-config")


def test_unknown_suffix_and_two_sources_are_errors(tmp_path):
    with pytest.raises(DataError, match=r"unknown file type '\.txt'"):
        read_file(tmp_path / "a.txt", "en", "de")
    with pytest.raises(DataError, match="one training source"):
        CorpusSpec(train_prefix="a", dataset="b")
    for split in ("valid", "test"):
        with pytest.raises(DataError, match=f"--{split}-prefix or --{split}-file, not both"):
            CorpusSpec(**{f"{split}_prefix": "a", f"{split}_file": "b.tsv"})


def test_byte_order_mark_is_not_text(tmp_path):
    bom = "\ufeff"
    write_prefix(tmp_path / "train", [(bom + s, bom + t) for s, t in PAIRS[:1]] + PAIRS[1:])
    tsv, jsonl = tmp_path / "train.tsv", tmp_path / "train.jsonl"
    tsv.write_text(bom + "".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    jsonl.write_text(bom + "".join(json.dumps({"en": s, "de": t}) + "\n" for s, t in PAIRS),
                     encoding="utf-8")
    for ds in (read_prefix(tmp_path / "train", "en", "de"), read_file(tsv, "en", "de"),
               read_file(jsonl, "en", "de")):
        assert as_pairs(ds) == PAIRS


def test_dataset_null_side_is_dropped_and_counted(tmp_path, caplog):
    path = tmp_path / "null.parquet"
    datasets.Dataset.from_dict({"en": ["a b", None, "c"], "de": ["x", "y", "z"]}).to_parquet(
        str(path))
    with caplog.at_level(logging.INFO, logger="data"):
        ds = read_file(path, "en", "de")
    assert as_pairs(ds) == [("a b", "x"), ("c", "z")]
    assert "dropped 1 of 3 pairs with an empty side (1 empty source, 0 empty target)" in caplog.text


def test_rewritten_parquet_gives_its_new_pairs_even_with_the_same_mtime(tmp_path):
    """The pairs come from the file's bytes: datasets' parquet reader keeps its own cache by
    path and modification time, which a file rewritten within the same second shares."""
    path = tmp_path / "train.parquet"
    spec = CorpusSpec(train_file=str(path), valid_file=str(path), src="en", tgt="de")
    old, new = [("a b", "x"), ("c", "y z")], [("new one", "neu eins"), ("new two", "neu zwei")]
    datasets.Dataset.from_dict({"en": [s for s, _ in old], "de": [t for _, t in old]}
                               ).to_parquet(str(path))
    stamp = path.stat().st_mtime_ns
    assert as_pairs(load_corpus(spec)["train"]) == old
    datasets.Dataset.from_dict({"en": [s for s, _ in new], "de": [t for _, t in new]}
                               ).to_parquet(str(path))
    os.utime(path, ns=(stamp, stamp))
    assert as_pairs(load_corpus(spec)["train"]) == new


def test_dataset_value_that_is_not_text_names_row_and_column(tmp_path):
    path = tmp_path / "ints.parquet"
    datasets.Dataset.from_dict({"en": ["a", "b"], "de": [7, 8]}).to_parquet(str(path))
    with pytest.raises(DataError, match=r"ints\.parquet row 0 \(0-based\), column 'de': expected "
                                        r"a string, got int 7"):
        read_file(path, "en", "de")
    # A null instead of the whole translation names its row too.
    path = tmp_path / "translation.parquet"
    datasets.Dataset.from_dict({"translation": [None, {"en": "c", "de": "d"}]}).to_parquet(
        str(path))
    with pytest.raises(DataError, match=r"translation\.parquet row 0 \(0-based\), "
                                        r"column 'translation'"):
        read_file(path, "en", "de")


def test_a_nul_character_in_a_json_or_table_value_is_refused_naming_it(tmp_path):
    """A NUL written as a JSON escape, or held in a table's string, never passes the line
    reader's check of raw bytes; it is refused all the same, naming the entry."""
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"en": "a", "de": "A"}\n{"translation": {"en": "b\\u0000c", "de": "B"}}\n')
    with pytest.raises(DataError, match=re.escape(f"{jsonl} line 2: the source ('en') holds a "
                                                  "NUL character (\\u0000, at character 2)")):
        read_file(jsonl, "en", "de")
    table = tmp_path / "pairs.parquet"
    datasets.Dataset.from_dict({"en": ["a", "b"], "de": ["A", "\x00B"]}).to_parquet(str(table))
    with pytest.raises(DataError, match=r"pairs\.parquet row 1 \(0-based\), column 'de' holds a "
                                        r"NUL character \(\\u0000, at character 1\)"):
        load_corpus(CorpusSpec(train_file=str(table)))


def test_unreadable_parquet_or_dataset_directory_is_named(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet\n")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable parquet file \(.*\); "):
        load_corpus(CorpusSpec(train_file=str(bad)))
    empty = tmp_path / "notads"
    empty.mkdir()
    with pytest.raises(DataError, match=r"notads: not a dataset directory written by "
                                        r"save_to_disk \(.*\); give a directory"):
        load_corpus(CorpusSpec(dataset=str(empty)))


def test_test_split_alone_is_read_with_every_pair(tmp_path):
    """For scoring: no train split needed, and no pair dropped, stripped or reordered."""
    sources = ["  A dog. ", "", "Two men.", None]
    targets = ["Ein Hund.", "Leer.", None, "Vier."]
    test = datasets.Dataset.from_dict({"en": sources, "de": targets})
    datasets.DatasetDict({"test": test, "valid": test.select([0])}).save_to_disk(
        str(tmp_path / "saved"))
    got = read_hf_split(str(tmp_path / "saved"), None, "test", "en", "de")
    assert got == (["  A dog. ", "", "Two men.", ""], ["Ein Hund.", "Leer.", "", "Vier."], "test")
    assert read_hf_split(str(tmp_path / "saved"), None, "validation", "en", "de")[2] == "valid"
    with pytest.raises(DataError, match=r"no 'train' split; it has \['test', 'valid'\]"):
        read_hf_split(str(tmp_path / "saved"), None, "train", "en", "de")


def test_validation_held_out_when_absent(tmp_path, caplog):
    pairs = [(f"sentence {i}", f"Satz {i}") for i in range(500)]
    spec = CorpusSpec(train_prefix=str(write_prefix(tmp_path / "train", pairs)), seed=3)
    with caplog.at_level(logging.INFO, logger="data"):
        first = load_corpus(spec)
    again = load_corpus(spec)
    assert "held out 5 of 500 training pairs (seed 3)" in caplog.text
    assert len(first["validation"]) == 5 and len(first["train"]) == 495
    assert as_pairs(first["validation"]) == as_pairs(again["validation"])
    assert sorted(as_pairs(first["train"]) + as_pairs(first["validation"])) == sorted(pairs)
    other_seed = load_corpus(CorpusSpec(train_prefix=spec.train_prefix, seed=4))
    assert as_pairs(other_seed["validation"]) != as_pairs(first["validation"])


def test_validation_holdout_is_capped(tmp_path):
    pairs = [(f"s {i}", f"t {i}") for i in range(400)]
    spec = CorpusSpec(train_prefix=str(write_prefix(tmp_path / "train", pairs)), max_valid=3)
    assert len(load_corpus(spec)["validation"]) == 3


def test_one_training_pair_without_validation_says_what_to_give(tmp_path):
    spec = CorpusSpec(train_prefix=str(write_prefix(tmp_path / "train", PAIRS[:1])))
    with pytest.raises(DataError, match=r"need at least 2 training pairs to hold out a "
                                        r"validation set, got 1; give a validation set "
                                        r"\(--valid-prefix or --valid-file\) or more training "
                                        r"pairs$"):
        load_corpus(spec)


@pytest.mark.parametrize("text", [json.dumps([{"en": "a", "de": "b"}]) + "\n",
                                  json.dumps([{"en": "a", "de": "b"}], indent=2) + "\n"])
def test_a_json_array_is_told_to_be_json_lines(tmp_path, text):
    """One array on one line, or spread over many: either way the file is not JSON Lines."""
    path = tmp_path / "train.json"
    path.write_text(text)
    with pytest.raises(DataError, match=r"train\.json line 1: .*; a \.json or \.jsonl file "
                                        r"must be JSON Lines, one object per line") as caught:
        read_file(path, "en", "de")
    assert "\n" not in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Built-in gettext corpus


def write_mo(path: Path, catalog: dict[str, str]) -> None:
    """Write a GNU .mo file (little-endian, no hash table)."""
    keys = sorted(catalog)
    ids = [k.encode("utf-8") for k in keys]
    strs = [catalog[k].encode("utf-8") for k in keys]
    n = len(keys)
    header_size = 7 * 4
    table_size = n * 8
    data_start = header_size + 2 * table_size
    blob, id_table, str_table = b"", [], []
    for table, items in ((id_table, ids), (str_table, strs)):
        for item in items:
            table.append((len(item), data_start + len(blob)))
            blob += item + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, header_size, header_size + table_size, 0, 0)
    tables = b"".join(struct.pack("<2I", *entry) for entry in id_table + str_table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + tables + blob)


def test_gettext_reader_skips_and_counts_each_kind(tmp_path):
    messages = tmp_path / "xx" / "LC_MESSAGES"
    write_mo(messages / "a.mo", {
        "": "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n",
        "Open file %s": "Datei %s öffnen",
        "file\0files": "Datei\0Dateien",
        "menu\x04Open": "Öffnen",
        "OK": "OK",
        "Line one\nLine two": "Zeile eins\nZeile zwei",
        "One line\nTwo lines\n": "Nur eine Zeile",
    })
    write_mo(messages / "b.mo", {
        "": "Content-Type: text/plain; charset=UTF-8\n",
        "Open file %s": "Datei %s öffnen",
        "Quit": "Beenden",
    })
    (messages / "broken.mo").write_bytes(b"not a catalog")
    pairs, stats = read_gettext_pairs("xx", tmp_path)
    assert pairs == [
        ("Line one", "Zeile eins"), ("Line two", "Zeile zwei"),
        ("Open file %s", "Datei %s öffnen"), ("Quit", "Beenden"),
    ]
    assert (stats.catalogs_read, stats.catalogs_skipped) == (2, 1)
    assert stats.dropped == {
        "header": 2, "plural": 2, "context": 1, "untranslated": 1, "duplicate": 1,
        "line count differs": 1, "multi-line, split": 1,
    }


def test_builtin_with_too_few_pairs_names_count_and_options(tmp_path):
    write_mo(tmp_path / "xx" / "LC_MESSAGES" / "a.mo", {"Quit": "Beenden"})
    with pytest.raises(DataError, match=r"found only 1 en-xx pairs.*--train-prefix.*--dataset"):
        load_corpus(CorpusSpec(tgt="xx", locale_dir=str(tmp_path)))


def test_builtin_reverse_direction(tmp_path):
    write_mo(tmp_path / "xx" / "LC_MESSAGES" / "a.mo",
             {f"word {i}": f"Wort {i}" for i in range(300)})
    corpus = load_corpus(CorpusSpec(src="xx", tgt="en", locale_dir=str(tmp_path),
                                    min_builtin_pairs=10))
    assert corpus["train"][0]["source"].startswith("Wort")
    assert corpus["train"][0]["target"].startswith("word")


@pytest.mark.skipif(not list(Path("/usr/share/locale/de/LC_MESSAGES").glob("*.mo")),
                    reason="no German gettext catalogs in /usr/share/locale/de/LC_MESSAGES")
def test_builtin_german_corpus(caplog):
    with caplog.at_level(logging.INFO, logger="data"):
        corpus = load_corpus(CorpusSpec())
    assert "built-in corpus en-de" in caplog.text
    assert sorted(corpus) == ["test", "train", "validation"]
    assert len(corpus["train"]) >= 1000
    sources = {split: set(corpus[split]["source"]) for split in corpus}
    assert not sources["train"] & sources["validation"]
    assert not sources["train"] & sources["test"]
    assert not sources["validation"] & sources["test"]
    assert all(hash_split(s) == "validation" for s in sources["validation"])
    pairs = as_pairs(corpus["train"])
    assert all("\x04" not in s and s != t and "\n" not in s + t for s, t in pairs)
    assert any("%s" in s and "%s" in t for s, t in pairs)


# ---------------------------------------------------------------------------------------------
# Multi30k


@pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} not found (shared data absent)")
def test_multi30k_prefix_reads_all_pairs():
    corpus = load_corpus(CorpusSpec(
        train_prefix=str(MULTI30K / "train"), valid_prefix=str(MULTI30K / "valid"),
        test_prefix=str(MULTI30K / "test2016"),
    ))
    assert [len(corpus[s]) for s in ("train", "validation", "test")] == [29000, 1014, 1000]
    first = corpus["train"][0]
    assert first["source"].startswith("Two young, White males are outside")
    assert "\t" in corpus["train"][7365]["target"]  # the TAB upstream keeps on line 7366


def test_a_hub_dataset_offline_fails_at_once_in_one_line(monkeypatch):
    """Where the hub cannot be reached, --dataset does not spend half a minute on retries:
    the hub's clients go offline (a cached dataset would still load) and the error says why."""
    import socket
    import time

    from data import corpus
    from data.config import DataError

    def unreachable(address, timeout=None):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(corpus.socket, "create_connection", unreachable)
    start = time.perf_counter()
    with pytest.raises(DataError) as caught:
        corpus.read_hf("surely-not-a-cached/dataset", "de-en", "en", "de")
    assert time.perf_counter() - start < 3
    message = str(caught.value)
    assert "cannot be reached from here and the dataset is not in the local cache" in message
    assert "--train-prefix" in message and "\n" not in message
    assert not datasets.config.HF_HUB_OFFLINE  # offline only while it tried


def test_a_lone_surrogate_escape_in_json_lines_names_line_and_side(tmp_path):
    """An emoji's escape cut in half decodes to no character; it is refused where it is read,
    not when the cache cannot write it."""
    path = tmp_path / "cut.jsonl"
    path.write_text('{"en": "fine", "de": "gut"}\n{"en": "smile", "de": "L\\u00e4cheln \\ud83d"}\n')
    with pytest.raises(DataError, match=r"cut\.jsonl line 2: the target \('de'\) holds a lone "
                                        r"surrogate escape \\ud83d \(at character 9\).*remove "
                                        r"that entry$"):
        load_corpus(CorpusSpec(train_file=str(path), valid_file=str(path)))


def test_a_null_side_of_the_translation_column_is_dropped_and_counted(tmp_path, caplog):
    """As in flat language columns: in a parquet file, a save_to_disk directory and a test set."""
    rows = [{"en": "a b", "de": "x"}, {"en": "c", "de": None}, {"en": None, "de": "y"},
            {"en": "d", "de": "z"}]
    ds = datasets.Dataset.from_dict({"translation": rows})
    ds.to_parquet(str(tmp_path / "t.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    with caplog.at_level(logging.INFO, logger="data"):
        from_parquet = read_file(tmp_path / "t.parquet", "en", "de")
    assert as_pairs(from_parquet) == [("a b", "x"), ("d", "z")]
    assert "dropped 2 of 4 pairs with an empty side (1 empty source, 1 empty target)" in caplog.text
    assert as_pairs(read_hf(str(tmp_path / "saved"), None, "en", "de")["train"]) == [
        ("a b", "x"), ("d", "z")]
    assert read_hf_split(str(tmp_path / "saved"), None, "train", "en", "de") == (
        ["a b", "c", "", "d"], ["x", "", "y", "z"], "train")


def test_held_out_sources_are_not_trained_on(tmp_path, caplog):
    """A corpus that holds pairs twice: the held-out slice is the one it always was, and the
    training pairs with one of its sources are dropped, counted in the log."""
    pairs = [(f"sentence {i}", f"Satz {i}") for i in range(150)] * 2 + [("once", "einmal")]
    spec = CorpusSpec(train_prefix=str(write_prefix(tmp_path / "train", pairs)), seed=5,
                      valid_fraction=0.1)
    with caplog.at_level(logging.INFO, logger="data"):
        corpus = load_corpus(spec)
    held_out = {source for source, _ in as_pairs(corpus["validation"])}
    trained = as_pairs(corpus["train"])
    assert held_out and not held_out & {source for source, _ in trained}
    unsplit = read_prefix(spec.train_prefix, "en", "de").train_test_split(
        test_size=30, seed=5, shuffle=True)
    assert as_pairs(corpus["validation"]) == as_pairs(unsplit["test"])
    assert trained == [pair for pair in as_pairs(unsplit["train"]) if pair[0] not in held_out]
    assert (f"dropped {271 - len(trained)} of 271 training pairs whose source is also a "
            "held-out validation source") in caplog.text
    assert as_pairs(load_corpus(spec)["train"]) == trained


@pytest.mark.parametrize("module, name, tool, suffix", [
    ("gzip", "gzip", "gunzip", ".gz"), ("lzma", "xz", "unxz", ".xz"),
    ("bz2", "bzip2", "bunzip2", ".bz2")])
def test_a_compressed_corpus_is_told_to_be_decompressed(tmp_path, module, name, tool, suffix):
    """Compressed files are not read; each way of giving one says to decompress it."""
    compress = __import__(module).compress
    text = "".join(f"sentence {i} ü\n" for i in range(50)).encode()
    prefix = tmp_path / "train"
    # Compressed bytes under a text file's name: not Latin-1 text, as their bytes suggest.
    Path(f"{prefix}.en").write_bytes(compress(text))
    Path(f"{prefix}.de").write_bytes(text)
    with pytest.raises(DataError, match=rf"train\.en line 1: invalid UTF-8 .*; it is {name}-"
                                        rf"compressed, not text: decompress it first \({tool} "):
        read_prefix(prefix, "en", "de")
    # The prefix's file compressed and named so: the compressed file is named.
    Path(f"{prefix}.en").rename(f"{prefix}.en{suffix}")
    with pytest.raises(DataError, match=rf"train\.en: file not found; .*; \S*train\.en{suffix} "
                                        rf"is {name}-compressed: decompress it first \({tool} "
                                        rf"-k \S*train\.en{suffix}\)"):
        read_prefix(prefix, "en", "de")
    tsv = tmp_path / f"pairs.tsv{suffix}"
    tsv.write_bytes(compress(b"a\tb\n"))
    with pytest.raises(DataError, match=rf"pairs\.tsv{suffix} is {name}-compressed: decompress it "
                                        rf"first \({tool} -k \S*\) and give \S*pairs\.tsv; "):
        read_file(tsv, "en", "de")


def test_zstd_bytes_are_told_to_be_decompressed(tmp_path):
    path = tmp_path / "train.en"
    path.write_bytes(b"\x28\xb5\x2f\xfd\x04\x58\x00\x00")
    with pytest.raises(DataError, match=r"it is zstd-compressed, not text: decompress it first "
                                        r"\(unzstd -c FILE > TEXT_FILE\)"):
        next(iter_lines(path))


def test_a_file_or_a_missing_local_path_given_as_dataset_is_not_a_hub_name(tmp_path,
                                                                          monkeypatch):
    """Only a name (one "/" at most, never first) is looked for on the hub; a file of pairs
    is told to go to --train-file."""
    from data import corpus

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(corpus.socket, "create_connection", no_hub)
    monkeypatch.setattr(corpus.datasets, "load_dataset", no_hub)
    parquet = tmp_path / "train.parquet"
    datasets.Dataset.from_dict({"en": ["a"], "de": ["b"]}).to_parquet(str(parquet))
    with pytest.raises(DataError, match=r"train\.parquet: is a file, not a dataset: give a file "
                                        r"of pairs with --train-file"):
        load_corpus(CorpusSpec(dataset=str(parquet)))
    monkeypatch.chdir(tmp_path)
    for missing in (str(tmp_path / "saved"), "./saved", "../saved", "~/saved", "data/en-de/saved"):
        with pytest.raises(DataError, match=rf"^{re.escape(missing)}: no such directory; give "
                                            r"--dataset a directory written by save_to_disk"):
            read_hf_split(missing, None, "test", "en", "de")


def test_csv_quoted_tsv_fields_are_warned_of_and_kept_as_written(tmp_path, caplog):
    """A TSV written with CSV quoting (pandas' to_csv(sep="\\t")): the quotes are not taken
    off, and one warning counts the lines that hold such a field."""
    path = tmp_path / "pandas.tsv"
    path.write_text('plain\t"quoted" speech\n"He said ""hi""."\t"Er sagte ""hallo""."\n'
                    'ok\tgut\n"x"\t"A ""b"""\n')
    with caplog.at_level(logging.INFO, logger="data"):
        pairs = as_pairs(read_file(path, "en", "de"))
    assert pairs[1] == ('"He said ""hi""."', '"Er sagte ""hallo""."')
    assert pairs[0] == ("plain", '"quoted" speech')
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert re.match(r"\S*pandas\.tsv: 2 lines \(the first: line 2\) hold a field in double "
                    r"quotes with doubled quotes inside.*never unquoted", warnings[0])
    assert "the quotes are read as text (trained on)" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data"):
        read_file_texts(path, "en", "de", Reader("translated and scored", "-"))
    assert [r.getMessage() for r in caplog.records
            if "the quotes are read as text (translated and scored)" in r.getMessage()]
