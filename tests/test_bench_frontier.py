"""bench.frontier's checks before it measures anything: the --shortlist sizes each model's
shortlist can give, and why a model gets no shortlist rows; and the frontier it reports: the
measurements no other is both at least as fast as and at least as good as."""

import json
import shutil
import sys

import pytest

from bench import frontier
from bench.frontier import Point
from transformer.shortlist import Shortlist


@pytest.fixture(scope="module")
def shortlisted(run_dir, tmp_path_factory):
    """A copy of the tiny model with a shortlist built from a small corpus."""
    from nmt.distillation import shortlist as command
    from translate_model import sentences

    folder = tmp_path_factory.mktemp("frontier")
    model = shutil.copytree(run_dir / "model", folder / "model")
    (folder / "train.de").write_text("\n".join(sentences(100, seed=3)) + "\n")
    (folder / "train.en").write_text("\n".join(sentences(100, seed=4)) + "\n")
    assert command.main(["--model", str(model), "--train-prefix", str(folder / "train"),
                         "--per-source", "8", "--always", "10"]) == 0
    return model


def args_of(*flags):
    return frontier.parse_args(["--test-prefix", "t", "--src", "de", "--tgt", "en", *flags])


def test_a_shortlist_size_below_one_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as refused:
        args_of("--model", "m=dir", "--shortlist", "512", "0")
    assert refused.value.code == 2
    assert "--shortlist 0: candidates per batch must be >= 1" in capsys.readouterr().err


def test_a_size_the_translator_refuses_stops_before_anything_is_measured(shortlisted):
    args = args_of("--model", f"s={shortlisted}", "--shortlist", "64", "3")
    with pytest.raises(SystemExit, match=f"--model s={shortlisted}: --shortlist 3: a batch "
                                         "needs at least 5 candidates"):
        frontier.read_models(args)
    args = args_of("--model", f"s={shortlisted}", "--shortlist", "64", "64")
    [(name, path, shortlist)] = frontier.read_models(args)
    assert (name, path, args.shortlist) == ("s", str(shortlisted), [64])
    assert isinstance(shortlist, Shortlist)


def test_a_model_without_a_usable_shortlist_is_said_to_be_measured_without(shortlisted,
                                                                           run_dir, tmp_path,
                                                                           capsys):
    other = shutil.copytree(shortlisted, tmp_path / "other")
    stored = Shortlist.load(other / "shortlist.npz")
    Shortlist(stored.translations, stored.probabilities, stored.by_frequency, stored.always,
              stored.special, "another").save(other / "shortlist.npz")
    capsys.readouterr()
    models = frontier.read_models(args_of("--model", f"other={other}",
                                          "--model", f"plain={run_dir}"))
    assert [shortlist for _, _, shortlist in models] == [None, None]
    skipped = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["model"], line["system"]) for line in skipped] == [
        ("other", "ours shortlist"), ("plain", "ours shortlist")]
    assert "built for another SentencePiece model" in skipped[0]["skipped"]
    assert "has no shortlist.npz" in skipped[1]["skipped"]


def test_ctranslate2_searches_as_ours_also_past_the_models_positions(run_dir, caplog):
    """CTranslate2 gets the engine's cut sources and per-sentence output limits: a source
    past the tiny model's 64 positions crashed it, and a flat limit let outputs run on."""
    pytest.importorskip("ctranslate2")
    from translate_model import sentences

    lines = [*sentences(4, seed=2), " ".join(sentences(4, seed=5, min_words=8))]
    args = args_of("--model", f"m={run_dir}", "--beam", "1", "--dtypes", "float32",
                   "--compute-types", "float32", "--threads", "1", "--inter-threads", "1",
                   "--passes", "1")
    found = {}

    def report(system, hypotheses, seconds, **extra):
        found[system] = hypotheses

    frontier.measure_ours(args, str(run_dir), None, lines, report)
    frontier.measure_ctranslate2(args, str(run_dir), lines, report)
    assert "a sentence of" in caplog.text  # the long one was cut, as the engine cuts it
    assert found["ctranslate2 float32"] == found["ours float32"]


def test_the_frontier_leaves_out_a_point_another_is_as_fast_and_better_than():
    slow_best, fast_worst = Point("a", "ours float32", 100, 40), Point("a", "ct2 int8", 300, 30)
    middle = Point("b", "ours bfloat16", 200, 35)
    beaten = Point("b", "ours float32", 150, 34)  # middle is faster and better
    as_fast_worse = Point("c", "ours float32", 200, 33)  # middle: as fast, better
    as_good_slower = Point("c", "ct2 int8", 250, 30)  # fast_worst: as good, faster
    points = [beaten, fast_worst, as_fast_worse, slow_best, as_good_slower, middle]
    assert frontier.frontier(points) == [slow_best, middle, fast_worst]


def test_equal_points_are_all_on_the_frontier_and_one_point_is_its_own():
    one, same = Point("a", "ours float32", 100, 30), Point("b", "ours float32", 100, 30)
    assert frontier.frontier([one, same]) == [one, same]
    assert frontier.frontier([one]) == [one]
    assert frontier.frontier([]) == []


def test_the_table_marks_the_frontier(capsys):
    frontier.print_table([Point("a", "ours float32", 100, 30), Point("a", "ct2", 90, 29)])
    assert capsys.readouterr().out.splitlines() == [
        "| model | system | sentences/s | BLEU | frontier |", "|---|---|---|---|---|",
        "| a | ours float32 | 100.0 | 30.00 | yes |", "| a | ct2 | 90.0 | 29.00 |  |"]


def test_the_plot_takes_more_models_than_markers_and_draws_the_frontier(tmp_path,
                                                                        monkeypatch):
    from matplotlib.figure import Figure

    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **_: drawn.append(figure))
    points = [Point(f"m{i}", "ours float32", 100 + 10 * i, 40 - i) for i in range(10)]
    points.append(Point("m9", "ct2 int8", 90, 30))  # slower and worse than all: off it
    frontier.plot(points, str(tmp_path / "f.png"), "ten models")
    [line] = drawn[0].axes[0].lines
    assert line.get_xydata().tolist() == [[100 + 10 * i, 40 - i] for i in range(10)]
    markers = {collection.get_paths()[0].vertices.tobytes()
               for collection in drawn[0].axes[0].collections}
    assert len(markers) == 9  # each model its marker, the tenth the first again


def test_the_frontier_is_reported_after_the_measurements(run_dir, tmp_path, monkeypatch,
                                                         capsys):
    lines = ["Ein Mann steht auf einer Leiter.", "Zwei Hunde spielen im Schnee."]
    for lang in ("de", "en"):
        (tmp_path / f"test.{lang}").write_text("".join(line + "\n" for line in lines),
                                               encoding="utf-8")

    def measure_ours(args, path, shortlist, sources, report):
        report("ours float32", lines, 2.0)  # slow, every line right
        report("ours bfloat16", ["", ""], 1.0)  # faster, nothing right
        report("ours bfloat16 again", ["", ""], 1.5)  # as bad and slower

    monkeypatch.setattr(frontier, "measure_ours", measure_ours)
    monkeypatch.setattr(sys, "argv", [
        "frontier.py", "--model", f"m={run_dir}", "--test-prefix", str(tmp_path / "test"),
        "--src", "de", "--tgt", "en", "--compute-types", "--plot", str(tmp_path / "f.png")])
    frontier.main()
    out = capsys.readouterr().out.splitlines()
    [front] = [json.loads(line)["frontier"] for line in out if '"frontier"' in line]
    assert [(p["system"], p["sentences_per_s"], round(p["bleu"])) for p in front] == [
        ("ours float32", 1.0, 100), ("ours bfloat16", 2.0, 0)]
    assert [line.rsplit("|", 2)[-2].strip() for line in out if line.startswith("| m |")
            ] == ["yes", "yes", ""]
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
