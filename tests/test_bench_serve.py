"""bench.serve's figures: each alternating round's load is set against the ceiling pass of
its own round (a machine whose speed moves between rounds moves both sides), and the calls
that bound a server are what they say (a share of the clients each; sorted: one length)."""

import argparse

import pytest

from bench import serve
from bench.serve import against_ceiling


def test_each_round_is_divided_by_its_own_ceiling_pass():
    rows = [{"clients": 8, "sent_per_s": 100.0}, {"clients": 32, "sent_per_s": 150.0},
            {"clients": 8, "sent_per_s": 60.0}, {"clients": 32, "sent_per_s": 90.0},
            {"clients": 8, "sent_per_s": 80.0}, {"clients": 32, "sent_per_s": 160.0}]
    passes = [{"sent_per_s": 200.0}, {"sent_per_s": 100.0}, {"sent_per_s": 200.0}]
    summary = against_ceiling(rows, passes, [8, 32])
    assert [s["clients"] for s in summary] == [8, 32]
    assert summary[0]["ratios"] == [0.5, 0.6, 0.4] and summary[0]["ratio"] == 0.5
    assert summary[1]["ratios"] == [0.75, 0.9, 0.8] and summary[1]["ratio"] == 0.8
    assert summary[0]["sent_per_s"] == 80.0 and summary[1]["sent_per_s"] == 150.0


class _Tokenizer:
    def encode(self, sentences):
        return [sentence.split() for sentence in sentences]


class _Translator:
    """Records the calls each translator (thread) is given."""

    calls: list[list[str]] = []

    def __init__(self, *args, **kwargs):
        pass

    def warm_up(self):
        pass

    def translate_nbest(self, sentences):
        _Translator.calls.append(list(sentences))
        return [[None]] * len(sentences)


@pytest.mark.parametrize("by_length", [False, True])
def test_calls_hold_a_share_of_the_clients_and_sorted_calls_one_length_each(monkeypatch,
                                                                            by_length):
    from nmt.models import translator

    monkeypatch.setattr(serve, "model_and_search", lambda args: (None, _Tokenizer(), None))
    monkeypatch.setattr(serve, "server_settings", lambda args: argparse.Namespace(
        batch_tokens=512, buckets=None, searches=2))
    monkeypatch.setattr(translator, "Translator", _Translator)
    _Translator.calls = []
    lengths = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    sentences = [" ".join(["w"] * n) + f" {i}" for i, n in enumerate(lengths)]
    rows = serve.call_ceilings(argparse.Namespace(), sentences, [8], by_length=by_length)
    assert rows[0]["sentences_per_call"] == 4 and rows[0]["searches"] == 2
    calls = _Translator.calls
    assert sorted(s for call in calls for s in call) == sorted(sentences)
    assert all(len(call) == 4 for call in calls)
    spans = [max(len(s.split()) for s in call) - min(len(s.split()) for s in call)
             for call in calls]
    if by_length:
        # Each call is four neighbours in length order: here at most 2 tokens apart.
        assert max(spans) <= 2
    else:
        # In the test set's order: calls are consecutive sentences, lengths mixed.
        assert sorted(calls) == sorted(sentences[i:i + 4] for i in range(0, 16, 4))
        assert max(spans) >= 5
