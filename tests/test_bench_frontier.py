"""bench.frontier's checks before it measures anything: the --shortlist sizes each model's
shortlist can give, and why a model gets no shortlist rows."""

import json
import shutil

import pytest

from bench import frontier
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
