"""From a corpus to token ids: the run's tokenizer (trained, reused or given) and each split
encoded, with a disk cache of encoded splits."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import datasets

from data.config import DataError, TokenizerConfig, default_cache_dir
from data.corpus import iter_text
from data.tokenizer import TokenizerBase, load_tokenizer, tokenizer_present, train_tokenizer

log = logging.getLogger("data")

# Bump when the encoded columns change, so old cache entries are not reused.
_ENCODING_VERSION = "1"
_ENCODED_FEATURES = datasets.Features({
    "src_ids": datasets.List(datasets.Value("int32")),
    "tgt_ids": datasets.List(datasets.Value("int32")),
    "src_len": datasets.Value("int32"),
    "tgt_len": datasets.Value("int32"),
})


def train_or_load_tokenizer(run_dir: str | Path, corpus: datasets.DatasetDict | datasets.Dataset,
                            config: TokenizerConfig = TokenizerConfig(),
                            given: str | Path | None = None) -> TokenizerBase:
    """Reuse the run directory's tokenizer if present (resume), else train one on the train
    split and save it there (`spm.model`).

    A reused joint model must have `config.vocab_size` pieces, or a `DataError` says so. With
    `given` (the model directory of --init-from) or else `config.spm_model` (--spm-model),
    that tokenizer is used instead: copied into `run_dir` on the first run, and required to be
    the same on a resumed one.
    """
    run_dir = Path(run_dir)
    if given is not None:
        return _use_given_tokenizer(run_dir, Path(given), "--init-from")
    if config.spm_model is not None:
        return _use_given_tokenizer(run_dir, Path(config.spm_model), "--spm-model")
    if tokenizer_present(run_dir):
        tokenizer = load_tokenizer(run_dir)
        if tokenizer.vocab_size != config.vocab_size:
            raise DataError(
                f"{run_dir}'s tokenizer has {tokenizer.vocab_size} pieces but --vocab-size is "
                f"{config.vocab_size}; use --vocab-size {tokenizer.vocab_size} to resume this "
                "run, or a new run directory"
            )
        log.info("reusing the tokenizer in %s (%d pieces)", run_dir, tokenizer.vocab_size)
        return tokenizer
    train = corpus["train"] if isinstance(corpus, datasets.DatasetDict) else corpus
    tokenizer = train_tokenizer(iter_text(train), config)
    path = tokenizer.save(run_dir)
    log.info(
        "trained %s tokenizer with %d pieces on %d of %d sentences (source and target); saved %s",
        config.model_type, tokenizer.vocab_size, min(config.max_sentences, 2 * len(train)),
        2 * len(train), path,
    )
    return tokenizer


def _use_given_tokenizer(run_dir: Path, given: Path, flag: str) -> TokenizerBase:
    """The tokenizer `given` by `flag` (a .model file or a model directory), saved into
    `run_dir` unless already there."""
    tokenizer = load_tokenizer(given)
    if tokenizer_present(run_dir):
        if load_tokenizer(run_dir).fingerprint != tokenizer.fingerprint:
            raise DataError(
                f"{run_dir / next(iter(tokenizer.files()))} is not the tokenizer of {flag} "
                f"{given}: the run in {run_dir} started with another one, and its parameters "
                f"only fit that one; resume without {flag}, or start a new --output-dir")
        log.info("reusing the tokenizer in %s (%d pieces, the same as %s)", run_dir,
                 tokenizer.vocab_size, given)
        return tokenizer
    tokenizer.save(run_dir)
    log.info("using the tokenizer of %s (%d pieces), copied to %s", given,
             tokenizer.vocab_size, run_dir)
    return tokenizer


# ---------------------------------------------------------------------------------------------
# Encoding a corpus, cached on disk


class _EncodeBatch:
    """Picklable batch function for `Dataset.map` (a tokenizer pickles as its files)."""

    def __init__(self, tokenizer: TokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, list]:
        src = self.tokenizer.encode(batch["source"], "source")
        tgt = self.tokenizer.encode(batch["target"], "target")
        return {
            "src_ids": src,
            "tgt_ids": tgt,
            "src_len": [len(ids) for ids in src],
            "tgt_len": [len(ids) for ids in tgt],
        }


def encode_split(split: datasets.Dataset, tokenizer: TokenizerBase,
                 cache_dir: str | Path | None = None,
                 num_proc: int | None = None) -> datasets.Dataset:
    """Encode one split to `src_ids`, `tgt_ids` (int32, no BOS/EOS), `src_len`, `tgt_len`.

    The result is saved under `cache_dir/encoded/KEY`, KEY a hash of the split's datasets
    fingerprint (content-based for in-memory data, file-based for loaded data) and of the
    tokenizer model bytes, and loaded from there (memory-mapped) on later runs.
    """
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.md5(
        f"{split._fingerprint}|{tokenizer.fingerprint}|{_ENCODING_VERSION}".encode()
    ).hexdigest()
    target = cache_root / "encoded" / key
    if (target / "dataset_info.json").is_file():
        log.info("encoded split loaded from cache %s", target)
        return datasets.load_from_disk(str(target))
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(split) >= 50_000 else 1
    encoded = split.map(
        _EncodeBatch(tokenizer),
        batched=True,
        batch_size=2000,
        num_proc=num_proc if num_proc > 1 else None,
        remove_columns=split.column_names,
        features=_ENCODED_FEATURES,
        new_fingerprint=key,
        desc="encoding",
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
    encoded.save_to_disk(str(tmp))
    try:
        tmp.rename(target)
    except OSError:  # another process finished the same entry first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("encoded %d pairs, cached in %s", len(split), target)
    return datasets.load_from_disk(str(target))


def encode_corpus(corpus: datasets.DatasetDict, tokenizer: TokenizerBase,
                  cache_dir: str | Path | None = None, num_proc: int | None = None
                  ) -> datasets.DatasetDict:
    """`encode_split` for every split of `corpus`."""
    return datasets.DatasetDict({
        name: encode_split(split, tokenizer, cache_dir, num_proc) for name, split in corpus.items()
    })
