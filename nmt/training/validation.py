"""Validation during training: loss and perplexity of the validation pairs, and BLEU and chrF
of the first of them translated as translate.py would, each line whole (as with
--no-split-sentences)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from data.batching import eval_batches
from nmt.models.translator import Translator, default_searches
from nmt.rundir.bookkeeping import Bookkeeping
from nmt.runtime.compilation import AheadOfTime, CompileLog
from nmt.runtime.distributed import local_copy
from nmt.training.run_data import PreparedCorpus
from nmt.translation import scoring
from transformer.config import SearchConfig
from transformer.training import shard_batch


class Validator:
    """Scores parameters on the validation split; `echo` prints the sample translations.

    The first `sentences` pairs are translated with translate.py's own settings (source
    widths, batch budget, searches at once), so the search programs validation compiles and
    stores are those `translate.py --evaluate` loads next on this machine: its first run after
    training compiles nothing for the widths validation met (docs/translating.md)."""

    def __init__(self, data: PreparedCorpus, eval_step, mesh, search: SearchConfig,
                 sentences: int, samples: int, bleu: dict[str, str | None],
                 echo: Callable[[str], None], compile_log: CompileLog):
        self.data, self.eval_step, self.mesh = data, eval_step, mesh
        self.search, self.samples, self.bleu, self.echo = search, samples, bleu, echo
        self.compile_log = compile_log
        self.sentences = min(sentences, len(data.valid_sources))

    def scores(self, graphdef: nnx.GraphDef, params: nnx.State,
               not_finite: Callable[[float], Exception],
               deadline: float | None = None) -> dict[str, Any]:
        """loss, nll, ppl and accuracy per validation token; bleu, chrf, sentences and
        translate_s when sentences are translated. Past `deadline` (time.monotonic()), the
        translating stops: no bleu or chrf then, and `translated` says how far it got.

        A loss that is not finite raises `not_finite(loss)`: an update left the parameters
        so (its own loss, computed before it, was finite), and nothing else here holds."""
        sums = None
        for batch in eval_batches(self.data.valid_examples, self.data.eval_batch_config):
            with self.compile_log.labelled(f"eval_step [{AheadOfTime.describe(batch)}]"):
                out = self.eval_step(params, shard_batch(batch, self.mesh))
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        sums = {k: float(v) for k, v in local_copy(sums).items()}
        tokens = max(sums["tokens"], 1.0)
        result = {"loss": sums["loss_sum"] / tokens, "nll": sums["nll_sum"] / tokens,
                  "ppl": math.exp(min(sums["nll_sum"] / tokens, 700.0)),
                  "accuracy": sums["correct"] / tokens}
        if not math.isfinite(result["loss"]):
            raise not_finite(result["loss"])
        if self.sentences:
            result.update(self._translation_scores(nnx.merge(graphdef, local_copy(params)),
                                                   deadline))
        return result

    def _translation_scores(self, model, deadline: float | None) -> dict[str, Any]:
        data, n = self.data, self.sentences
        sources, refs = data.valid_sources[:n], data.valid_targets[:n]
        t0 = time.monotonic()
        translator = Translator(model, data.tokenizer, self.search, searches=default_searches())
        done = 0

        def until_deadline(sentences: int) -> None:
            nonlocal done
            done += sentences
            if deadline is not None and time.monotonic() > deadline and done < n:
                raise _OutOfTime

        try:
            with self.compile_log.labelled(f"search [{n} validation sentences]"):
                hyps = [nbest[0].text for nbest in translator.translate_nbest(
                    sources, source="validation set", progress=until_deadline)]
        except _OutOfTime:
            return {"translated": done, "sentences": n,
                    "translate_s": round(time.monotonic() - t0, 1)}
        scores = scoring.evaluate(hyps, refs, **self.bleu)
        for src, ref, hyp in list(zip(sources, refs, hyps))[: self.samples]:
            self.echo(f"  SRC: {src}\n  REF: {ref}\n  HYP: {hyp}")
        return {"bleu": scores.bleu, "chrf": scores.chrf, "sentences": n,
                "translate_s": round(time.monotonic() - t0, 1)}


class _OutOfTime(Exception):
    """The time budget ran out while validation was translating."""


def describe_bleu(tokenizer: str, given: bool) -> str:
    """Which tokenizer validation's BLEU uses, said once at the start: the scores of runs
    tokenized otherwise do not compare."""
    how = "--bleu-tokenize" if given else "the target language's; --bleu-tokenize picks another"
    return f"validation scores BLEU with sacreBLEU's {tokenizer} tokenizer ({how})"


def describe(step: int, result: dict[str, Any]) -> str:
    """One line of a validation's results."""
    bleu = result.get("bleu")
    line = f"step {step}: valid loss {result['loss']:.3f} ppl {result['ppl']:.2f}"
    if bleu is not None:
        return line + f" BLEU {bleu:.2f} chrF {result['chrf']:.1f}"
    if "translated" in result:
        return line + (f" (no BLEU: --max-minutes ran out after translating "
                       f"{result['translated']} of {result['sentences']} sentences)")
    return line


def best_note(bookkeeping: Bookkeeping, improved: bool | None, closing: bool = False) -> str:
    """What the validation's line adds about the best score (`improved` as
    `Bookkeeping.record` says): that this is the best, or which is, or nothing. `closing`:
    a validation at a stop off the --eval-every grid (`Bookkeeping.record`)."""
    if improved and closing:
        return (f" (best {bookkeeping.metric_label}, exported to model/; a resumed run "
                "counts only the validations every --eval-every steps)")
    if improved:
        return f" (best {bookkeeping.metric_label})"
    if improved is False:
        return (f" (best {bookkeeping.metric_label} {bookkeeping.best_score:.2f} at step "
                f"{bookkeeping.best_step})")
    return ""
