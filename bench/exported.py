"""A trained model against its own exports: speed, BLEU and agreement on a real test set.

    python -m bench.exported --model runs/NAME/averaged --test-prefix data/multi30k/test2016 \\
        --src en --tgt de

Exports the model to CTranslate2 (float32 and int8) and, when transformers and torch are
installed, to MarianMT, into a temporary folder. Then, on the same sentences:
- beam search (--beam, the model's alpha) with ours and with CTranslate2 float32 and int8:
  sentences/s (after one warm-up pass, so compilation is not counted) and sacreBLEU/chrF;
- greedy search with each: how many outputs are identical to ours token for token.
CTranslate2 runs with --threads intra-op threads; its beam uses its own length penalty
(length ** alpha), so its beam output may differ from ours by that convention. One JSON line
per measurement on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from bench.common import emit, environment
from nmt.runtime import allocator


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model or run directory")
    parser.add_argument("--test-prefix", required=True, help="PREFIX.SRC and PREFIX.TGT")
    parser.add_argument("--src", required=True)
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 threads")
    parser.add_argument("--batch-sentences", type=int, default=64,
                        help="CTranslate2 batch size (max_batch_size)")
    parser.add_argument("--limit", type=int, default=0, help="first N test pairs (0 = all)")
    return parser.parse_args()


def timed(fn):
    fn()  # warm-up: compilation, caches
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    args = parse_args()
    import ctranslate2

    from nmt.convert.ctranslate2 import export_ctranslate2
    from nmt.models.model_dir import load_model
    from nmt.models.translator import Translator
    from nmt.translation.scoring import evaluate

    sources = Path(f"{args.test_prefix}.{args.src}").read_text(encoding="utf-8").splitlines()
    references = Path(f"{args.test_prefix}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    if args.limit:
        sources, references = sources[: args.limit], references[: args.limit]
    model, tokenizer, values = load_model(args.model)
    search = dataclasses.replace(values["search"], strategy="beam", beam_size=args.beam, nbest=1)
    common = {"model": str(args.model), "sentences": len(sources), "beam": args.beam,
              "alpha": search.alpha, **environment()}

    def report(name: str, hypotheses: list[str], seconds: float) -> None:
        scores = evaluate(hypotheses, references, target_language=args.tgt)
        emit({"system": name, "seconds": round(seconds, 2),
              "sentences_per_s": round(len(sources) / seconds, 1), "bleu": round(scores.bleu, 2),
              "chrf": round(scores.chrf, 2), "bleu_signature": scores.bleu_signature, **common})

    translator = Translator(model, tokenizer, search)
    ours, seconds = timed(lambda: translator.translate(sources))
    report("ours", ours, seconds)
    greedy = Translator(model, tokenizer, dataclasses.replace(search, strategy="greedy",
                                                               beam_size=1))
    our_greedy = [h[0].tokens for h in greedy.translate_nbest(sources)]
    pieces = [tokenizer.pieces(ids) for ids in tokenizer.encode(sources)]
    suppress = [[tokenizer.processor.id_to_piece(values["model"].pad_id)],
                [tokenizer.processor.id_to_piece(values["model"].bos_id)]]

    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("float32", "int8"):
            out = export_ctranslate2(args.model, Path(tmp) / quantization, quantization)
            ct2 = ctranslate2.Translator(str(out), device="cpu", inter_threads=1,
                                         intra_threads=args.threads)

            def run(beam: int):
                results = ct2.translate_batch(
                    pieces, beam_size=beam, length_penalty=search.alpha,
                    max_batch_size=args.batch_sentences, suppress_sequences=suppress,
                    max_decoding_length=256)
                return [r.hypotheses[0] for r in results]

            hypotheses, seconds = timed(lambda: run(args.beam))
            report(f"ctranslate2 {quantization}",
                   [tokenizer.processor.decode_pieces(h) for h in hypotheses], seconds)
            same = sum(h == tokenizer.pieces(ids) for h, ids in zip(run(1), our_greedy))
            emit({"system": f"ctranslate2 {quantization}", "greedy_identical": same,
                  "of": len(sources), **common})
        marian_greedy_agreement(args, sources, our_greedy, common, Path(tmp))


def marian_greedy_agreement(args, sources, our_greedy, common, tmp: Path) -> None:
    """Greedy outputs of transformers' generate on the MarianMT export against ours."""
    try:
        import torch
        import transformers
    except ImportError as err:
        emit({"system": "transformers", "skipped": f"{err.name} is not installed", **common})
        return
    from nmt.convert.marian import export_marian

    out = export_marian(args.model, tmp / "marian")
    model = transformers.MarianMTModel.from_pretrained(out).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    torch.set_num_threads(args.threads)
    same = 0
    for start in range(0, len(sources), 32):
        batch = tokenizer(sources[start:start + 32], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=256)
        for row, ours in zip(generated.tolist(), our_greedy[start:start + 32]):
            ids = row[1:]
            eos = model.config.eos_token_id
            ids = ids[: ids.index(eos)] if eos in ids else ids
            same += ids == list(ours)
    emit({"system": "transformers", "greedy_identical": same, "of": len(sources), **common})


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
