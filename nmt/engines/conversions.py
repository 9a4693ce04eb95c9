"""CTranslate2 conversions of model directories, made on first use and kept in the cache.

    <cache>/ctranslate2/<key>/      model.bin, config.json, the tokenizer's files,
                                    nmt_config.json (the model's settings), manifest.json

The key is a hash of the model's checksum (its parameters, settings and tokenizer files) and
the conversion settings (the stored quantization, this converter's version): a model trained
further or exported again gets a new entry, and the same model asked for in another
quantization another one. An entry is used only once its manifest (written last, whole) lists
every file at its size and sha256; a damaged or half-written one is converted again, with
one warning. Conversions of one entry hold a lock, so two processes starting at once convert
once: the second waits, then uses what the first wrote. A whole entry is used without the
lock, so a cache that cannot be written (a read-only file system) still serves the entries it
holds; only a conversion it lacks goes into a temporary directory, removed at exit.

Hashing the parameters at every start would cost the time a cached conversion saves, so
each model directory's checksum is kept beside the entries with the size and modification
time of the files it hashed, and computed again only when one of them changed; likewise an
entry's manifest is stamped with its files' sizes, modification and change times, and its
files are hashed again only when those differ (then stamped anew).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from data.config import default_cache_dir
from nmt.models.model_files import CONFIG_FILE, PARAMS_FILE, ModelDirError
from transformer.atomic_files import remove_tree, write_atomically

log = logging.getLogger("nmt.engines")

# Part of every key: raise it when the conversion writes something else for the same model.
CONVERTER_VERSION = 2
MANIFEST = "manifest.json"


def cache_root() -> Path:
    """Where conversions are kept: the project's cache directory (`data.config`)."""
    return default_cache_dir() / "ctranslate2"


# ----------------------------------------------------------------------------- checksums


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _model_files(model_dir: Path, tokenizer_files: list[str]) -> list[Path]:
    return [model_dir / name for name in (PARAMS_FILE, CONFIG_FILE, *tokenizer_files)]


def model_checksum(model_dir: Path, tokenizer_files: list[str], root: Path | None = None
                   ) -> str:
    """sha256 over the model directory's files (parameters, settings, tokenizer), reused
    from `root`/checksums/ while their sizes and modification times are unchanged."""
    files = _model_files(model_dir, tokenizer_files)
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    record = ((root or cache_root()) / "checksums"
              / (hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest() + ".json"))
    with contextlib.suppress(OSError, ValueError):  # a record of any other shape is absent
        kept = json.loads(record.read_text(encoding="utf-8"))
        if (isinstance(kept, dict) and kept.get("files") == stamp
                and isinstance(kept.get("checksum"), str)):
            return kept["checksum"]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + _sha256(f).encode() + b"\0")
    checksum = digest.hexdigest()
    with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
        record.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(record, json.dumps({"files": stamp, "checksum": checksum}))
    return checksum


def entry_key(checksum: str, quantization: str) -> str:
    text = json.dumps({"model": checksum, "quantization": quantization,
                       "converter": CONVERTER_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ----------------------------------------------------------------------------- entries


def _stamp(entry: Path, names) -> list[list]:
    """Each file's name, size, modification and change times and inode: writing a file in
    place changes its change time, which no tool can set back (as `touch -r` sets mtime)."""
    stats = {name: (entry / name).stat() for name in sorted(names)}
    return [[name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            for name, st in stats.items()]


def entry_is_whole(entry: Path) -> bool:
    """Whether `entry` holds its manifest and every file the manifest lists, unchanged: at its
    size, and at its sha256 where a file's stamp (`_stamp`) is not the one the manifest
    records (hashing at every start would cost what the cache saves). An entry found whole by
    its hashes is stamped anew (a copied cache, or one written before stamps), where the
    cache can be written."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
        listed = manifest["files"]
        present = {p.name for p in entry.iterdir()} - {MANIFEST}
        if set(listed) != present:
            return False
        stamp = _stamp(entry, listed)
        if any(size != listed[name][0] for name, size, *_ in stamp):
            return False
        if manifest.get("stamp") == stamp:
            return True
        if not all(_sha256(entry / name) == sha for name, (_, sha) in listed.items()):
            return False
        with contextlib.suppress(OSError):  # a read-only cache hashes again next time
            write_atomically(entry / MANIFEST, json.dumps({**manifest, "stamp": stamp},
                                                          indent=1))
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def write_manifest(entry: Path) -> None:
    """The entry's manifest, written last and whole: what makes the entry usable. It lists
    each file's size and sha256, stamped with their sizes and modification times."""
    files = {p.name: [p.stat().st_size, _sha256(p)] for p in sorted(entry.iterdir())
             if p.name != MANIFEST}
    write_atomically(entry / MANIFEST, json.dumps({"files": files, "stamp": _stamp(entry, files)},
                                                  indent=1))


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock on `lock_path` (created), waiting for another process holding it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def converted(model_dir: Path, tokenizer_files: list[str], quantization: str,
              root: Path | None = None) -> Path:
    """The CTranslate2 conversion of `model_dir` at `quantization`: the cached entry, made
    now if there is none or it is damaged (one warning). In a cache that cannot be written,
    a temporary one (one warning)."""
    root = root or cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        checksum = model_checksum(model_dir, tokenizer_files, root)
        entry = root / entry_key(checksum, quantization)
        if entry_is_whole(entry):  # no lock to take: a read-only cache serves what it holds
            return entry
        with _locked(root / f".{entry.name}.lock"):
            if entry_is_whole(entry):  # converted while this process waited for the lock
                return entry
            if os.path.lexists(entry):  # a link that leads nowhere too
                log.warning("the cached CTranslate2 conversion %s is damaged or incomplete; "
                            "converting %s again", entry, model_dir)
                remove_tree(entry)  # a file or link in its place too
            _convert(model_dir, entry, quantization)
            return entry
    except OSError as err:  # read-only, not a directory, full
        log.warning("cannot write the CTranslate2 cache %s (%s); converting %s into a temporary "
                    "directory for this run (set FLAX_NMT_CACHE to a writable directory to "
                    "keep it)", root, err.strerror or err, model_dir)
        temporary = Path(tempfile.mkdtemp(prefix="nmt-ct2-"))
        atexit.register(shutil.rmtree, temporary, ignore_errors=True)
        _convert(model_dir, temporary / "model", quantization, reused=False)
        return temporary / "model"


def _convert(model_dir: Path, out: Path, quantization: str, reused: bool = True) -> None:
    """Convert `model_dir` into `out` (published whole), then seal it with its manifest;
    `reused`: `out` is in the cache, where later runs find it."""
    from nmt.convert.common import ConversionError  # JAX loads here, once per conversion
    from nmt.convert.ctranslate2 import export_ctranslate2

    log.info("converting %s for CTranslate2 (%s) into %s%s", model_dir, quantization, out,
             "; later runs reuse it" if reused else ", for this run only")
    start = time.perf_counter()
    try:
        export_ctranslate2(model_dir, out, quantization)
    except ConversionError as err:
        raise ModelDirError(f"{model_dir} cannot run on CTranslate2: {err} Translate it with "
                            "--engine jax.") from None
    write_manifest(out)
    log.info("converted in %.1f s", time.perf_counter() - start)
