"""Evaluation and scoring of a test set: the pairs named by translate.py's flags, BLEU and
chrF of the translations (`nmt.translation.scoring`), and log p(reference | source) of every
pair (force decoding)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import IO

from data.config import DataError
from nmt.models.model_files import contradicted_language, stored_languages
from nmt.runtime.cli import UsageError
from nmt.runtime.files import FileState, write_atomically
from nmt.translation import scoring
from nmt.translation.errors import InputError
from nmt.translation.streams import (
    OUTPUT_FLAGS,
    check_not_an_input,
    one_line,
    progress_bar,
    read_lines,
    shown,
    translate_lines,
    translate_paragraphs,
)
from transformer.strategies import Sample, strategy_kind

log = logging.getLogger("translate.py")


def languages(args: argparse.Namespace, values: dict) -> tuple[str | None, str | None]:
    """(source, target) language codes: --src/--tgt, else those stored with the model."""
    stored_src, stored_tgt = stored_languages(values)
    return args.src or stored_src, args.tgt or stored_tgt


def bleu_settings(args: argparse.Namespace, values: dict) -> dict[str, str | None]:
    """`nmt.translation.scoring.bleu_settings` for the target language; UsageError if the
    tokenizer is unknown or cannot run here (MeCab missing)."""
    try:
        return scoring.bleu_settings(languages(args, values)[1], args.bleu_tokenize)
    except scoring.MetricError as err:
        raise UsageError(str(err)) from None


def check_languages(args: argparse.Namespace, values: dict) -> None:
    """UsageError when --src or --tgt names another language than the model records: its
    test set would be translated in a direction the model never learned, and scored, and
    sentences would be split by another language's rules."""
    stored = stored_languages(values)
    if contradiction := contradicted_language(args.src, args.tgt, stored):
        flag, given, recorded = contradiction
        raise UsageError(f"{flag} {given}, but the model translates {'->'.join(stored)} "
                         f"(recorded with it); give {flag} {recorded}, or leave --src and "
                         "--tgt out to use the model's.")


def evaluation_data(args: argparse.Namespace, values: dict) -> tuple[list[str], list[str], str]:
    """(sources, references, description) of the test set named by the flags; InputError
    when it holds no pair."""
    sources, references, description = _named_test_set(args, values)
    if not sources:
        raise InputError(f"{description}: the test set holds no pairs; give one that has "
                         "some (are these the right files?).")
    return sources, references, description


def _named_test_set(args: argparse.Namespace, values: dict
                    ) -> tuple[list[str], list[str], str]:
    src, tgt = languages(args, values)
    if args.src_file:
        src_path, ref_path = args.src_file, args.ref_file
    elif args.test_prefix:
        if not (src and tgt):
            raise UsageError("--test-prefix needs --src and --tgt (the model does not "
                             "record its languages).")
        src_path, ref_path = f"{args.test_prefix}.{src}", f"{args.test_prefix}.{tgt}"
    elif args.test_file:
        return _test_file(args.test_file, src, tgt)
    else:
        return _dataset_split(args, src, tgt)
    if args.test_prefix:  # named only now; --src-file and --ref-file were checked earlier
        for flag in OUTPUT_FLAGS:
            if getattr(args, flag, None):
                check_not_an_input(f"--{flag.replace('_', '-')}", getattr(args, flag),
                                   [("--test-prefix's", src_path), ("--test-prefix's", ref_path)])
    if args.test_prefix:
        _check_test_prefix(args.test_prefix, src_path, ref_path, src, tgt)
    sources, references = read_lines(src_path, "--src-file"), read_lines(ref_path, "--ref-file")
    src_path, ref_path = shown(src_path), shown(ref_path)
    if len(sources) != len(references):
        raise InputError(f"{src_path} has {len(sources)} lines but {ref_path} has "
                         f"{len(references)}; line N of one must translate line N of the other.")
    return sources, references, f"{src_path} -> {ref_path}"


def _check_test_prefix(prefix: str, src_path: str, ref_path: str, src: str, tgt: str) -> None:
    """InputError for a file of --test-prefix that is missing, told as train.py tells its
    prefixes' (the file compressed, a language suffix given, or a directory)."""
    for path in (src_path, ref_path):
        if not Path(path).exists():
            from data.corpus import prefix_not_found  # loads `datasets`: only when missing

            raise InputError(str(prefix_not_found(Path(path), prefix, src, tgt,
                                                  "--test-prefix")))


def _test_file(path: str, src: str | None, tgt: str | None
               ) -> tuple[list[str], list[str], str]:
    """Every pair of a .tsv, .jsonl or .parquet test file, kept as written."""
    from data.corpus import SCORING, read_file_texts  # loads `datasets`: only these formats

    if Path(path).suffix.lower() != ".tsv" and not (src and tgt):
        raise UsageError(f"--test-file {path} needs --src and --tgt to pick its languages (the "
                         "model does not record them).")
    try:
        sources, references = read_file_texts(path, src, tgt, SCORING)
    except DataError as err:
        raise InputError(str(err)) from None
    languages = f" {src}->{tgt}" if src and tgt else ""
    return sources, references, f"{path}{languages}"


def _dataset_split(args, src, tgt) -> tuple[list[str], list[str], str]:
    """Every pair of --split, kept as it is: an empty source gives an empty hypothesis that
    is scored against its reference, as with --src-file/--ref-file."""
    from data.corpus import SCORING, read_hf_split  # loads `datasets`: only for datasets

    if not (src and tgt):
        raise UsageError("--dataset needs --src and --tgt (the model does not record its "
                         "languages).")
    try:
        sources, references, split = read_hf_split(args.dataset, args.dataset_config,
                                                   args.split or "test", src, tgt, SCORING)
    except DataError as err:
        raise InputError(str(err)) from None
    return sources, references, f"{args.dataset}[{split}] {src}->{tgt}"


def run_evaluation(translator, args: argparse.Namespace, values: dict, out: IO[str],
                   test_set: tuple[list[str], list[str], str] | None = None,
                   bleu: dict[str, str | None] | None = None,
                   outputs_at_start: dict[str, FileState | None] | None = None
                   ) -> tuple[dict, list[int]]:
    """Translate the test set (`test_set` if already read, else `evaluation_data`), print
    BLEU and chrF (`bleu`: `bleu_settings`, checked here unless given), then write
    --hyp-file and --report (refused if another process wrote them after
    `outputs_at_start`, `streams.check_output_paths`' states; unset: after translating).
    Returns the report, and the lines whose translation reached the output limit."""
    since = outputs_at_start or {}
    bleu = bleu or bleu_settings(args, values)  # before translating: MeCab may be missing
    sources, references, description = test_set or evaluation_data(args, values)
    log.info("evaluating on %s: %d sentences", description, len(sources))
    start = time.perf_counter()
    where = shown(args.src_file) if args.src_file else description
    with progress_bar(len(sources), args.quiet) as bar:
        if args.split_sentences:  # a line of several sentences: each translated on its own
            source, target = languages(args, values)
            texts, reached_limit = translate_paragraphs(
                translator, sources, where, 1, source or "en", bar.update, target=target)
        else:
            done = translate_lines(translator, sources, where, 1, progress=bar.update)
            texts = [nbest[0].text for nbest in done.nbest]
            reached_limit = done.reached_limit
    seconds = time.perf_counter() - start
    # Scored exactly as the sacrebleu command reads the files: trailing whitespace removed.
    hypotheses = [one_line(text).rstrip() for text in texts]
    scores = scoring.evaluate(hypotheses, [r.rstrip() for r in references], **bleu)
    # Scores first: a file that cannot be written must not cost the evaluation.
    out.write(f"{scores.bleu_details}\n"
              f"chrF2 = {scores.chrf:.2f}\n"
              f"BLEU signature: {scores.bleu_signature}\n"
              f"chrF signature: {scores.chrf_signature}\n")
    out.flush()
    if args.hyp_file:
        write_atomically(args.hyp_file, "".join(h + "\n" for h in hypotheses),
                         since.get("hyp_file", "now"))
    models = args.model[0] if len(args.model) == 1 else args.model  # a list: an ensemble
    report = {**scores.to_dict(), "test_set": description, "sentences": len(sources),
              "model": models, "engine": translator.describe(),
              "search": dataclasses.asdict(translator.search),
              "split_sentences": bool(args.split_sentences),
              "translate_seconds": round(seconds, 3), "hyp_file": args.hyp_file}
    if strategy_kind(translator.search.strategy) is Sample:  # what reproduces the samples
        report["seed"] = args.seed
    if args.report:
        write_atomically(args.report, json.dumps(report, indent=2, ensure_ascii=False) + "\n",
                         since.get("report", "now"))
    log.info("translated %d sentences in %.2f s", len(sources), seconds)
    return report, reached_limit


def run_scoring(translator, args: argparse.Namespace, values: dict, out: IO[str],
                test_set: tuple[list[str], list[str], str] | None = None) -> None:
    """Print log p(reference | source) of every test pair, one line each, in order."""
    sources, references, description = test_set or evaluation_data(args, values)
    log.info("scoring the references of %s: %d pairs", description, len(sources))
    where = (shown(args.src_file) if args.src_file else f"{description} source",
             shown(args.ref_file) if args.ref_file else f"{description} reference")
    with progress_bar(len(sources), args.quiet) as bar:
        try:
            scores = translator.score(sources, references, progress=bar.update, where=where)
        except ValueError as err:  # a side too long to score without truncating it
            raise InputError(str(err)) from None
    out.write("".join(f"{logprob / tokens if args.normalize else logprob:.4f}\n"
                      for logprob, tokens in scores))
    out.flush()
    tokens = sum(n for _, n in scores)
    if tokens:
        per_token = sum(logprob for logprob, _ in scores) / tokens
        log.info("%d reference tokens (EOS included): %.4f nats per token, perplexity %.2f",
                 tokens, per_token, math.exp(-per_token))


