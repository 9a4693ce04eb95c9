"""Data pipeline: sentence pairs -> SentencePiece ids -> packed or bucketed, resumable batches.

    spec = config.CorpusSpec(train_prefix="data/train", valid_prefix="data/valid",
                             src="en", tgt="de")
    pairs = corpus.load_corpus(spec)               # splits of (source, target), memory-mapped
    tok = encoding.train_or_load_tokenizer(run_dir, pairs, config.TokenizerConfig())
    encoded = encoding.encode_corpus(pairs, tok)  # token stores, cached on disk
    settings = config.BatchConfig(batch_tokens=4096, num_devices=jax.device_count())
    examples = batching.load_examples(encoded["train"], settings, ids=tok.ids)
    settings = packing.fit_width(settings, examples.src_len, examples.tgt_len)
    batches = batching.BatchIterator(examples, settings, state=saved_state)

Modules: `config` (the settings: CorpusSpec, TokenizerConfig, BatchConfig; `DataError`),
`lines` (the one UTF-8 line reader), `corpus` (reading pairs from every source), `arrow_text`
(pairs streamed into Arrow files in the cache), `disk` (free space, checked first),
`tokenizer` (SentencePiece models: text <-> ids), `encoding` (a run's tokenizer and the cached
encoding of its splits, shared between processes), `store` (encoded pairs on disk,
memory-mapped), `batching` (length filters, each epoch's plan, resumable iteration, bucketed
batches), `packing` (pairs laid end to end in rows of one width, the default layout), and
`download` (`python -m data.download`: the corpora the recipes read). Counts are reported
through the logger named "data"; bad input raises `DataError`. Submodules are not imported
here, so importing one does not pull in the others' dependencies.
"""
