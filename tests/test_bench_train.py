"""bench/train.py's command line: what the train-step benchmark refuses and passes on."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from bench import common, train as bench_train


@pytest.mark.parametrize("weight", ["-1", "nan", "inf", "five"])
def test_a_bad_rdrop_weight_is_refused_in_one_line_naming_the_flag(weight, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_train.parse_args(["--rdrop", weight])
    assert exit_.value.code == 2
    [message] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--rdrop" in message and weight in message


def test_rdrop_is_refused_beside_the_peer_that_has_none(capsys):
    with pytest.raises(SystemExit):
        bench_train.parse_args(["--rdrop", "5", "--compare"])
    assert "--rdrop" in capsys.readouterr().err


def test_the_rdrop_weight_reaches_the_step_that_is_timed():
    args = bench_train.parse_args(["--preset", "tiny", "--layers", "1", "--rdrop", "5",
                                   "--batch", "2", "--src-len", "4", "--tgt-len", "4"])
    step = bench_train.OurStep(args)
    assert step.optimizer_config.rdrop == 5.0
    result = step.measure()
    assert result["is_finite"]


@pytest.mark.parametrize("preset, difference", [("big", "dropout 0.3 (peer 0.1)"),
                                                ("compact", "dropout 0.3 (peer 0.1)"),
                                                ("student-6-2", "norm pre (peer post)"),
                                                ("student-6-1", "norm pre (peer post)")])
def test_compare_refuses_a_preset_whose_model_the_peer_cannot_build(preset, difference, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_train.parse_args(["--preset", preset, "--compare"])
    assert exit_.value.code == 2
    [message] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--compare" in message and preset in message and difference in message
    bench_train.parse_args(["--preset", preset])  # without the peer it runs


def test_products_refuses_the_same_presets_beside_the_peer(capsys):
    from bench import products

    with pytest.raises(SystemExit):
        products.step_args(products.parse_args(["--preset", "big", "--compare"]))
    assert "dropout 0.3" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["base", "small", "tiny"])
def test_the_peer_builds_our_encoder_and_decoder_depths(preset):
    args = bench_train.parse_args(["--preset", preset, "--compare"])
    config = dataclasses.replace(args.config, decoder_layers=1)
    flags = bench_train.peer_args(args, config)
    assert flags[flags.index("--enc-layers") + 1] == str(config.encoder_layers)
    assert flags[flags.index("--dec-layers") + 1] == "1"
    assert "--layers" not in flags
    if (common.PEERS / "common.py").exists():  # the peer's own parser reads them so
        spec = importlib.util.spec_from_file_location("peers_common", common.PEERS / "common.py")
        peers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peers)
        peer = peers.model_config(peers.parser("peer").parse_args(flags))
        assert (peer.enc_layers, peer.dec_layers, peer.d_model, peer.ffn) == (
            config.encoder_layers, 1, config.d_model, config.d_ff)


FAKE_PEER = """\
import json, sys
flags = dict(zip(sys.argv[1::2], sys.argv[2::2]))
batch, tgt_len = int(flags["--batch"]), int(flags["--tgt-len"])
print(json.dumps({"system": "fake-peer", "argv": sys.argv[1:], "batch": batch,
                  "tgt_len": tgt_len, "tokens_per_s": batch * tgt_len / 0.5, "step_s": 0.5,
                  "step_s_min": 0.25}))
"""


def test_with_accumulation_the_peer_trains_all_our_rows_and_the_best_ratio_counts_tokens(
        monkeypatch, tmp_path, capsys):
    (tmp_path / "hf_train_step.py").write_text(FAKE_PEER)
    monkeypatch.setattr(common, "PEERS", tmp_path)
    monkeypatch.setattr(common, "PEER_PYTHON", Path(sys.executable))
    monkeypatch.setattr(common, "peak_flops", lambda dtype: (1e12, "test"))  # a 2048^3 product
    bench_train.main(["--preset", "tiny", "--layers", "1", "--batch", "2", "--accum-steps", "3",
                      "--src-len", "4", "--tgt-len", "4", "--steps", "1", "--warmup", "1",
                      "--compare"])
    ours, peer, ratio, summary = [json.loads(line)
                                  for line in capsys.readouterr().out.splitlines()]
    assert ours["rows"] == 6 and peer["batch"] == 6
    assert ours["tokens_per_s"] == pytest.approx(6 * 4 / ours["step_s"], rel=0.02)  # rounded
    assert ratio["ours_over_peer"] == pytest.approx(ours["tokens_per_s"] / 48, rel=0.01)
    # the same rows on both sides: the best ratio is that of the fastest steps' times
    best = 0.25 / summary["ours_best_step_s"]
    assert summary["best_ours_over_peer"] == pytest.approx(best, rel=0.02)
