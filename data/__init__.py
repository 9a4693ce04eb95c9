"""Data pipeline: sentence pairs -> SentencePiece ids -> bucketed, resumable batches.

    corpus = corpus.load_corpus(corpus.CorpusSpec(train_prefix="data/train", src="en", tgt="de"))
    tok = tokenizer.train_or_load_tokenizer(run_dir, corpus, tokenizer.TokenizerConfig())
    encoded = tokenizer.encode_corpus(corpus, tok)            # cached on disk
    config = batching.BatchConfig(batch_tokens=4096, num_devices=jax.device_count())
    examples = batching.load_examples(encoded["train"], config)
    batches = batching.BatchIterator(examples, config, state=saved_state)

Modules: `corpus` (reading pairs from every source), `tokenizer` (SentencePiece and encoding),
`batching` (filters, bucket shapes, iteration). Counts are reported through the logger named
"data"; bad input raises `corpus.DataError`. Submodules are not imported here, so importing
one does not pull in the others' dependencies.
"""
