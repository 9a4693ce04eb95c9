"""transformer.strategies: search settings read once, as values a compiled search keys on."""

import ast
from pathlib import Path

import pytest

from transformer.config import BEAM_RULES, SearchConfig
from transformer.strategies import Beam, Greedy, Sample, Stopping, plan_search

ROOT = Path(__file__).resolve().parent.parent


def test_each_strategy_and_rule_plans_to_what_its_search_reads():
    assert plan_search(SearchConfig(strategy="greedy", min_len=2)) == Greedy(min_len=2)
    assert plan_search(SearchConfig(strategy="sample", temperature=0.5, top_k=7)) == Sample(
        temperature=0.5, top_k=7)
    assert plan_search(SearchConfig(beam_size=5, nbest=2, alpha=1.0, length_penalty="power",
                                    beam_rules="exact")) == Beam(
        size=5, nbest=2, alpha=1.0, power_penalty=True, stopping=Stopping.BOUND_AT_LIMIT,
        eos_among_best_k=False)
    rules = {rule: plan_search(SearchConfig(beam_rules=rule)) for rule in BEAM_RULES}
    assert rules["heuristic"] == Beam()
    assert rules["k-finished"] == Beam(stopping=Stopping.K_FINISHED)
    assert rules["transformers"] == Beam(forced_eos_free=True)
    assert len(set(rules.values())) == len(BEAM_RULES)  # no two rules search alike


def test_settings_a_strategy_never_reads_give_the_same_strategy():
    """The strategy is jit's static argument: settings it does not hold compile nothing."""
    greedy = SearchConfig(strategy="greedy")
    assert plan_search(SearchConfig(strategy="greedy", beam_size=9, alpha=0.1, top_k=3,
                                    temperature=2.0, beam_rules="exact", max_len_a=3.0,
                                    max_len_b=1)) == plan_search(greedy)
    assert plan_search(SearchConfig(temperature=0.3, top_k=5, max_len_b=40)) == plan_search(
        SearchConfig())
    assert hash(plan_search(SearchConfig())) == hash(plan_search(SearchConfig()))


def test_what_each_strategy_asks_of_its_caller():
    assert [plan_search(SearchConfig(strategy=name)).rows_per_sentence
            for name in ("greedy", "sample")] == [1, 1]
    assert plan_search(SearchConfig(beam_size=6)).rows_per_sentence == 6
    assert [plan_search(SearchConfig(strategy=name)).draws
            for name in ("greedy", "sample", "beam")] == [False, True, False]
    assert plan_search(SearchConfig(beam_size=4, nbest=3)).nbest == 3
    with pytest.raises(ValueError, match="top_k 65 is larger than the model's vocabulary "
                                         r"\(64 tokens\)"):
        Sample(top_k=65).check_vocabulary(64)
    Sample(top_k=64).check_vocabulary(64)


@pytest.mark.parametrize("changes, message", [
    (dict(strategy="beams"), r"SearchConfig.strategy must be one of \('beam', 'greedy', "
                             r"'sample'\), got 'beams'"),
    (dict(beam_rules="fast"), r"SearchConfig.beam_rules must be one of \('heuristic', "
                              r"'exact', 'k-finished', 'transformers'\), got 'fast'"),
    (dict(strategy="greedy", nbest=2), r"SearchConfig.nbest \(2\) needs beam search"),
    (dict(strategy="sample", nbest=3, beam_size=4), r"SearchConfig.nbest \(3\) needs beam"),
])
def test_settings_that_name_no_strategy_are_one_line_naming_the_choices(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        SearchConfig(**changes)
    assert "\n" not in str(info.value)


_SETTING_NAMES = {"strategy", "beam_rules", "rule", "rules", "length_penalty"}


def _compares_a_setting_with_a_name(node: ast.Compare) -> bool:
    """`x.strategy == "beam"`, `rules in ("exact", ...)` and the like."""
    operands = [node.left, *node.comparators]

    def named(operand) -> bool:
        name = (operand.attr if isinstance(operand, ast.Attribute)
                else operand.id if isinstance(operand, ast.Name) else None)
        return name in _SETTING_NAMES

    def text(operand) -> bool:
        if isinstance(operand, (ast.Tuple, ast.List, ast.Set)):
            return any(text(element) for element in operand.elts)
        return isinstance(operand, ast.Constant) and isinstance(operand.value, str)

    return any(named(operand) for operand in operands) and any(map(text, operands))


def test_strategy_and_rule_names_are_compared_only_where_they_are_planned():
    """Every other module asks the strategy value (`Beam`, `draws`, `rows_per_sentence`,
    its rules), never the names: one place reads them, and a new strategy or rule is one
    entry there."""
    sources = [path for folder in ("transformer", "data", "nmt", "bench")
               for path in (ROOT / folder).rglob("*.py")]
    sources += [ROOT / "train.py", ROOT / "translate.py"]
    planner = ROOT / "transformer" / "strategies.py"
    found, elsewhere = [], []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and _compares_a_setting_with_a_name(node):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                (found if path == planner else elsewhere).append(where)
    assert found, "the check finds the planner's own comparisons"
    assert not elsewhere, elsewhere
