"""bench/train.py's command line: what the train-step benchmark refuses and passes on."""

import dataclasses
import importlib.util

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
