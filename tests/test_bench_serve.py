"""bench.serve's summary of alternating rounds: each load is set against the ceiling pass of
its own round, so that a machine whose speed moves between rounds moves both sides."""

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
