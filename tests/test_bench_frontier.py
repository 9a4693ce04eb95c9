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
