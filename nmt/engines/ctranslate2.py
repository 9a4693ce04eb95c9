"""CTranslate2 as the engine that searches: the model's CTranslate2 conversion, called as
`nmt.models.translator.Translator` is, without JAX.

`open_translator` takes a model directory (converted on first use into the cache,
`nmt.engines.conversions`) or a CTranslate2 export made with `python -m nmt.convert
to-ctranslate2`, and returns a `CTranslate2Translator`: the same calls (`translate_all`,
`translate_nbest`, `translate`, `score`, `warm_up`) and the same records (`Translations`) as
the JAX translator, so translate.py and the server use either.

The search settings mean what they mean for the JAX engine (`search_options`):
- greedy search and sampling are CTranslate2's (beam size 1; top-k, temperature);
- beam search is CTranslate2's, which is our `k-finished` rule (a sentence stops once k
  hypotheses have finished) dividing by length ** alpha (`--length-penalty power`). Settings
  it cannot express are refused with one line when given as flags; where they are only the
  model's stored defaults (GNMT's penalty and the heuristic rule, as trained models store),
  CTranslate2's rule and penalty are used and one line says so;
- output limits are per sentence (a * source length + b, EOS included): sentences are sent in
  groups of one limit each, so that every sentence stops where the JAX search would;
- PAD and BOS are never produced and EOS not before min_len, as in `transformer.search`.
  Ours bans PAD and BOS after the softmax, keeping the other tokens' probabilities; CTranslate2
  bans only before it (`suppress_sequences`), renormalizing over the rest, which would shift
  every score, since a trained model gives PAD and BOS some probability (label smoothing). So
  CTranslate2 searches without the ban, and a sentence with PAD or BOS in a hypothesis is
  searched again with them banned before the softmax (its scores renormalized; one warning
  names the first such line).

Where the engines differ: CTranslate2 scores a token against the tokens a step may produce
while EOS or PAD and BOS are banned (min_len; a sentence searched again), and a beam hypothesis
cut at its output limit without the EOS forced there, which ours adds; a PAD or BOS that takes
a place in a beam and later drops out can also change which hypotheses remain, though a trained
model ranks them far below its beams. So greedy outputs are equal, and so are beam outputs that
end before their limit; where a beam reaches it, CTranslate2 may rank a cut hypothesis above
one that ended, and the best translations can differ.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from data.config import INFERENCE_BATCH_TOKENS
from data.tokenizer import TokenizerBase, load_tokenizer, tokenizer_present
from nmt.engines import COMPUTE_TYPES, CTRANSLATE2_INSTALL, searches_beyond_threads
from nmt.engines.conversions import converted
from nmt.models.alignment import Alignment
from nmt.models.model_files import (
    EXPORT_SETTINGS_FILE,
    EXPORT_WEIGHTS_FIELD,
    TOKENIZER_SHA256,
    ModelDirError,
    check_tokenizer,
    read_model_config,
    read_model_files,
    read_search_config,
)
from nmt.models.translations import (
    CallSources,
    Hypothesis,
    Translations,
    refuse_long_sources,
)
from transformer.config import ModelConfig, SearchConfig
from transformer.strategies import Beam, Greedy, plan_search

log = logging.getLogger("nmt.engines")

ENGINE = "ctranslate2"
# The conversion's stored type for each compute type: the same where CTranslate2 can store it
# (nothing to convert at load), else float32 (CTranslate2 converts at load); "auto" stores
# int8 where the device runs it, which is what CTranslate2's auto then picks on a CPU.
STORED_TYPES = {"int8": "int8", "int8_float32": "int8_float32", "int16": "int16",
                "float32": "float32"}


def stored_type(ctranslate2, compute_type: str, device: str) -> str:
    if compute_type == "auto" and "int8" in ctranslate2.get_supported_compute_types(device):
        return "int8"
    return STORED_TYPES.get(compute_type, "float32")


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def default_searches() -> int:
    """Batches translated at once unless told otherwise: 2 where there are 2 cores or more.
    Two translators of one thread each beat one of two threads on a 2-core CPU: 1.4x in
    float32 and 2.9x in int8, whose products keep a second thread of one batch idle
    (docs/performance.md)."""
    return min(2, cpu_cores())


class EngineError(ValueError):
    """A setting this engine cannot take: one line naming it and what to do (a usage error)."""


class MissingEngine(RuntimeError):
    """The ctranslate2 package is not installed: one line with the install command."""


NO_LENGTH_PENALTY = 1e-30  # CTranslate2's length_penalty for our alpha 0


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise MissingEngine(f"--engine {ENGINE} needs the ctranslate2 package, which is not "
                            f"installed: {CTRANSLATE2_INSTALL}") from None
    return ctranslate2


# ----------------------------------------------------------------------------- settings


def engine_search(search: SearchConfig, given: frozenset[str] = frozenset()
                  ) -> SearchConfig:
    """`search` as CTranslate2 runs it. `given`: the SearchConfig fields the user set (flags),
    refused (EngineError) where CTranslate2 cannot follow them; the model's stored beam rule
    and length penalty are replaced by CTranslate2's, with one info line each."""
    if not isinstance(plan_search(search), Beam):  # greedy and sampling: no beam settings
        return search
    if search.min_len > 0:
        # CTranslate2 renormalizes over the tokens allowed while EOS is banned, which shifts
        # each beam's score by its own EOS probability and so can reorder the beams.
        origin = "--min-len" if "min_len" in given else "the model's stored min_len"
        raise EngineError(f"{origin} {search.min_len}: CTranslate2's beam search scores "
                          "hypotheses otherwise while EOS is banned; give --min-len 0, "
                          "--greedy, or --engine jax")
    changes = {}
    for field, theirs in (("beam_rules", "k-finished"), ("length_penalty", "power")):
        ours = getattr(search, field)
        if ours == theirs:
            continue
        flag = "--" + field.replace("_", "-")
        if field in given:
            raise EngineError(f"{flag} {ours}: CTranslate2's beam search has only "
                              f"{flag} {theirs}; give {flag} {theirs}, or --engine jax")
        log.info("ctranslate2: beam search with %s %s (CTranslate2's) where the model stores "
                 "%s", flag, theirs, ours)
        changes[field] = theirs
    return dataclasses.replace(search, **changes)


def search_options(search: SearchConfig) -> dict[str, Any]:
    """CTranslate2's `translate_batch` options for `search` (an `engine_search`)."""
    strategy = plan_search(search)
    common = {"min_decoding_length": max(search.min_len - 1, 0)}  # ours counts EOS
    if isinstance(strategy, Greedy):
        return {**common, "beam_size": 1, "sampling_topk": 1, "length_penalty": 0.0}
    if not isinstance(strategy, Beam):  # sampling: the score is the log-probability
        return {**common, "beam_size": 1, "sampling_topk": search.top_k,
                "sampling_temperature": search.temperature, "length_penalty": 0.0}
    if (search.beam_rules, search.length_penalty) != ("k-finished", "power"):
        raise ValueError(f"not CTranslate2's beam search: {search}")
    # patience 1: a sentence stops once `size` hypotheses have finished (k-finished). A
    # length penalty of exactly 0 would switch CTranslate2 to stopping when the best beam
    # ends; len ** 1e-30 is 1 in float32, so scores are the log-probabilities all the same.
    return {**common, "beam_size": strategy.size, "num_hypotheses": strategy.nbest,
            "patience": 1.0, "length_penalty": max(strategy.alpha, NO_LENGTH_PENALTY)}


def check_compute_type(ctranslate2, compute_type: str, device: str) -> None:
    """EngineError naming the types `device` supports when it lacks `compute_type`."""
    supported = sorted(ctranslate2.get_supported_compute_types(device))
    if compute_type not in COMPUTE_TYPES:
        raise EngineError(f"--compute-type {compute_type}: not a CTranslate2 compute type; "
                          f"choose one of {', '.join(COMPUTE_TYPES)}")
    if compute_type != "auto" and compute_type not in supported:
        raise EngineError(f"--compute-type {compute_type}: this {device.upper()} cannot run it "
                          f"with CTranslate2; it runs {', '.join(supported)} (or auto)")


# ----------------------------------------------------------------------------- models


def is_export(path: Path) -> bool:
    """Whether `path` is a CTranslate2 model directory rather than one of ours."""
    return (path / "model.bin").is_file()


def read_export(path: Path) -> tuple[TokenizerBase, dict[str, Any]]:
    """(tokenizer, config dict) of a CTranslate2 export made by `python -m nmt.convert
    to-ctranslate2`, which keeps the model's settings beside the weights."""
    if not (path / EXPORT_SETTINGS_FILE).is_file():
        raise ModelDirError(
            f"{path} is a CTranslate2 model without {EXPORT_SETTINGS_FILE} (the settings this "
            f"project keeps with its exports); export it again with `python -m nmt.convert "
            f"to-ctranslate2 MODEL {path}`, or pass the model directory itself")
    if not tokenizer_present(path):
        raise ModelDirError(f"{path} has no SentencePiece model (spm.model) to tokenize with; "
                            "export the model again")
    config, values = read_model_config(path, EXPORT_SETTINGS_FILE)
    tokenizer = load_tokenizer(path)
    check_tokenizer(path, config, tokenizer, values.get(TOKENIZER_SHA256))
    return tokenizer, {**values, "model": config,
                       "search": read_search_config(path, values, EXPORT_SETTINGS_FILE)}


def read_export_settings(export: Path) -> dict[str, Any]:
    """EXPORT_SETTINGS_FILE of an export, {} where it cannot be read (`read_export` names
    what is wrong with it)."""
    try:
        values = json.loads((export / EXPORT_SETTINGS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def read_model(path: str | Path) -> tuple[Path | None, TokenizerBase, dict[str, Any]]:
    """(our model directory, or None for a CTranslate2 export; tokenizer; config dict) of
    `path`: a model directory, a run directory or an export, every file but the weights
    checked (ModelDirError)."""
    path = Path(path)
    if path.is_dir() and is_export(path):
        return None, *read_export(path)
    return read_model_files(path)


# ----------------------------------------------------------------------------- translating


class CTranslate2Translator:
    """Translates lists of sentences with a CTranslate2 model, as `Translator` does.

    `searches` batches are translated at once (CTranslate2's inter_threads; 0:
    `default_searches`, at most `threads`), each on `threads // searches` threads
    (intra_threads; `threads` 0: every core); more searches than threads is refused, and
    sampling translates one batch at a time. `batch_tokens` bounds the source tokens of a
    batch, divided by the beam size as for the JAX engine.
    Sampling draws from CTranslate2's random generator, seeded with `seed` (its stream is not
    JAX's: samples differ between engines), one batch at a time so that a seed reproduces
    a run. The generator is one per process and each translator made seeds it again: with
    several in a process (a server of several pairs), a seed reproduces the samples of the
    last one made. Several threads may call one translator at once.
    """

    engine = ENGINE

    def __init__(self, export: Path, tokenizer: TokenizerBase, model_config: ModelConfig,
                 search: SearchConfig, *, compute_type: str = "auto", device: str = "cpu",
                 threads: int = 0, searches: int = 0,
                 batch_tokens: int = INFERENCE_BATCH_TOKENS, seed: int = 0):
        ctranslate2 = import_ctranslate2()
        self.options = search_options(search)  # `search` as `engine_search` made it
        self.strategy = plan_search(search)
        self.strategy.check_vocabulary(model_config.vocab_size)
        self.search = search
        self.model_config = model_config
        self.max_source_len = model_config.max_len
        self.tokenizer = tokenizer
        self.searches = searches = self._searches(searches, threads)
        cores = threads or cpu_cores()
        ctranslate2.set_random_seed(seed)
        try:
            self.model = ctranslate2.Translator(
                str(export), device=device, compute_type=compute_type, inter_threads=searches,
                intra_threads=max(cores // searches, 1))
        except (RuntimeError, ValueError, OSError) as err:
            raise ModelDirError(f"{export}: CTranslate2 cannot load it ({err}); export it "
                                "again") from None
        self.compute_type = self.model.compute_type  # what "auto" chose
        # describe() names the compute type: say where the weights were stored otherwise (an
        # int8 export computing in float32 computes with its int8 weights dequantized).
        stored = read_export_settings(export).get(EXPORT_WEIGHTS_FIELD)
        if isinstance(stored, str) and stored.split("_")[0] != self.compute_type.split("_")[0]:
            log.info("ctranslate2: %s stores %s weights, converted at load to compute in %s",
                     export, stored, self.compute_type)
        vocabulary = tokenizer.vocabulary()
        self._ids = {piece: i for i, piece in enumerate(vocabulary)}
        self._eos = vocabulary[model_config.eos_id]
        self._banned = (vocabulary[model_config.pad_id], vocabulary[model_config.bos_id])
        self._warned_banned = False
        self._batch = max(batch_tokens // self.strategy.rows_per_sentence, 1)

    def _searches(self, given: int, threads: int) -> int:
        """Batches translated at once, each on a thread at least: never more than `threads`
        (the threads in all, where given; EngineError for a `given` number above them)."""
        if (refusal := searches_beyond_threads(given, threads)) is not None:
            raise EngineError(refusal)
        if self.strategy.draws:
            # Sampling draws from one random stream per process: batches translated at once
            # would take their numbers in whatever order their threads come, and a seed would
            # not reproduce a run.
            if given > 1:
                log.warning("--searches %d: CTranslate2 samples one batch at a time (its random "
                            "stream is one per process, so that --seed reproduces a run); "
                            "translating with --searches 1.", given)
            return 1
        return given or min(default_searches(), threads or cpu_cores())

    def describe(self) -> str:
        """The engine and its compute type, as the commands and /health name them."""
        return f"{self.engine} {self.compute_type}"

    def translate(self, sentences: Sequence[str]) -> list[str]:
        """The best translation of each sentence, in input order."""
        return [nbest[0].text for nbest in self.translate_nbest(sentences)]

    def translate_nbest(self, sentences: Sequence[str], **options) -> list[list[Hypothesis]]:
        """`search.nbest` hypotheses per sentence, best first (`translate_all`'s options)."""
        return self.translate_all(sentences, **options).nbest

    def translate_all(self, sentences: Sequence[str],
                      progress: Callable[[int], None] | None = None, first_line: int = 1,
                      source: str = "input", ids: Sequence[Sequence[int]] | None = None,
                      line_numbers: Sequence[int] | None = None,
                      each_line: bool = True) -> Translations:
        """The n-best lists of `sentences` and the call's records, as `Translator.translate_all`
        gives them (its arguments mean the same); no batch records."""
        call = CallSources.of(sentences, self.tokenizer, self.max_source_len - 1,
                              self.strategy.nbest, ids, line_numbers, first_line, source,
                              progress, each_line)
        ids, results, todo, line_numbers = call.ids, call.results, call.todo, call.line_numbers
        limits = [self.search.max_output_len(len(row) + 1, self.model_config.max_len)
                  for row in ids]
        reached_limit, searched_again = [], []
        for i, (nbest, at_limit, banned) in self._search(todo, ids, limits, progress):
            results[i] = nbest
            if at_limit:
                reached_limit.append(line_numbers[i])
            if banned:
                searched_again.append(line_numbers[i])
        if searched_again and not self._warned_banned:
            self._warned_banned = True
            log.warning("%s line %d: CTranslate2's search produced PAD or BOS, which the JAX "
                        "engine bans after the softmax; searched again with them banned before "
                        "it, so its scores are renormalized over the other tokens (said once)",
                        source, min(searched_again))
        return Translations(results, call.truncated_lines,  # type: ignore
                            sorted(reached_limit), [])

    def _search(self, todo: list[int], ids: list[list[int]], limits: list[int],
                progress: Callable[[int], None] | None):
        """Yields (index, (n-best hypotheses, whether the best reached its limit, whether it
        was searched again with PAD and BOS banned)) of every sentence of `todo`, searched in
        groups that share an output limit, so that each stops where the JAX search would.
        Every group is submitted at once, so CTranslate2's threads stay busy; they come back
        in order of their limits, which follow the source lengths. (One call under the longest
        limit, searching again the few sentences that came near their own, was 5 to 10%
        slower on test2016: returning every finished hypothesis to check them costs more than
        smaller batches do.)"""
        groups: dict[int, list[int]] = collections.defaultdict(list)
        for i in todo:
            groups[limits[i]].append(i)
        submitted = [(limit, rows, self._submit([ids[i] for i in rows], limit))
                     for limit, rows in sorted(groups.items()) if limit > 1]
        if 1 in groups:
            yield from ((i, (*found, False)) for i, found in self._eos_at_once(groups[1], ids))
            if progress is not None:
                progress(len(groups[1]))
        again: dict[int, list[int]] = collections.defaultdict(list)
        for limit, rows, results in submitted:
            done = 0
            for i, result in zip(rows, results):
                result = result.result()
                if any(piece in self._banned for pieces in result.hypotheses for piece in pieces):
                    again[limit].append(i)
                    continue
                done += 1
                hypotheses, ended = self._hypotheses(result)
                yield i, (hypotheses, not ended[0], False)
            if progress is not None and done:
                progress(done)
        for limit, rows in sorted(again.items()):
            results = self._submit([ids[i] for i in rows], limit,
                                   suppress_sequences=[[piece] for piece in self._banned])
            for i, result in zip(rows, results):
                hypotheses, ended = self._hypotheses(result.result())
                yield i, (hypotheses, not ended[0], True)
            if progress is not None:
                progress(len(rows))

    def _submit(self, rows: list[list[int]], limit: int, **ban) -> list:
        """CTranslate2's asynchronous results of `rows` (source ids) under output `limit`
        (tokens, EOS included; at least 2), min_len giving way to it as in the JAX search;
        `ban`: CTranslate2's suppress_sequences, where given."""
        options = {**self.options, "min_decoding_length": min(
            self.options["min_decoding_length"], limit - 1)}
        return self.model.translate_batch(
            [self.tokenizer.pieces(row, "source") for row in rows], asynchronous=True,
            max_batch_size=self._batch, batch_type="tokens", max_input_length=0,
            max_decoding_length=limit - 1,  # CTranslate2 does not count EOS
            return_end_token=True, return_scores=True, **ban, **options)

    def _eos_at_once(self, rows: list[int], ids: list[list[int]]):
        """Yields what `_search` does for sentences whose output limit is one token, which
        CTranslate2 cannot search (it decodes at least one token before EOS): EOS, forced,
        scored log p(EOS | source): the one hypothesis there is, as in the JAX search."""
        scored = self.model.score_batch(
            [self.tokenizer.pieces(ids[i], "source") for i in rows], [[] for _ in rows],
            max_batch_size=self._batch, batch_type="tokens", max_input_length=0)
        empty = self.tokenizer.decode([[]])[0]
        for i, result in zip(rows, scored):
            yield i, ([Hypothesis(empty, float(sum(result.log_probs)), ())], True)

    def _hypotheses(self, result) -> tuple[list[Hypothesis], list[bool]]:
        """(hypotheses, whether each ended with EOS rather than at its limit)."""
        out, ended = [], []
        for pieces, score in zip(result.hypotheses, result.scores):
            ended.append(bool(pieces) and pieces[-1] == self._eos)
            ids = [self._ids[p] for p in (pieces[:-1] if ended[-1] else pieces)]
            out.append(Hypothesis(self.tokenizer.decode([ids])[0], float(score), tuple(ids)))
        return out, ended

    def align(self, sources: Sequence[str], targets: Sequence[str]) -> list[Alignment]:
        """A word alignment of each source with its translation: the attention CTranslate2
        returns while forced through the translation (the last decoder layer's, averaged
        over its heads, as the JAX engine reads it)."""
        if not sources:
            return []
        src = self.tokenizer.token_spans(sources, "source")
        tgt = self.tokenizer.token_spans(targets, "target")
        limit = self.max_source_len - 1
        src = [(ids[:limit], spans[:limit]) for ids, spans in src]
        tgt = [(ids[:limit], spans[:limit]) for ids, spans in tgt]
        results = self.model.translate_batch(
            [self.tokenizer.pieces(ids, "source") for ids, _ in src],
            target_prefix=[self.tokenizer.pieces(ids, "target") for ids, _ in tgt],
            beam_size=1, max_decoding_length=max(len(ids) for ids, _ in tgt) + 1,
            return_attention=True, max_batch_size=self._batch, batch_type="tokens",
            max_input_length=0)  # the sources are cut to the model's positions above
        out = []
        for (s_ids, s_spans), (t_ids, t_spans), result in zip(src, tgt, results):
            # [steps, source tokens]: row j is the step that predicts target token j.
            weights = np.zeros((len(t_ids), len(s_ids)), np.float32)
            for j, row in enumerate(result.attention[0][:len(t_ids)]):
                weights[j] = row[:len(s_ids)]
            out.append(Alignment(s_spans, t_spans, weights))
        return out

    def score(self, sources: Sequence[str], references: Sequence[str],
              progress: Callable[[int], None] | None = None, first_line: int = 1,
              where: tuple[str, str] = ("source", "reference")) -> list[tuple[float, int]]:
        """(log p(reference | source), reference tokens with EOS) of each pair: force
        decoding, as `Translator.score`."""
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references.")
        limit = self.max_source_len - 1
        src = refuse_long_sources(self.tokenizer.encode(list(sources), "source"), limit,
                                  first_line, where[0])
        tgt = refuse_long_sources(self.tokenizer.encode(list(references), "target"), limit,
                                  first_line, where[1])
        out = []
        chunk = 256  # progress between chunks
        for start in range(0, len(src), chunk):
            scored = self.model.score_batch(
                [self.tokenizer.pieces(row, "source") for row in src[start:start + chunk]],
                [self.tokenizer.pieces(row, "target") for row in tgt[start:start + chunk]],
                max_batch_size=self._batch, batch_type="tokens", max_input_length=0)
            out.extend((float(sum(r.log_probs)), len(r.log_probs)) for r in scored)
            if progress is not None:
                progress(len(scored))
        return out

    def warm_up(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Translate one sentence, so that the first request finds every thread started. It
        is no one's input: were it searched again without PAD and BOS, the once-only warning
        would name its line and be spent before any request could be reported."""
        warned, self._warned_banned = self._warned_banned, True
        try:
            self.translate(["."])
        finally:
            self._warned_banned = warned
        if progress is not None:
            progress(1, 1)


def open_translator(path: str | Path, search_for: Callable[[SearchConfig], SearchConfig],
                    given: frozenset[str] = frozenset(), compute_type: str = "auto",
                    device: str = "cpu", **settings) -> tuple[CTranslate2Translator,
                                                              dict[str, Any]]:
    """(translator, config dict) of the model at `path` (a model or run directory, converted
    now unless cached, or a CTranslate2 export), searching with `search_for(the stored search
    settings)` as CTranslate2 runs it (`engine_search`; `given`: the fields set by flags).
    Every refusal comes before the conversion. `settings` as `CTranslate2Translator` takes
    them."""
    ctranslate2 = import_ctranslate2()
    check_compute_type(ctranslate2, compute_type, device)
    model_dir, tokenizer, values = read_model(path)
    search = engine_search(search_for(values["search"]), given)
    export = Path(path) if model_dir is None else converted(
        model_dir, list(tokenizer.files()), stored_type(ctranslate2, compute_type, device))
    translator = CTranslate2Translator(export, tokenizer, values["model"], search,
                                       compute_type=compute_type, device=device, **settings)
    return translator, {**values, "search": search}
