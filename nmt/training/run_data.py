"""A run's corpus, ready for the loop (`prepare_data` -> `PreparedCorpus`): read, the tokenizer
trained (or reused), train and validation encoded and filtered, and the batch settings for
this mesh."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import datasets
import jax

from data.batching import VALIDATION_LIMIT, Examples, load_examples
from data.config import DEFAULT_BUCKETS, BatchConfig, CorpusSpec, DataError
from data.corpus import load_corpus
from data.encoding import encode_shared, train_or_load_tokenizer
from data.packing import fit_width
from data.sampling import SampledEpochs
from data.tokenizer import TokenizerBase, load_tokenizer, tokenizer_present
from nmt.runtime.distributed import barrier
from nmt.settings.config import RunConfig


@dataclasses.dataclass
class PreparedCorpus:
    """The training corpus as the loop uses it: its tokenizer, the encoded and filtered train
    and validation pairs, their batch settings, the validation text for BLEU, and how many
    pairs each split held as read."""

    tokenizer: TokenizerBase  # saved in the run directory
    train_examples: Examples
    valid_examples: Examples
    batch_config: BatchConfig  # training batches: accum x rows
    eval_batch_config: BatchConfig
    valid_sources: list[str]  # of the validation pairs kept (valid_examples), in order
    valid_targets: list[str]
    counts: dict[str, int]  # pairs per split, as read (train: at most --max-train-pairs)
    train_sampling: SampledEpochs | None = None  # with --subword-alpha: each epoch resegmented

    def close(self) -> None:
        """Stop sampling segmentations (the next epoch's may be under way on a thread)."""
        if self.train_sampling is not None:
            self.train_sampling.close()


def train_batch_config(run: RunConfig, model_max_len: int, devices: int) -> BatchConfig:
    """The training batches of one update: with --accum K, K micro-batches of the same shape,
    so K times the rows and a multiple of K times the devices; no pair longer than the
    model's positions."""
    accum = run.optimizer.accum_steps
    batching = run.batching
    return dataclasses.replace(batching, batch_tokens=batching.batch_tokens * accum,
                               max_len=min(batching.max_len, model_max_len),
                               num_devices=devices * accum)


def eval_batch_config(run: RunConfig, model_max_len: int, devices: int) -> BatchConfig:
    """Batching of the validation loss: every pair the model can take, whatever its length
    or length ratio (the training filters do not apply). Packed like training (one shape),
    or bucketed."""
    # A side of at most model_max_len positions holds at most model_max_len - 1 tokens (the
    # ratio's counts): no pair the model takes has a larger ratio.
    any_ratio = float(model_max_len)
    if run.batching.packing:
        return dataclasses.replace(
            run.batching, batch_tokens=max(run.batching.batch_tokens, model_max_len * devices),
            max_len=model_max_len, max_ratio=any_ratio, pack_width=None,
            num_devices=devices)
    buckets = [b for b in run.batching.buckets or DEFAULT_BUCKETS if b < model_max_len]
    # Widths past the training buckets double up to the model's limit: long validation pairs
    # are few, and each width compiles the eval step once.
    while not buckets or buckets[-1] < model_max_len:
        buckets.append(min(2 * buckets[-1], model_max_len) if buckets else model_max_len)
    return dataclasses.replace(
        run.batching, batch_tokens=max(run.batching.batch_tokens, model_max_len * devices),
        max_len=model_max_len, max_ratio=any_ratio, buckets=tuple(buckets),
        num_devices=devices)


def read_shared(spec: CorpusSpec) -> datasets.DatasetDict:
    """The corpus, read by process 0 into the cache that the others then open (or, on a
    cache they do not share, read themselves): the text is read once, and the encoding,
    the work that takes time, is shared (`data.encoding.encode_shared`)."""
    if jax.process_index() == 0:
        corpus = load_corpus(spec)
    barrier("corpus read")
    if jax.process_index() != 0:
        corpus = load_corpus(spec)
    return corpus


def prepare_data(run: RunConfig, run_dir: Path, model_max_len: int) -> PreparedCorpus:
    """Read the corpus, train (or reuse) the tokenizer, encode and filter train and validation
    (validation's text for BLEU too).

    A test split is read (load_corpus reads what the spec names) but not encoded: training
    never uses it; the summary gives the translate.py command that scores it.
    """
    corpus = read_shared(run.data)
    limit = run.data.max_train_pairs
    if limit is not None and len(corpus["train"]) > limit:
        corpus["train"] = corpus["train"].select(range(limit))
    # One process trains the tokenizer (SentencePiece training is multi-threaded and not
    # bit-reproducible); the others load the file it wrote to the shared run directory.
    if jax.process_index() == 0:
        tokenizer = train_or_load_tokenizer(run_dir, corpus, run.tokenizer,
                                            given=run.trainer.init_from)
    barrier("tokenizer")
    if jax.process_index() != 0:
        if not tokenizer_present(run_dir):
            raise DataError(f"{run_dir.resolve()} holds no tokenizer after process 0 wrote one "
                            "there: every process needs the same run directory, on a file "
                            "system they share (--output-dir)")
        tokenizer = load_tokenizer(run_dir)
    encoded = {name: encode_shared(corpus[name], tokenizer, jax.process_index(),
                                   jax.process_count(), barrier)
               for name in ("train", "validation")}
    devices = jax.device_count()
    batch_config = train_batch_config(run, model_max_len, devices)
    valid_batch_config = eval_batch_config(run, model_max_len, devices)
    train_examples = load_examples(encoded["train"], batch_config, "train", tokenizer.ids)
    valid_examples = load_examples(encoded["validation"], valid_batch_config, "validation",
                                   tokenizer.ids, VALIDATION_LIMIT)
    # Validation translates the pairs it scores: none that the length filter dropped.
    valid = corpus["validation"].select(valid_examples.index)
    batch_config = fit_width(batch_config, train_examples.src_len, train_examples.tgt_len)
    sampling = None
    if run.tokenizer.subword_alpha is not None:
        sampling = SampledEpochs(train_examples, corpus["train"], tokenizer,
                                 alpha=run.tokenizer.subword_alpha,
                                 nbest=run.tokenizer.subword_nbest, seed=run.tokenizer.seed,
                                 config=batch_config)
    return PreparedCorpus(tokenizer=tokenizer,
                          train_examples=train_examples, valid_examples=valid_examples,
                          train_sampling=sampling, batch_config=batch_config,
                          eval_batch_config=fit_width(valid_batch_config,
                                                      valid_examples.src_len,
                                                      valid_examples.tgt_len),
                          valid_sources=list(valid["source"]),
                          valid_targets=list(valid["target"]),
                          counts={name: len(split) for name, split in corpus.items()})
