"""Reading sentence pairs from every supported source into one `datasets.DatasetDict`.

Whatever the source, the result has splits `train`, `validation` and, when one was given,
`test`, each with two string columns: `source` and `target`. Sources:

- aligned text files by prefix (`PREFIX.en` / `PREFIX.de`, the fairseq/Marian/OpenNMT layout);
- a `.tsv` file (`source<TAB>target`), a `.jsonl` file (`{"en": .., "de": ..}` or
  `{"translation": {"en": .., "de": ..}}`) or a `.parquet` file (columns as in JSON Lines);
- a Hugging Face dataset: a hub name with config, or a directory written by `save_to_disk`;
- the built-in offline corpus: English <-> `LANG` pairs read at run time from the machine's
  gettext catalogs (`/usr/share/locale/LANG/LC_MESSAGES/*.mo`).

All text is stripped of surrounding whitespace; pairs with an empty (or, in a dataset, missing)
side are dropped and counted. A UTF-8 byte order mark at the start of a text file is removed.
Every count (pairs read, dropped and why, held-out validation) is reported through the logger
named "data" at INFO level; callers that want to see it configure logging.
Bad input raises `DataError` (a `ValueError`) whose message names the file, the line or the
value at fault and what to do about it.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import struct
import urllib.parse
from collections import Counter
from itertools import zip_longest
from pathlib import Path
from typing import Callable, Iterable, Iterator

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from data.arrow_text import cached_pairs, file_digest
from data.config import DEFAULT_LOCALE_DIR, CorpusSpec, DataError
from data.lines import (
    COMPRESSIONS,
    CR_HINT,
    SURROGATE,
    count_lines,
    is_regular_file,
    iter_lines,
)

log = logging.getLogger("data")

SPLITS = ("train", "validation", "test")
# Names that other corpora use for our three splits.
_SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "dev": "validation",
    "test": "test",
}


@dataclasses.dataclass(frozen=True)
class Reader:
    """The command a file of pairs is read for, as its messages name it: what the file's text
    becomes there, and that command's own flags for aligned text files, the other way to give
    the pairs (a message naming another command's flags sends the reader astray)."""

    text_becomes: str  # "trained on", "translated and scored"
    aligned_flags: str  # "--train-prefix, --valid-prefix or --test-prefix"
    file_flags: str = "--train-file (--valid-file, --test-file)"  # for a .tsv/.jsonl/.parquet
    local_files: str = ("--train-prefix PREFIX with --src/--tgt (reads PREFIX.SRC and "
                        "PREFIX.TGT), a .tsv/.jsonl/.parquet file with --train-file")


TRAINING = Reader("trained on", "--train-prefix, --valid-prefix or --test-prefix")
HELD_OUT = dataclasses.replace(TRAINING, text_becomes="scored")  # train.py's valid/test files
SCORING = Reader(  # translate.py's --evaluate and --score
    "translated and scored", "--test-prefix PREFIX or --src-file with --ref-file",
    file_flags="--test-file",
    local_files="--test-prefix PREFIX with --src/--tgt (reads PREFIX.SRC and PREFIX.TGT), "
                "--src-file with --ref-file, a .tsv/.jsonl/.parquet file with --test-file")


# ---------------------------------------------------------------------------------------------
# Pairs -> Dataset


def check_files(spec: CorpusSpec) -> None:
    """DataError naming the first file of `spec` that does not exist, and where to get the
    corpus (`spec.source`): before any tokenizer is trained or step compiled."""
    where = f"; get the corpus: {spec.source}" if spec.source else ""
    for split in ("train", "valid", "test"):
        prefix = getattr(spec, f"{split}_prefix")
        for path in (Path(f"{prefix}.{spec.src}"), Path(f"{prefix}.{spec.tgt}")) if prefix else ():
            if path.exists():
                _check_regular(path)
            else:
                raise prefix_not_found(path, prefix, spec.src, spec.tgt, f"--{split}-prefix",
                                        where)
    for path in (Path(f) for f in (spec.train_file, spec.valid_file, spec.test_file) if f):
        if path.exists():
            _check_regular(path)
        else:
            raise DataError(f"{path}: file not found; "
                            + (where[2:] or "check the --train/valid/test-file flags"))


def prefix_not_found(path: Path, prefix: str | Path, src: str, tgt: str,
                      flag: str = "--train/valid/test-prefix", where: str = "") -> DataError:
    """The error for file `path` of `prefix` missing: which files the prefix reads, and
    the likely slip where there is one (the file compressed, a language suffix given, or a
    directory)."""
    prefix = str(prefix)
    compressed = next((c for c in COMPRESSIONS if Path(f"{path}{c.suffix}").is_file()), None)
    hint = (f"; {compressed.decompress_hint(f'{path}{compressed.suffix}')}" if compressed
            else _prefix_slip(prefix, src, tgt, flag))
    return DataError(f"{path}: file not found; {flag} {prefix} with --src {src} --tgt {tgt} "
                     f"reads {prefix}.{src} and {prefix}.{tgt}{hint}{where}")


def _prefix_slip(prefix: str, src: str, tgt: str, flag: str) -> str:
    """"; what to give instead" for a prefix given with its language suffix or as the
    directory that holds the files, else ""."""
    for language in (src, tgt):
        if prefix.endswith(f".{language}"):
            return f"; drop the language suffix: {flag} {prefix.removesuffix(f'.{language}')}"
    if not Path(prefix).is_dir():
        return ""
    found = sorted(p.with_suffix("") for p in Path(prefix).glob(f"*.{src}")
                   if p.with_suffix(f".{tgt}").is_file())
    if found:
        return f"; {prefix} is a directory: give {flag} {found[0]}"
    return (f"; {prefix} is a directory: give the files' path without the language "
            f"suffix, such as {Path(prefix) / 'train'} for {Path(prefix) / f'train.{src}'}")


def _check_regular(path: Path) -> None:
    """DataError unless `path`, which exists, is a file that can be read twice (once to
    fingerprint it for the cache, once for its pairs)."""
    if path.is_dir():
        raise DataError(f"{path}: is a directory; give a text file")
    if not path.is_file():
        raise DataError(f"{path}: is not a regular file (a pipe or a device?); a corpus file "
                        "is read twice, to fingerprint it for the cache and for its pairs: "
                        "write it to a file first")


def _files_pairs(paths: list[Path], how: str, origin: str,
                 pairs: Iterator[tuple[str, str]]) -> datasets.Dataset:
    """The pairs that reading the files `paths` gives, through the cache (`cached_pairs`)."""
    size = sum(path.stat().st_size for path in paths if is_regular_file(path))
    return cached_pairs(pairs, origin, file_digest(paths, how), input_bytes=size, files=paths)


def read_prefix(prefix: str | Path, src: str, tgt: str) -> datasets.Dataset:
    """Read `prefix.src` and `prefix.tgt`, two files aligned line by line, streamed.

    Raises `DataError` for a missing file, invalid UTF-8 (file and line), different line counts
    (both files and both counts) or no pairs at all.
    """
    src_path, tgt_path = Path(f"{prefix}.{src}"), Path(f"{prefix}.{tgt}")
    for path in (src_path, tgt_path):
        if path.exists():
            _check_regular(path)
        else:
            raise prefix_not_found(path, prefix, src, tgt)
    return _files_pairs([src_path, tgt_path], "prefix", f"{prefix}.{{{src},{tgt}}}",
                        _aligned_lines(src_path, tgt_path))


def _aligned_lines(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    for s, t in zip_longest(iter_lines(src_path), iter_lines(tgt_path)):
        if s is None or t is None:
            raise _line_count_error(src_path, tgt_path)
        yield s, t


def _line_count_error(src_path: Path, tgt_path: Path) -> DataError:
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)
    return DataError(
        f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; line N of one file must "
        "translate line N of the other"
    )


def _tsv_pairs(path: Path, reader: Reader) -> Iterator[tuple[str, str]]:
    """`source<TAB>target` lines as they are; a blank line is an empty pair. A line with
    other than exactly one TAB is an error. Fields are never unquoted: those that a CSV writer
    quoted are warned of, once, at the end, in `reader`'s words."""
    quoted = first_quoted = 0
    for line_no, line in enumerate(iter_lines(path), start=1):
        fields = _tsv_fields(path, line_no, line, reader)
        if any(map(_csv_quoted, fields)):
            quoted += 1
            first_quoted = first_quoted or line_no
        yield fields[0], fields[1]
    if quoted:
        log.warning("%s: %d lines (the first: line %d) hold a field in double quotes with "
                    "doubled quotes inside, as CSV writers such as pandas' to_csv quote "
                    "them; TSV fields are read as they are, never unquoted, so the quotes "
                    "are read as text (%s): write the file without quoting "
                    "(quoting=csv.QUOTE_NONE) or as JSON Lines", path, quoted, first_quoted,
                    reader.text_becomes)


def _tsv_fields(path: Path, line_no: int, line: str, reader: Reader) -> list[str]:
    """The two fields of one TSV line (two empty ones for a blank line); DataError for a line
    with other than one TAB, naming `reader`'s flags for aligned text files."""
    fields = line.split("\t")
    if len(fields) == 2:
        return fields
    if not line.strip():
        return ["", ""]
    if len(fields) == 1:
        fault, fix = ("the target column is missing (no TAB)",
                      "add a TAB and the target to that line")
    else:
        fault, fix = (f"{len(fields) - 1} TABs, where source<TAB>target has one",
                      "remove the stray TABs")
    if "\r" in line:  # old Mac line endings: the whole file, or much of it, is this line
        raise _carriage_returns(path, line_no, fault)
    raise DataError(f"{path} line {line_no}: {fault}; {fix}, or give the pairs as aligned text "
                    f"files with {reader.aligned_flags}")


def _carriage_returns(path: Path, line_no: int, fault: str) -> DataError:
    """The error for a line that fails to parse and holds carriage returns: its lines end in
    "\\r" alone, and converting the file mends it, where the fault's own fix would not."""
    return DataError(f"{path} line {line_no}: {fault}, and the line holds carriage returns "
                     f"(\\r): {CR_HINT}")


def _csv_quoted(field: str) -> bool:
    """Whether `field` reads as CSV quoting: in double quotes, with a quote doubled inside."""
    return len(field) > 2 and field[0] == field[-1] == '"' and '""' in field[1:-1]


def _pick_pair(inner, src: str, tgt: str, where: str) -> tuple[str, str]:
    """Return (source, target) from a `{src: .., tgt: ..}` dict; DataError for a side that is
    not a string or not whole characters."""
    if not isinstance(inner, dict):
        value = "null" if inner is None else f"{type(inner).__name__} {inner!r:.60}"
        raise DataError(f"{where}: the translation is {value}, not an object of language keys "
                        f"such as {{{src!r}: .., {tgt!r}: ..}}; fix or remove that entry")
    if src not in inner or tgt not in inner:
        found = sorted(inner)
        raise DataError(
            f"{where}: expected language keys {src!r} and {tgt!r}, found {found}; "
            "set --src/--tgt to keys that the data has"
        )
    pair = inner[src], inner[tgt]
    if not all(isinstance(text, str) for text in pair):
        raise DataError(
            f"{where}: values for {src!r} and {tgt!r} must be strings, got {pair!r}; fix or "
            "remove that entry"
        )
    _check_whole_characters(pair, src, tgt, where)
    return pair


def _check_whole_characters(pair: tuple[str, str], src: str, tgt: str, where: str) -> None:
    """DataError naming the side of `pair` that holds a lone surrogate, caught here, where
    the line is known, not when the cache fails to encode it; or a NUL (`_check_no_nul`)."""
    for side, key, text in (("source", src, pair[0]), ("target", tgt, pair[1])):
        _check_no_nul(text, f"{where}: the {side} ({key!r})")
        if found := SURROGATE.search(text):
            raise DataError(
                f"{where}: the {side} ({key!r}) holds a lone surrogate escape "
                f"\\u{ord(found.group()):04x} (at character {found.start() + 1}), half of a "
                "character such as an emoji cut in two, which no file can store; write the "
                "whole character (or both halves of its escape) or remove that entry"
            )


def _check_no_nul(text: str, what: str) -> None:
    """DataError for a value holding a NUL character (a JSON "\\u0000", a table's string),
    which a text file's line may not hold either (`data.lines.decode_line`)."""
    if (first := text.find("\x00")) >= 0:
        raise DataError(f"{what} holds a NUL character (\\u0000, at character {first + 1}), "
                        "and text holds none; remove it or that entry")


_JSON_LINES = ("; a .json or .jsonl file must be JSON Lines, one object per line (a JSON array "
               "converts with: jq -c '.[]' FILE > FILE.jsonl)")


class _RepeatedKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _object_without_repeats(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict; _RepeatedKey for a key given twice, whose first value a plain
    dict would drop without a word."""
    record = dict(pairs)
    if len(record) < len(pairs):
        raise _RepeatedKey(next(key for key, _ in pairs if sum(k == key for k, _ in pairs) > 1))
    return record


def _jsonl_pairs(path: Path, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """One pair per JSON object, flat or under a `translation` key; blank lines skipped."""
    for line_no, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_object_without_repeats)
        except _RepeatedKey as err:
            raise DataError(f"{path} line {line_no}: the key {err.key!r} appears twice in one "
                            "object (JSON readers keep only its last value); remove one of them"
                            ) from None
        except json.JSONDecodeError as err:
            if "\r" in line:
                raise _carriage_returns(path, line_no, f"not valid JSON ({err.msg})") from None
            hint = _JSON_LINES if line.lstrip().startswith("[") else ""
            raise DataError(f"{path} line {line_no}: not valid JSON ({err.msg}){hint}") from None
        if not isinstance(record, dict):
            raise DataError(f"{path} line {line_no}: expected a JSON object, got "
                            f"{line[:60]!r}{_JSON_LINES}")
        nested, languages = record.get("translation"), (src in record, tgt in record)
        if isinstance(nested, dict) or ("translation" in record and (
                not any(languages) or nested is None and not all(languages))):
            # {"translation": {...}}; null, or a list or text with no language key beside
            # it: `_pick_pair` blames the row or names what the translation is
            inner = nested
        else:
            inner = record  # flat, perhaps with a "translation" field of its own ("manual")
        yield _pick_pair(inner, src, tgt, where=f"{path} line {line_no}")


def _column_text(text, row: int, column: str, origin: str) -> str:
    """One dataset value as a string; a missing value (null) becomes "", an empty side.

    Raises `DataError` naming the row and column of a value that is not a string.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        raise DataError(
            f"{origin} row {row} (0-based), column {column!r}: expected a string, got "
            f"{type(text).__name__} {text!r}; store the sentences as text, or set --src/--tgt "
            "to the text columns"
        )
    _check_no_nul(text, f"{origin} row {row} (0-based), column {column!r}")
    return text


def _hf_pairs(ds: datasets.Dataset, src: str, tgt: str, origin: str,
              batch_size: int = 10_000) -> Iterator[tuple[str, str]]:
    """(source, target) of each row of a Hugging Face split, every row kept and nothing
    stripped, read batch by batch (`_column_pairs`)."""
    return _column_pairs(ds.features, lambda columns: ds.select_columns(columns).iter(batch_size),
                         src, tgt, origin)


def _nulls_as_empty(translation):
    """A `translation` value with its missing (null) sides as "", as a language column reads
    them; anything but a dict is left for `_pick_pair` to refuse."""
    if not isinstance(translation, dict):
        return translation
    return {language: "" if text is None else text for language, text in translation.items()}


def _by_language(value, src: str, tgt: str):
    """A `TranslationVariableLanguages` value ({"language": [..], "translation": [..]}, any
    number of texts per language) as {language: text}: a language given twice keeps its first
    text, and `src` or `tgt` missing from the row is a missing (null) side."""
    if not isinstance(value, dict):
        return value
    texts = {src: None, tgt: None}
    for language, text in zip(value["language"], value["translation"]):
        if texts.get(language) is None:
            texts[language] = text
    return texts


def _column_pairs(features: datasets.Features,
                  batches: Callable[[list[str]], Iterable[dict[str, list]]],
                  src: str, tgt: str, origin: str) -> Iterator[tuple[str, str]]:
    """(source, target) of each row of a table with `features`, whose `batches(columns)` gives
    those columns batch by batch as lists of Python values, every row kept and nothing
    stripped.

    Reads the standard `translation` column (dicts keyed by language, or a variable-languages
    column's lists, `_by_language`), else columns named `src` and `tgt`, else columns already
    named `source` and `target`. A missing (null) side,
    in a language column or in the `translation` column, gives ""; a null in place of a whole
    translation, or a value that is not a string, raises `DataError` naming the row.
    """
    columns = list(features)
    if "translation" in columns:
        feature = features["translation"]
        variable = isinstance(feature, datasets.TranslationVariableLanguages)
        languages = getattr(feature, "languages", None) or list(getattr(feature, "keys", list)())
        if languages and (src not in languages or tgt not in languages):
            raise DataError(
                f"{origin}: expected languages {src!r} and {tgt!r} in the translation column, "
                f"found {sorted(languages)}; set --src/--tgt to languages the dataset has"
            )
        row = 0
        for batch in batches(["translation"]):
            for pair in batch["translation"]:
                if variable:
                    pair = _by_language(pair, src, tgt)
                yield _pick_pair(_nulls_as_empty(pair), src, tgt,
                                 f"{origin} row {row} (0-based), column 'translation'")
                row += 1
        return
    for src_column, tgt_column in ((src, tgt), ("source", "target")):
        if src_column in columns and tgt_column in columns:
            row = 0
            for batch in batches([src_column, tgt_column]):
                for s, t in zip(batch[src_column], batch[tgt_column]):
                    yield (_column_text(s, row, src_column, origin),
                           _column_text(t, row, tgt_column, origin))
                    row += 1
            return
    raise DataError(
        f"{origin}: expected a 'translation' column or columns {src!r} and {tgt!r}, "
        f"found columns {columns}; set --src/--tgt to match the dataset"
    )


def _hf_texts(ds: datasets.Dataset, src: str, tgt: str, origin: str
              ) -> tuple[list[str], list[str]]:
    """(sources, targets) of a Hugging Face split as lists (`_hf_pairs`): for test sets."""
    pairs = list(_hf_pairs(ds, src, tgt, origin))
    return [s for s, _ in pairs], [t for _, t in pairs]


def from_hf_dataset(ds: datasets.Dataset, src: str, tgt: str, origin: str) -> datasets.Dataset:
    """Convert a Hugging Face split to `source`/`target` columns (see `_hf_pairs`), stripped,
    with pairs that have an empty or missing side dropped and counted, streamed into the
    cache."""
    key = hashlib.blake2b(f"hf|{ds._fingerprint}|{src}|{tgt}".encode(),
                          digest_size=16).hexdigest()
    return cached_pairs(_hf_pairs(ds, src, tgt, origin), origin, key,
                        input_bytes=ds.data.nbytes)


def _first_line(err: Exception) -> str:
    """The first line of an exception's message (its type name if it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _parquet_pairs(path: Path, src: str, tgt: str, batch_size: int = 10_000
                   ) -> Iterator[tuple[str, str]]:
    """The rows of a parquet file as `_column_pairs` reads them, streamed batch by batch from
    the file's current bytes (`datasets.Dataset.from_parquet` caches by path and modification
    time, and would give the old rows of a file rewritten within the same second)."""
    parquet, features = _open_parquet(path)  # a file that is not parquet fails here, at once

    def batches(columns: list[str]) -> Iterator[dict[str, list]]:
        with parquet:
            try:
                for batch in parquet.iter_batches(batch_size=batch_size, columns=columns):
                    yield batch.to_pydict()
            except Exception as err:  # noqa: BLE001 - pyarrow raises many kinds
                raise _unreadable_parquet(path, err) from None

    return _column_pairs(features, batches, src, tgt, origin=str(path))


def _open_parquet(path: Path) -> tuple[pq.ParquetFile, datasets.Features]:
    """The parquet file `path`, opened, and the features that `datasets` reads it with (its
    own metadata, as `datasets` wrote it, else the columns' Arrow types)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; check the path")
    try:
        parquet = pq.ParquetFile(str(path))
        return parquet, datasets.Features.from_arrow_schema(parquet.schema_arrow)
    except Exception as err:  # noqa: BLE001 - pyarrow and datasets raise many kinds
        raise _unreadable_parquet(path, err) from None


def _unreadable_parquet(path: Path, err: Exception) -> DataError:
    return DataError(
        f"{path}: not a readable parquet file ({_first_line(err)}); check the file, or "
        "give the pairs as .tsv or .jsonl"
    )


def _file_pairs(path: Path, src: str, tgt: str, reader: Reader) -> Iterator[tuple[str, str]]:
    """The pairs of one `.tsv`, `.jsonl`/`.json` or `.parquet` file, chosen by its suffix;
    errors name `reader`'s flags."""
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return _tsv_pairs(path, reader)
    if suffix in (".jsonl", ".json"):
        return _jsonl_pairs(path, src, tgt)
    if suffix == ".parquet":
        return _parquet_pairs(path, src, tgt)
    for compression in COMPRESSIONS:
        if suffix == compression.suffix:
            raise DataError(f"{compression.decompress_hint(path)} and give {path.with_suffix('')}"
                            "; compressed files are not read")
    raise DataError(
        f"{path}: unknown file type {suffix!r}; use .tsv, .jsonl or .parquet, or "
        f"aligned text files with {reader.aligned_flags}"
    )


def read_file_texts(path: str | Path, src: str, tgt: str, reader: Reader
                    ) -> tuple[list[str], list[str]]:
    """(sources, targets) of one `.tsv`, `.jsonl`/`.json` or `.parquet` file, chosen by its
    suffix, with every pair kept as written: nothing stripped, empty sides kept (a blank .tsv
    line is an empty pair). For scoring, where dropping a pair would change the score; the
    messages speak to `reader`, the command that scores."""
    pairs = list(_file_pairs(Path(path), src, tgt, reader))
    return [s for s, _ in pairs], [t for _, t in pairs]


def read_file(path: str | Path, src: str, tgt: str, reader: Reader = TRAINING
              ) -> datasets.Dataset:
    """Read one `.tsv`, `.jsonl`/`.json` or `.parquet` file, chosen by its suffix, for
    train.py (`reader`: TRAINING, or HELD_OUT for its valid and test files), streamed: sides
    stripped, pairs with an empty side dropped and counted."""
    path = Path(path)
    pairs = _file_pairs(path, src, tgt, reader)  # checks the suffix before anything is read
    return _files_pairs([path], f"{path.suffix.lower()}|{src}|{tgt}", str(path), pairs)


def _hub_host() -> str:
    return urllib.parse.urlparse(datasets.config.HF_ENDPOINT).hostname or "huggingface.co"


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the hub answers a connection within `timeout` seconds: offline, its client
    retries for half a minute before it gives up."""
    if datasets.config.HF_HUB_OFFLINE:
        return False
    try:
        socket.create_connection((_hub_host(), 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """The hub's clients in offline mode while inside, if `offline`: a dataset in the local
    cache still loads, and one that is not fails at once."""
    if not offline:
        yield
        return
    import huggingface_hub.constants

    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def _check_not_a_local_path(name: str, reader: Reader) -> None:
    """DataError for a dataset name that is a file, or a path (not a hub name: at most one
    "/", never first) to a directory that does not exist: the hub would not know it either."""
    if Path(name).is_file():
        raise DataError(f"{name}: is a file, not a dataset: give a file of pairs with "
                        f"{reader.file_flags}, and --dataset a directory written by "
                        "save_to_disk or a hub name")
    looks_local = (name.startswith(("/", "./", "../", "~")) or name.count("/") > 1
                   or os.sep != "/" and os.sep in name)
    if looks_local and not Path(name).exists():
        raise DataError(f"{name}: no such directory; give --dataset a directory written by "
                        "save_to_disk, or a hub name such as wmt14 (with --dataset-config de-en)")


def _load_hf(name: str, config: str | None, reader: Reader) -> datasets.DatasetDict:
    """Open a dataset saved with `save_to_disk` (a directory) or from the hub by name+config.

    A lone `Dataset` becomes the split `train`. Nothing is read into memory yet. Errors
    name `reader`'s flags for local files.
    """
    _check_not_a_local_path(name, reader)
    if Path(name).is_dir():
        if config:
            raise DataError(f"{name}: --dataset-config {config}, but a save_to_disk directory "
                            "has no configurations; drop --dataset-config")
        try:
            loaded = datasets.load_from_disk(name)
        except Exception as err:  # noqa: BLE001 - not a dataset directory, or a damaged one
            raise DataError(
                f"{name}: not a dataset directory written by save_to_disk ({_first_line(err)}); "
                "give a directory that Dataset.save_to_disk or DatasetDict.save_to_disk wrote"
            ) from None
    else:
        reachable = _hub_reachable()
        try:
            with _hub_offline(not reachable):
                loaded = datasets.load_dataset(name, config)
        except Exception as err:  # no network, unknown name or config: one sentence, no traceback
            where = ("" if reachable else f"{_hub_host()} cannot be reached from here and the "
                                          "dataset is not in the local cache; ")
            raise DataError(
                f"could not load dataset {name!r} (config {config!r}) from the Hugging Face hub "
                f"({where}{_first_line(err)}); use local files instead: {reader.local_files}, "
                "or a directory written by save_to_disk"
            ) from None
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


def read_hf_split(name: str, config: str | None, split: str, src: str, tgt: str,
                  reader: Reader = SCORING) -> tuple[list[str], list[str], str]:
    """(sources, targets, split name found) of one split, for scoring a test set (its
    messages speak to `reader`, the command that scores).

    Only that split is read; the dataset needs no train split. Unlike `read_hf`, every pair is
    kept as it is (not stripped; a missing side is ""), so that scores cover the whole test
    set as sacreBLEU would on the same data. `split` may be the dataset's own name or one of
    ours with its aliases ("valid" or "dev" find "validation").
    """
    loaded = _load_hf(name, config, reader)
    wanted = _SPLIT_ALIASES.get(split, split)
    found = split if split in loaded else next(
        (s for s in sorted(loaded) if _SPLIT_ALIASES.get(s, s) == wanted), None)
    if found is None:
        raise DataError(f"{name}: no {split!r} split; it has {sorted(loaded)}; choose one "
                        "with --split")
    sources, targets = _hf_texts(loaded[found], src, tgt, origin=f"{name}[{found}]")
    return sources, targets, found


def read_hf(name: str, config: str | None, src: str, tgt: str) -> datasets.DatasetDict:
    """Load a dataset saved with `save_to_disk` (a directory) or from the hub by name+config."""
    loaded = _load_hf(name, config, TRAINING)
    result = {}
    for split_name, split in loaded.items():
        ours = _SPLIT_ALIASES.get(split_name)
        if ours is None or ours in result:
            log.info("%s: ignoring split %r", name, split_name)
            continue
        result[ours] = from_hf_dataset(split, src, tgt, origin=f"{name}[{split_name}]")
    if "train" not in result:
        raise DataError(f"{name}: no train split, found splits {sorted(loaded)}")
    return datasets.DatasetDict(result)


# ---------------------------------------------------------------------------------------------
# Built-in corpus from gettext catalogs


@dataclasses.dataclass
class GettextStats:
    """What reading the gettext catalogs found; `dropped` counts entries per reason."""

    catalogs_read: int = 0
    catalogs_skipped: int = 0
    entries: int = 0
    pairs: int = 0
    dropped: Counter = dataclasses.field(default_factory=Counter)


def _catalog_pairs(catalog: dict, stats: GettextStats) -> Iterator[tuple[str, str]]:
    """Yield English->translation pairs of one catalog, counting each skipped entry.

    Multi-line entries are split into line pairs when both sides have the same number of
    non-empty lines (help texts translated line by line); otherwise the line alignment is
    unknown and the entry is dropped ("line count differs").
    """
    for msgid, msgstr in catalog.items():
        stats.entries += 1
        if isinstance(msgid, tuple):
            stats.dropped["plural"] += 1
        elif msgid == "":
            stats.dropped["header"] += 1
        elif "\x04" in msgid:
            stats.dropped["context"] += 1
        elif not msgstr.strip() or msgstr == msgid:
            stats.dropped["untranslated"] += 1
        elif "\n" not in msgid.strip() and "\n" not in msgstr.strip():
            yield msgid.strip(), msgstr.strip()
        else:
            src_lines = [s.strip() for s in msgid.split("\n") if s.strip()]
            tgt_lines = [t.strip() for t in msgstr.split("\n") if t.strip()]
            if len(src_lines) != len(tgt_lines):
                stats.dropped["line count differs"] += 1
                continue
            stats.dropped["multi-line, split"] += 1
            yield from zip(src_lines, tgt_lines)


_MO_MAGIC = 0x950412DE


def read_mo_catalog(path: Path) -> dict:
    """A compiled gettext catalog as {msgid: msgstr} ({(msgid, n): msgstr} for plural forms),
    decoded in the charset its header declares (Python's gettext decodes the header itself as
    UTF-8 first, and so refuses a Latin-1 catalog whose header has a non-ASCII byte).
    ValueError, LookupError or struct.error for a damaged catalog or an unknown charset."""
    data = path.read_bytes()
    for order in ("<", ">"):
        if struct.unpack(order + "I", data[:4])[0] == _MO_MAGIC:
            break
    else:
        raise ValueError("not a gettext .mo file (bad magic number)")
    _, count, originals, translations = struct.unpack(order + "4I", data[4:20])
    raw = []
    for i in range(count):
        length, offset = struct.unpack(order + "2I", data[originals + 8 * i:originals + 8 * i + 8])
        t_length, t_offset = struct.unpack(order + "2I",
                                           data[translations + 8 * i:translations + 8 * i + 8])
        if offset + length > len(data) or t_offset + t_length > len(data):
            raise ValueError(f"entry {i} points past the end of the file")
        raw.append((data[offset:offset + length], data[t_offset:t_offset + t_length]))
    header = dict(raw).get(b"", b"")
    declared = re.search(rb"charset=([A-Za-z0-9_.:-]+)", header)
    charset = declared.group(1).decode("ascii") if declared else "utf-8"
    codecs.lookup(charset)  # LookupError for a charset Python does not know
    catalog: dict = {}
    for msgid, msgstr in raw:
        if b"\x00" in msgid:  # plural forms: singular\0plural -> form0\0form1...
            singular = msgid.split(b"\x00")[0].decode(charset)
            for n, form in enumerate(msgstr.split(b"\x00")):
                catalog[(singular, n)] = form.decode(charset)
        else:
            catalog[msgid.decode(charset)] = msgstr.decode(charset)
    return catalog


def read_gettext_pairs(lang: str, locale_dir: str | Path = DEFAULT_LOCALE_DIR
                       ) -> tuple[list[tuple[str, str]], GettextStats]:
    """Collect unique (English, `lang`) pairs from `locale_dir/lang/LC_MESSAGES/*.mo`.

    Skips plural and context entries, the header, untranslated entries and catalogs that fail
    to parse or decode; keeps placeholders such as `%s` as they are. Pairs whose translation
    equals the English after splitting are dropped as untranslated. Deterministic: catalogs
    are read in file-name order.
    """
    stats = GettextStats()
    seen: set[tuple[str, str]] = set()
    pairs: list[tuple[str, str]] = []
    for mo_path in sorted(Path(locale_dir, lang, "LC_MESSAGES").glob("*.mo")):
        try:
            catalog = read_mo_catalog(mo_path)
        except (OSError, UnicodeDecodeError, LookupError, ValueError, struct.error) as err:
            log.info("skipping gettext catalog %s: %s", mo_path, err)
            stats.catalogs_skipped += 1
            continue
        stats.catalogs_read += 1
        for pair in _catalog_pairs(catalog, stats):
            if pair[0] == pair[1]:
                stats.dropped["untranslated"] += 1
            elif pair in seen:
                stats.dropped["duplicate"] += 1
            else:
                seen.add(pair)
                pairs.append(pair)
    stats.pairs = len(pairs)
    return pairs, stats


def hash_split(text: str, valid_per_mille: int = 20, test_per_mille: int = 20) -> str:
    """Assign a split from a stable hash of the source text, so splits never share a source."""
    bucket = int(hashlib.md5(text.encode("utf-8")).hexdigest()[:8], 16) % 1000
    if bucket < valid_per_mille:
        return "validation"
    if bucket < valid_per_mille + test_per_mille:
        return "test"
    return "train"


def read_builtin(spec: CorpusSpec) -> datasets.DatasetDict:
    """The built-in corpus: gettext catalog pairs between English and the other language.

    Splits validation (2%) and test (2%) by a hash of the English side. Raises `DataError`
    when fewer than `spec.min_builtin_pairs` pairs are found.
    """
    if "en" not in (spec.src, spec.tgt):
        raise DataError(
            f"the built-in gettext corpus pairs English with another language, but --src "
            f"{spec.src} --tgt {spec.tgt} has no 'en'; use --train-prefix or --dataset"
        )
    lang = spec.tgt if spec.src == "en" else spec.src
    pairs, stats = read_gettext_pairs(lang, spec.locale_dir)
    dropped = ", ".join(f"{n} {reason}" for reason, n in sorted(stats.dropped.items()))
    log.info(
        "built-in corpus en-%s: %d pairs from %d gettext catalogs in %s/%s/LC_MESSAGES "
        "(%d catalogs skipped; %d entries; dropped or split: %s)",
        lang, stats.pairs, stats.catalogs_read, spec.locale_dir, lang, stats.catalogs_skipped,
        stats.entries, dropped or "none",
    )
    if len(pairs) < spec.min_builtin_pairs:
        raise DataError(
            f"the built-in corpus found only {len(pairs)} en-{lang} pairs in "
            f"{spec.locale_dir}/{lang}/LC_MESSAGES/*.mo (at least {spec.min_builtin_pairs} "
            "needed); give training data with --train-prefix PREFIX (PREFIX.SRC, PREFIX.TGT) "
            "or --dataset NAME, or install translations (e.g. apt-get install "
            "language-pack-" + lang + ")"
        )
    columns = {split: ([], []) for split in SPLITS}
    for english, other in pairs:
        src_text, tgt_text = (english, other) if spec.src == "en" else (other, english)
        sources, targets = columns[hash_split(english)]
        sources.append(src_text)
        targets.append(tgt_text)
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({"source": s, "target": t})
        for split, (s, t) in columns.items()
    })


# ---------------------------------------------------------------------------------------------
# Entry point


def hold_out_validation(train: datasets.Dataset, fraction: float, max_pairs: int, seed: int
                        ) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split a seeded slice of `fraction` of `train` (at most `max_pairs`, at least 1) off.

    Returns (train, validation); the same seed and data always give the same slice, and the
    training pairs whose source is a held-out source are dropped (`_without_sources_of`).
    """
    n = len(train)
    if n < 2:
        raise DataError(f"need at least 2 training pairs to hold out a validation set, got {n}; "
                        "give a validation set (--valid-prefix or --valid-file) or more "
                        "training pairs")
    size = max(1, min(max_pairs, round(fraction * n)))
    parts = train.train_test_split(test_size=size, seed=seed, shuffle=True)
    log.info(
        "no validation split given: held out %d of %d training pairs (seed %d) as validation",
        size, n, seed,
    )
    return _without_sources_of(parts["train"], parts["test"]), parts["test"]


def _without_sources_of(train: datasets.Dataset, validation: datasets.Dataset
                        ) -> datasets.Dataset:
    """`train` less its pairs whose source is also a source of `validation`: a pair that the
    corpus holds twice would otherwise be scored on text the model trained on."""
    held_out = pa.array(sorted(set(validation["source"])), pa.large_string())
    kept = np.flatnonzero(~_sources_among(train, held_out))
    if len(kept) == len(train):
        return train
    if not len(kept):
        raise DataError(f"every one of the {len(train)} training pairs left after holding out "
                        "validation has a held-out source; give a validation set "
                        "(--valid-prefix or --valid-file) or more training pairs")
    log.info("dropped %d of %d training pairs whose source is also a held-out validation "
             "source (pairs the corpus holds more than once)", len(train) - len(kept),
             len(train))
    return train.select(kept)


def _sources_among(split: datasets.Dataset, sources: pa.Array) -> np.ndarray:
    """Whether each row of `split` has its source among `sources`: Arrow's hashing over the
    column as stored, then the split's own rows of it (a split is a mapping into the table),
    which takes seconds for 36M pairs where reading the mapped rows took minutes."""
    column = split.data.column("source").cast(pa.large_string())
    found = pc.is_in(column, value_set=sources).to_numpy(zero_copy_only=False)
    if split._indices is None:
        return found
    return found[split._indices.column("indices").to_numpy()]


def _read_training_source(spec: CorpusSpec) -> dict[str, datasets.Dataset]:
    if spec.uses_builtin:
        return dict(read_builtin(spec))
    if spec.train_prefix:
        return {"train": read_prefix(spec.train_prefix, spec.src, spec.tgt)}
    if spec.train_file:
        return {"train": read_file(spec.train_file, spec.src, spec.tgt)}
    return dict(read_hf(spec.dataset, spec.dataset_config, spec.src, spec.tgt))


def load_corpus(spec: CorpusSpec) -> datasets.DatasetDict:
    """Read the corpus named by `spec` into splits train, validation (and test if given).

    Columns: `source`, `target` (str). Explicit valid/test prefixes or files replace the
    splits of the training source. Counts are logged to the "data" logger.
    """
    splits = _read_training_source(spec)
    for split, prefix, path in (
        ("validation", spec.valid_prefix, spec.valid_file),
        ("test", spec.test_prefix, spec.test_file),
    ):
        if prefix:
            splits[split] = read_prefix(prefix, spec.src, spec.tgt)
        elif path:
            splits[split] = read_file(path, spec.src, spec.tgt, HELD_OUT)
    if "validation" not in splits:
        splits["train"], splits["validation"] = hold_out_validation(
            splits["train"], spec.valid_fraction, spec.max_valid, spec.seed
        )
    return datasets.DatasetDict({name: splits[name] for name in SPLITS if name in splits})


def iter_text(ds: datasets.Dataset, columns: Iterable[str] = ("source", "target"),
              batch_size: int = 10_000) -> Iterator[str]:
    """Yield every string of `columns`, batch by batch, without loading the whole split."""
    for batch in ds.select_columns(list(columns)).iter(batch_size=batch_size):
        for column in columns:
            yield from batch[column]
