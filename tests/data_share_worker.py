"""One of two processes that read and encode a corpus together, as train.py's processes do.

    python tests/data_share_worker.py --port 12345 --process-id 0 --prefix DIR/c \
        --valid-prefix DIR/v --tokenizer DIR/tok --out DIR/out0.json
    # and the same with --process-id 1

Starts JAX's distributed runtime on this machine's CPU, reads the corpus with
`read_shared` and encodes it with `encode_shared` (FLAX_NMT_CACHE is the shared cache),
logging the data logger to stderr, and writes the ids of the store it opened to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--valid-prefix", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"process {args.process_id}: %(message)s")

    import jax

    from data.config import CorpusSpec
    from data.encoding import encode_shared
    from data.tokenizer import load_tokenizer
    from nmt.runtime.distributed import barrier, initialize_distributed
    from nmt.training.run_data import read_shared

    initialize_distributed(f"localhost:{args.port}", 2, args.process_id)
    corpus = read_shared(CorpusSpec(train_prefix=args.prefix, valid_prefix=args.valid_prefix,
                                    src="en", tgt="de"))
    tokenizer = load_tokenizer(args.tokenizer)
    store = encode_shared(corpus["train"], tokenizer, jax.process_index(), jax.process_count(),
                          barrier, num_proc=1)
    Path(args.out).write_text(json.dumps({"src": store.src.to_lists(),
                                          "tgt": store.tgt.to_lists()}))


if __name__ == "__main__":
    main()
