"""transformers' `generate` settings (generation_config.json) <-> our SearchConfig.

Both directions read the fields the same way, so that a model exported to MarianMT and
imported back searches as before, and an OPUS-MT model imported here translates as `generate`
translates it:

- `num_beams` 1 is greedy search, or sampling with `do_sample` (`top_k`, `temperature`);
  more is beam search with `length_penalty` as len ** alpha and transformers' rules for
  finishing (`beam_rules="transformers"`).
- `max_length` counts the decoder's start token, so the output (EOS included) has at most
  `max_length - 1` tokens: max_len_a 0, max_len_b `max_length - 1`; `max_new_tokens`, where
  set, replaces it (max_len_b `max_new_tokens`). Either is capped by the model's positions, as
  it is in transformers. Without either the import keeps our 1.5 x source + 15 (`generate`
  would stop at 19 tokens, its default `max_length` 20, and warn). An export writes a flat
  limit (max_len_a 0) as `max_length`, and one that grows with the source as the model's
  positions + 1.
- `min_length` counts the start token too and is compared before EOS is added, so the output
  has at least `min_length` tokens, EOS included: min_len `min_length`; `min_new_tokens`
  counts the tokens before EOS: min_len `min_new_tokens + 1`.
- `num_return_sequences` is nbest.

A null field is unset, as in transformers (its default applies). Settings our search has no
form for (`no_repeat_ngram_size`, `repetition_penalty`, `top_p`, ...) are named in a warning
and ignored: refusing them would refuse the model, when a user can still translate with it
and compare.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from nmt.convert.common import ConversionError
from transformer.config import SearchConfig
from transformer.strategies import Beam, Sample, plan_search

log = logging.getLogger(__name__)

# generate's settings that change its output and our search does not have, each with the
# value that leaves the output unchanged (transformers' default, or a null).
_IGNORED = {
    "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "early_stopping": False, "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "forced_bos_token_id": None,
    "constraints": None, "force_words_ids": None, "penalty_alpha": 0.0, "guidance_scale": 1.0,
    "stop_strings": None, "max_time": None,
}
# ... and those that only sampling reads.
_IGNORED_SAMPLING = {"top_p": 1.0, "typical_p": 1.0, "min_p": None, "top_h": None,
                     "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}
# transformers' defaults of the settings read here (GenerationConfig's).
_TOP_K, _TEMPERATURE = 50, 1.0
# generate's length fields that replace max_length and min_length where set; an export
# leaves them unset.
REPLACING_LENGTHS = ("max_new_tokens", "min_new_tokens")


def generate_settings(search: SearchConfig, max_len: int) -> dict[str, Any]:
    """generate's fields for `search` in a model of `max_len` positions, as far as generate
    has them."""
    strategy = plan_search(search)
    settings: dict[str, Any] = {
        "num_beams": strategy.size if isinstance(strategy, Beam) else 1,
        "do_sample": isinstance(strategy, Sample),
        "min_length": search.min_len,
        "num_return_sequences": search.nbest,
        "max_length": generate_max_length(search, max_len),
    }
    if isinstance(strategy, Beam):  # generate warns of a length penalty that it does not read
        settings["length_penalty"] = search.alpha
    elif isinstance(strategy, Sample):
        settings.update(top_k=search.top_k, temperature=search.temperature)
    return settings


def generate_max_length(search: SearchConfig, max_len: int) -> int:
    """generate's max_length for our output limit: a flat one (max_len_a 0) as it is, capped
    by the model's positions; else the positions, as generate's limit cannot grow with the
    source. It counts the decoder's start token, so the output stops where ours does."""
    flat = search.max_len_a == 0
    return (search.max_output_len(0, max_len) if flat else max_len) + 1


def search_from_generate(values: dict[str, Any], path: Path,
                         never_generated: set[int]) -> SearchConfig:
    """The SearchConfig that searches as `generate` does with `values` (generation_config.json
    or config.json, at `path`); `never_generated`: the ids our search never emits (PAD, the
    decoder's start), which `bad_words_ids` may name. ConversionError names a field whose value
    generate would not take either, or that our search cannot hold; the settings it has no
    form for are `warn_of_ignored`'s to name."""
    fields = _Fields(values, path)
    beams = fields.integer("num_beams", 1, minimum=1)
    sample = fields.boolean("do_sample")
    alpha = fields.number("length_penalty", 1.0)
    if alpha < 0:
        raise fields.error("length_penalty", "our length penalty len ** alpha takes alpha >= 0 "
                                             "(a negative one, favouring short outputs, has no "
                                             "form here)")
    settings: dict[str, Any] = {"beam_size": beams, "alpha": alpha, "length_penalty": "power",
                                "beam_rules": "transformers"}
    if sample and beams > 1:
        log.warning("%s: do_sample with num_beams %d (beam sampling) has no form here: the "
                    "imported model searches with beam size %d without sampling.", path,
                    beams, beams)
    if sample and beams == 1:
        settings.update(strategy="sample", top_k=fields.integer("top_k", _TOP_K, minimum=0),
                        temperature=fields.number("temperature", _TEMPERATURE, positive=True))
    else:
        settings["strategy"] = "beam" if beams > 1 else "greedy"
    settings.update(_lengths(fields))
    returned = fields.integer("num_return_sequences", 1, minimum=1)
    if sample and beams == 1 and returned > 1:
        log.warning("%s: num_return_sequences %d with sampling: translate.py draws one sample "
                    "per sentence (run it again for others).", path, returned)
    elif returned > beams:
        raise fields.error("num_return_sequences", f"it must be at most num_beams ({beams}), "
                                                   "as generate requires")
    else:
        settings["nbest"] = returned
    return SearchConfig(**settings)


def warn_of_ignored(values: dict[str, Any], path: Path, never_generated: set[int]) -> None:
    """One warning naming the settings in `values` that our search has no form for: the
    import goes on without them, and the user learns that generate's output may differ."""
    fields = _Fields(values, path)
    sample = fields.boolean("do_sample")
    ignored = fields.ignored(dict(_IGNORED, **(_IGNORED_SAMPLING if sample else {})),
                             never_generated)
    if ignored:
        log.warning("%s: %s: translate.py's search has no equivalent, so %s ignored; "
                    "translations may differ from generate's.", path, ", ".join(ignored),
                    "they are" if len(ignored) > 1 else "it is")


def _lengths(fields: _Fields) -> dict[str, Any]:
    """max_len_a, max_len_b and min_len of generate's length fields."""
    out: dict[str, Any] = {}
    new_tokens = fields.integer("max_new_tokens", None, minimum=1)
    if new_tokens is not None:
        out.update(max_len_a=0.0, max_len_b=new_tokens)
    elif (length := fields.integer("max_length", None, minimum=2,
                                   why="it counts the decoder's start token")) is not None:
        out.update(max_len_a=0.0, max_len_b=length - 1)
    else:
        log.warning("%s has no max_length: the imported model keeps translate.py's output limit "
                    "1.5 x source + 15 tokens (generate would stop at 19 tokens).", fields.path)
    min_len = fields.integer("min_length", 0, minimum=0)
    min_new = fields.integer("min_new_tokens", None, minimum=0)
    out["min_len"] = max(min_len, 0 if min_new is None else min_new + 1)
    return out


class _Fields:
    """Typed reads of generate's fields; a null reads as unset."""

    def __init__(self, values: dict[str, Any], path: Path):
        self.values, self.path = values, path

    def error(self, name: str, why: str) -> ConversionError:
        return ConversionError(f"{self.path}: {name} is {self.values.get(name)!r}: {why}; "
                               "correct it, or remove it for transformers' default.")

    def integer(self, name: str, default: int | None, minimum: int, why: str = "") -> Any:
        value = self.values.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(name, f"it must be an integer >= {minimum}"
                                   + (f" ({why})" if why else ""))
        return value

    def number(self, name: str, default: float, positive: bool = False) -> float:
        value = self.values.get(name)
        if value is None:
            return default
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or (positive and value <= 0)):
            raise self.error(name, "it must be a number" + " > 0" * positive)
        return float(value)

    def boolean(self, name: str) -> bool:
        value = self.values.get(name)
        if value is not None and not isinstance(value, bool):
            raise self.error(name, "it must be true or false")
        return bool(value)

    def ignored(self, neutral: dict[str, Any], never_generated: set[int]) -> list[str]:
        """`name value` of each field set to something other than its neutral value."""
        named = [f"{name} {self.values[name]!r}" for name, same in neutral.items()
                 if self.values.get(name) not in (None, same)]
        banned = self.values.get("bad_words_ids")
        if banned and not (isinstance(banned, list) and all(
                isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int)
                and ids[0] in never_generated
                for ids in banned)):
            named.append(f"bad_words_ids {banned!r}")
        return named
