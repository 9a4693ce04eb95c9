"""Search strategies as values: `Greedy`, `Sample` and `Beam`, made from a `SearchConfig`.

`SearchConfig` is the schema that flags, recipes and stored models speak; `plan_search` reads
its strategy and beam-rule names once and returns the strategy, which holds exactly what a
compiled search program reads and is itself jit's static argument (`transformer.search`):
settings that differ only where a strategy never looks share one program. The output length
limit (max_len_a, max_len_b) is not part of a strategy: it reaches every program as
per-sentence limits. No JAX here: translate.py's argument checks import this module.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Union


class TopKTooLarge(ValueError):
    """A top-k larger than the tokens a search chooses among: a mistake in the settings, not a
    no-op. `naming` words it for a caller that calls the setting otherwise (a flag)."""

    def __init__(self, top_k: int, what: str, tokens: int):
        self.top_k, self.what, self.tokens = top_k, what, tokens
        super().__init__(self.naming("top_k"))

    def naming(self, setting: str) -> str:
        return (f"{setting} {self.top_k} is larger than {self.what} ({self.tokens} tokens); "
                "use a smaller value, or 0 for no limit.")


@dataclasses.dataclass(frozen=True)
class Greedy:
    """The likeliest allowed token at every step (EOS is not allowed before `min_len`)."""

    min_len: int = 0

    nbest = 1              # hypotheses per sentence
    rows_per_sentence = 1  # decoder rows a sentence takes
    draws = False          # reads random numbers

    def check_vocabulary(self, vocab_size: int, what: str = "the model's vocabulary") -> None:
        """Every vocabulary can be searched greedily."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """A token drawn from softmax(log p / temperature) at every step, among the `top_k`
    likeliest (0: among all): for back-translation."""

    temperature: float = 1.0
    top_k: int = 0
    min_len: int = 0

    nbest = 1
    rows_per_sentence = 1
    draws = True

    def check_vocabulary(self, vocab_size: int, what: str = "the model's vocabulary") -> None:
        """TopKTooLarge where top_k exceeds the vocabulary (`what`: or the candidate tokens a
        shortlist leaves)."""
        if self.top_k > vocab_size:
            raise TopKTooLarge(self.top_k, what, vocab_size)


class Stopping(enum.Enum):
    """When a sentence's beam search is done (`transformer.search.beam.can_improve`)."""

    # The best live beam, its log-probability divided by the penalty of its length so far
    # (without the EOS it would still need, as transformers' test), does not beat the k-th
    # finished one.
    BEST_ALIVE_NOW = "best alive now"
    # No live beam could beat the nbest-th finished one even at the length limit.
    BOUND_AT_LIMIT = "bound at limit"
    # k hypotheses have finished.
    K_FINISHED = "k finished"


@dataclasses.dataclass(frozen=True)
class Beam:
    """Beam search: `size` live hypotheses per sentence, the `nbest` best finished ones
    returned, each scored log p / penalty(length) with GNMT's penalty ((5 + len) / 6) ** alpha,
    or len ** alpha with `power_penalty`.

    The beam rules are three independent choices: `stopping`; whether only an EOS among a
    step's `size` best candidates finishes (`eos_among_best_k`; else any of the 2 * size);
    and whether an EOS forced at the length limit adds log p 0 (`forced_eos_free`, as
    transformers' generate scores it) rather than its log-probability.
    """

    size: int = 4
    nbest: int = 1
    alpha: float = 0.6
    power_penalty: bool = False
    stopping: Stopping = Stopping.BEST_ALIVE_NOW
    eos_among_best_k: bool = True
    forced_eos_free: bool = False
    min_len: int = 0

    draws = False

    @property
    def rows_per_sentence(self) -> int:
        return self.size

    def check_vocabulary(self, vocab_size: int, what: str = "the model's vocabulary") -> None:
        """Any vocabulary: a step takes at most its vocabulary's tokens per beam."""


Strategy = Union[Greedy, Sample, Beam]

# What each beam rule of `SearchConfig.beam_rules` is: (stopping, eos_among_best_k,
# forced_eos_free).
_BEAM_RULES = {
    "heuristic": (Stopping.BEST_ALIVE_NOW, True, False),
    "exact": (Stopping.BOUND_AT_LIMIT, False, False),
    "k-finished": (Stopping.K_FINISHED, True, False),
    "transformers": (Stopping.BEST_ALIVE_NOW, True, True),
}

_KINDS: dict[str, type[Strategy]] = {"greedy": Greedy, "sample": Sample, "beam": Beam}

# Search steps are counted in int32, so no output reaches this length: a larger min_len bans
# EOS at exactly the steps this one does (the output limit, at most the model's positions,
# gives way to neither), and only this one can be compared with a step in compiled code.
LONGEST_OUTPUT = 2**31 - 1


def strategy_kind(name: str) -> type[Strategy]:
    """The class of the strategy `SearchConfig.strategy` names (a KeyError for no name)."""
    return _KINDS[name]


def plan_search(config) -> Strategy:
    """The strategy a `transformer.config.SearchConfig` describes: the one place its strategy
    and rule names are read (config.py calls it to validate, so it is not imported here).

    ValueError where the settings cannot go together (n-best lists need beam search).
    """
    kind = strategy_kind(config.strategy)
    if config.nbest > 1 and kind is not Beam:
        raise ValueError(
            f"SearchConfig.nbest ({config.nbest}) needs beam search; strategy "
            f"{config.strategy!r} gives one hypothesis per sentence. Use strategy='beam' "
            "or nbest=1.")
    min_len = min(config.min_len, LONGEST_OUTPUT)
    if kind is Greedy:
        return Greedy(min_len=min_len)
    if kind is Sample:
        return Sample(temperature=float(config.temperature), top_k=config.top_k,
                      min_len=min_len)
    stopping, eos_among_best_k, forced_eos_free = _BEAM_RULES[config.beam_rules]
    return Beam(size=config.beam_size, nbest=config.nbest, alpha=float(config.alpha),
                power_penalty=config.length_penalty == "power", stopping=stopping,
                eos_among_best_k=eos_among_best_k, forced_eos_free=forced_eos_free,
                min_len=min_len)
