"""`python -m nmt.convert` against mismatched files, signals, a full disk and the umask.

A tiny model (tests/translate_model.py) and its MarianMT export stand for the model and the
MarianMT directory a user converts; the export's files are spoiled one at a time. Every
refusal is one line naming the file and the value at fault, and leaves nothing behind.
"""

from __future__ import annotations

import errno
import gc
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nmt.convert import marian
from nmt.convert.__main__ import main
from nmt.models.model_dir import load_model
from nmt.models.translator import Translator
from translate_model import make_model, sentences

pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parents[1]
ERROR = "python -m nmt.convert: error: "


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("run")) / "model"


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> Path:
    """The model as a MarianMT directory (to-marian)."""
    return marian.export_marian(model, tmp_path_factory.mktemp("hf") / "marian")


def convert(argv: list, capsys) -> tuple[int, list[str]]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip().splitlines()


def spoiled(exported: Path, tmp_path: Path, **changes) -> Path:
    """A copy of the MarianMT directory whose config.json has `changes` (None: key removed)."""
    directory = tmp_path / "marian"
    shutil.copytree(exported, directory)
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def assert_refused(directory: Path, tmp_path: Path, capsys, *named: str, status: int = 2) -> str:
    """from-marian exits `status` (2: a usage error; 1: a damaged file) with one line naming
    `named`, and writes nothing."""
    code, err = convert(["from-marian", directory, tmp_path / "out"], capsys)
    assert code == status and len(err) == 1, err
    assert err[0].startswith(ERROR), err[0]
    for text in named:
        assert text in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marian"]
    return err[0]


# ----------------------------------------------------------------------------- import checks


@pytest.mark.parametrize("changes, named", [
    ({"encoder_layers": 1}, ["model.encoder.layers.1.* are in", "model.safetensors",
                             "has encoder_layers 1", "set encoder_layers to 2"]),
    ({"decoder_layers": 1}, ["model.decoder.layers.1.* are in", "has decoder_layers 1"]),
    ({"decoder_layers": 3}, ["has decoder_layers 3 but", "has 2 decoder layers",
                             "set decoder_layers to 2"]),
], ids=["fewer encoder layers", "fewer decoder layers", "more decoder layers"])
def test_layers_the_config_does_not_count_are_refused(changes, named, exported, tmp_path,
                                                      capsys):
    assert_refused(spoiled(exported, tmp_path, **changes), tmp_path, capsys, *named)


def test_a_tensor_of_no_marian_model_is_refused(exported, tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    directory = spoiled(exported, tmp_path)
    state = load_file(str(directory / "model.safetensors"))
    state["model.encoder.adapter.weight"] = np.zeros((4, 4), np.float32)
    save_file(state, str(directory / "model.safetensors"))
    assert_refused(directory, tmp_path, capsys, "model.safetensors has tensors",
                   "model.encoder.adapter.weight")


@pytest.mark.parametrize("changes, named", [
    ({"d_model": 48}, ["model.shared.weight has shape (300, 24)",
                       "d_model 48 makes it (300, 48)", "the weights have d_model 24"]),
    ({"encoder_ffn_dim": 32, "decoder_ffn_dim": 32},
     ["model.encoder.layers.0.fc1.weight has shape (40, 24)", "encoder_ffn_dim 32"]),
    ({"max_position_embeddings": 32}, ["embed_positions.weight has shape (64, 24)",
                                       "max_position_embeddings 32"]),
], ids=["d_model", "ffn", "positions"])
def test_a_config_that_does_not_fit_the_weights_names_field_and_shape(changes, named, exported,
                                                                      tmp_path, capsys):
    assert_refused(spoiled(exported, tmp_path, **changes), tmp_path, capsys, *named)


@pytest.mark.parametrize("name, shape", [("final_logits_bias", (1, 10)),
                                         ("model.decoder.layers.1.fc1.weight", (7, 24))])
def test_one_tensor_unlike_the_rest_is_blamed_not_the_config(name, shape, exported, tmp_path,
                                                             capsys):
    """The embedding and the first fc1 agree with config.json: a tensor of another shape is
    the one at fault, and config.json is not said to be another model's."""
    from safetensors.numpy import load_file, save_file

    directory = spoiled(exported, tmp_path)
    state = load_file(str(directory / "model.safetensors"))
    state[name] = np.zeros(shape, np.float32)
    save_file(state, str(directory / "model.safetensors"))
    line = assert_refused(directory, tmp_path, capsys, f"{name} has shape {shape} but the other "
                          "tensors", "the file is damaged: download it again", status=1)
    assert "came with them" not in line


@pytest.mark.parametrize("changes, named", [
    ({"layer_norm_eps": "x"}, "layer_norm_eps is 'x' but must be a number >= 0"),
    ({"vocab_size": -1}, "vocab_size is -1 but must be a positive integer"),
    ({"max_position_embeddings": "64"}, "max_position_embeddings is '64' but must be a positive"),
    ({"d_model": 24.0}, "d_model is 24.0 but must be a positive integer"),
    ({"dropout": 2.0}, "config.json: dropout must be in [0, 1), got 2.0"),
    ({"layer_norm_eps": 0}, "config.json: layer_norm_eps must be > 0, got 0"),
    ({"decoder_start_token_id": [2]}, "decoder_start_token_id is [2] but must be a token id "
                                      "(an integer >= 0)"),
    ({"pad_token_id": [0]}, "pad_token_id is [0] but must be a token id"),
    ({"eos_token_id": -1}, "eos_token_id is -1 but must be a token id"),
    ({"share_encoder_decoder_embeddings": "yes"},
     "config.json: share_encoder_decoder_embeddings must be true or false, got 'yes'"),
], ids=["eps", "vocab_size", "positions", "d_model", "dropout", "eps 0", "decoder start",
        "pad", "eos", "shared embeddings"])
def test_a_config_value_of_the_wrong_kind_is_named(changes, named, exported, tmp_path, capsys):
    assert_refused(spoiled(exported, tmp_path, **changes), tmp_path, capsys, named)


@pytest.mark.parametrize("case", ["zip", "safetensors", "other"])
def test_an_unreadable_pytorch_file_is_said_why(case, exported, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    directory = spoiled(exported, tmp_path)
    weights = directory / "model.safetensors"
    path = directory / "pytorch_model.bin"
    if case == "safetensors":
        weights.rename(path)
        named = "it holds safetensors data, not a PyTorch checkpoint; rename it model.safetensors"
    else:
        torch.save({"x": torch.zeros(1000)}, path)
        weights.unlink()
        if case == "zip":
            os.truncate(path, 2000)
            named = "a damaged or truncated zip archive (PytorchStreamReader failed"
        else:
            path.write_text("hello")
            named = "not a PyTorch checkpoint (torch.save's zip archive), or a truncated one"
    assert_refused(directory, tmp_path, capsys, f"{path} cannot be read: {named}",
                   status=2 if case == "safetensors" else 1)  # a misnamed file, or a damaged one


@pytest.mark.parametrize("key", ["encoder_ffn_dim", "decoder_attention_heads", "d_model"])
def test_a_missing_dimension_is_named(key, exported, tmp_path, capsys):
    assert_refused(spoiled(exported, tmp_path, **{key: None}), tmp_path, capsys,
                   f"config.json has no '{key}'")


def other_sentencepiece_model(size: int) -> bytes:
    import io
    import random

    import sentencepiece as spm

    rng = random.Random(3)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "zebras"]
    texts = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(500)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model,
                                   vocab_size=size, model_type="unigram", minloglevel=2)
    return model.getvalue()


def test_sentencepiece_models_of_another_vocabulary_are_refused(exported, tmp_path, capsys):
    directory = spoiled(exported, tmp_path)
    (directory / "target.spm").write_bytes(other_sentencepiece_model(40))
    line = assert_refused(directory, tmp_path, capsys, "target.spm: ", "pieces are not in "
                          "vocab.json", "belong to different models", "at most 1%")
    assert "'▁" in line  # examples of the missing pieces


def test_a_few_missing_pieces_are_counted_in_a_warning(exported, caplog):
    """OPUS-MT's vocab.json may lack a few pieces of its SentencePiece models: up to 1% of
    them is a warning, more an error."""
    from types import SimpleNamespace

    import sentencepiece as spm

    from nmt.convert.common import ConversionError
    from nmt.convert.marian_import import check_pieces

    processor = spm.SentencePieceProcessor(model_proto=(exported / "source.spm").read_bytes())
    vocab = json.loads((exported / "vocab.json").read_text())
    pieces = [p for p in vocab if p not in ("<pad>", "<unk>", "<s>", "</s>")]
    assert len(pieces) == 296
    for missing in (2, 3):  # 1% of 296 pieces: 2.96
        kept = {p: i for p, i in vocab.items() if p not in pieces[-missing:]}
        tokenizer = SimpleNamespace(source=processor, target=processor, vocab=kept)
        if missing == 2:
            check_pieces(exported, tokenizer)
            assert "source.spm: 2 of its 296 pieces are not in vocab.json" in caplog.text
        else:
            with pytest.raises(ConversionError, match="3 of its 296 pieces are not in"):
                check_pieces(exported, tokenizer)


@pytest.mark.parametrize("command", ["to-marian", "to-ctranslate2"])
def test_a_damaged_sentencepiece_model_is_a_fault_named_in_one_line(command, model, tmp_path,
                                                                    capsys):
    if command == "to-ctranslate2":
        pytest.importorskip("ctranslate2")
    shutil.copytree(model, tmp_path / "model")
    (tmp_path / "model" / "spm.model").write_text("not a model")
    code, err = convert([command, tmp_path / "model", tmp_path / "out"], capsys)
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith(f"{ERROR}{tmp_path / 'model' / 'spm.model'}: not a SentencePiece"), \
        err[0]
    assert "unexpected" not in err[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_a_damaged_tokenizer_file_of_a_marian_model_is_named(name, exported, tmp_path, capsys):
    directory = spoiled(exported, tmp_path)
    (directory / name).write_text("{")
    line = assert_refused(directory, tmp_path, capsys, f"{directory / name} is not valid JSON",
                          "download the tokenizer files with the model", status=1)
    assert "unexpected" not in line


@pytest.mark.parametrize("name", ["model.safetensors", "source.spm", "config.json"])
def test_a_damaged_file_of_a_marian_model_is_a_fault(name, exported, tmp_path, capsys):
    """Exit 1, as to-marian's for a damaged model file: the input is at fault, not the
    command (a file left out is a usage error, exit 2)."""
    directory = spoiled(exported, tmp_path)
    path = directory / name
    if name == "model.safetensors":
        os.truncate(path, path.stat().st_size // 2)
    else:
        path.write_text("garbage")
    line = assert_refused(directory, tmp_path, capsys, f"{directory}", name, "download",
                          status=1)
    assert "unexpected" not in line
    path.unlink()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    assert_refused(directory, tmp_path, capsys, str(path) if name != "model.safetensors"
                   else "has no weights", status=2)


# ----------------------------------------------------------------------------- search settings


def test_a_round_trip_through_marian_searches_as_before(model, exported, tmp_path, capsys):
    code, err = convert(["from-marian", exported, tmp_path / "back"], capsys)
    assert code == 0, err
    original, back = load_model(model), load_model(tmp_path / "back")
    assert back[2]["search"] == original[2]["search"]
    assert back[2]["search"].length_penalty == "gnmt"  # not transformers' power penalty
    texts = sentences(30, seed=7)
    outputs = [[h[0].tokens for h in Translator(m, tok, values["search"]).translate_nbest(texts)]
               for m, tok, values in (original, back)]
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("changes, told", [
    ({"strategy": "greedy", "min_len": 3},
     {"num_beams": 1, "do_sample": False, "min_length": 3, "num_return_sequences": 1}),
    ({"strategy": "sample", "top_k": 5, "temperature": 0.7},
     {"num_beams": 1, "do_sample": True, "top_k": 5, "temperature": 0.7, "min_length": 0}),
    ({"beam_size": 4, "nbest": 2},
     {"num_beams": 4, "do_sample": False, "length_penalty": 0.6, "num_return_sequences": 2}),
    ({"max_len_a": 0.0, "max_len_b": 20}, {"max_length": 21}),  # tokens after the start token
    ({"max_len_a": 0.0, "max_len_b": 90}, {"max_length": 65}),  # capped by the 64 positions
    ({"max_len_a": 1.0, "max_len_b": 5}, {"max_length": 65}),  # generate's cannot grow
], ids=["greedy", "sample", "nbest", "flat limit", "flat limit past the positions",
        "growing limit"])
def test_generate_is_told_the_models_search(changes, told, model, tmp_path, capsys):
    """generation_config.json says the stored search in generate's words, which an import
    without nmt_search reads back (the length penalty and limit stay generate's)."""
    source = tmp_path / "model"
    shutil.copytree(model, source)
    config = json.loads((source / "config.json").read_text())
    config["search"].update(changes)
    (source / "config.json").write_text(json.dumps(config))
    code, err = convert(["to-marian", source, tmp_path / "marian"], capsys)
    assert code == 0, err
    path = tmp_path / "marian" / "generation_config.json"
    generation = json.loads(path.read_text())
    assert {name: generation.get(name) for name in told} == told
    assert ("length_penalty" in generation) == (config["search"]["strategy"] == "beam")
    stored = load_model(source)[2]["search"]
    code, err = convert(["from-marian", tmp_path / "marian", tmp_path / "back"], capsys)
    assert code == 0, err
    assert load_model(tmp_path / "back")[2]["search"] == stored
    del generation["nmt_search"]
    path.write_text(json.dumps(generation))
    code, err = convert(["from-marian", tmp_path / "marian", tmp_path / "generate"], capsys)
    assert code == 0, err
    imported = load_model(tmp_path / "generate")[2]["search"]
    kept = ("strategy", "nbest", "min_len", "top_k", "temperature",
            *(("beam_size", "alpha") if stored.strategy == "beam" else ()),
            # a flat limit within the model's 64 positions comes back whole
            *(("max_len_a", "max_len_b") if generation["max_length"] <= 64 else ()))
    assert {k: getattr(imported, k) for k in kept} == {k: getattr(stored, k) for k in kept}


def test_an_earlier_export_of_a_flat_limit_imports(model, tmp_path, capsys):
    """Exports made before a flat output limit was written as max_length wrote the model's
    positions + 1; they still import, with their own search."""
    source = tmp_path / "model"
    shutil.copytree(model, source)
    values = json.loads((source / "config.json").read_text())
    values["search"].update(max_len_a=0.0, max_len_b=20)
    (source / "config.json").write_text(json.dumps(values))
    code, err = convert(["to-marian", source, tmp_path / "marian"], capsys)
    assert code == 0, err
    path = tmp_path / "marian" / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": 65}))
    code, err = convert(["from-marian", tmp_path / "marian", tmp_path / "back"], capsys)
    assert code == 0, err
    assert load_model(tmp_path / "back")[2]["search"] == load_model(source)[2]["search"]


@pytest.mark.parametrize("edit, named", [
    ({"num_beams": 6}, "num_beams is 6 but nmt_search"),
    ({"max_length": 10}, "max_length is 10 but nmt_search (the search settings the model was "
                         "exported with) gives 65"),
    ({"max_new_tokens": 10}, "max_new_tokens is 10 but nmt_search (the search settings the "
                             "model was exported with) leaves it unset"),
    ({"min_new_tokens": 3}, "min_new_tokens is 3 but nmt_search"),
    ({"nmt_search": {"beam_size": 0}}, "nmt_search holds no valid search settings"),
    ({"nmt_search": {"beam": 4}}, "nmt_search holds no valid search settings"),
], ids=["num_beams", "max_length", "max_new_tokens", "min_new_tokens", "invalid", "unknown"])
def test_edited_search_settings_are_not_ignored(edit, named, exported, tmp_path, capsys):
    directory = spoiled(exported, tmp_path)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    assert_refused(directory, tmp_path, capsys, "generation_config.json: ", named,
                   "remove nmt_search")


def test_settings_an_export_cannot_search_with_are_named_in_a_warning(model, exported,
                                                                      tmp_path, capsys):
    """generate settings added to an export are not refused (the model still translates) but
    named, as on an import without nmt_search; the export's own search comes back."""
    directory = spoiled(exported, tmp_path)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "no_repeat_ngram_size": 3}))
    code, err = convert(["from-marian", directory, tmp_path / "back"], capsys)
    assert code == 0, err
    assert err[0] == (f"python -m nmt.convert: warning: {path}: no_repeat_ngram_size 3: "
                      "translate.py's search has no equivalent, so it is ignored; translations "
                      "may differ from generate's.")
    assert not any("warning" in line for line in err[1:]), err
    assert load_model(tmp_path / "back")[2]["search"] == load_model(model)[2]["search"]


# ----------------------------------------------------------------------------- paths


IMPORT_FIRST = ("is a transformers model (config.json: model_type marian), not a model directory "
                "of this project; import a MarianMT model first: python -m nmt.convert "
                "from-marian {} OUT.")


def test_path_mistakes_are_usage_errors(model, exported, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "ct2").mkdir()  # what to-ctranslate2 writes, in outline
    for name in ("model.bin", "config.json", "nmt_config.json", "spm.model"):
        (tmp_path / "ct2" / name).write_text("{}")
    cases = [
        (["to-marian", tmp_path / "missing", tmp_path / "out"], "MODEL", "does not exist"),
        (["to-ctranslate2", tmp_path / "file", tmp_path / "out"], "MODEL", "is a file"),
        (["to-marian", tmp_path, tmp_path / "out"], "MODEL", "has neither config.json"),
        (["to-marian", exported, tmp_path / "out"], "MODEL", IMPORT_FIRST.format(exported)),
        (["to-marian", model, tmp_path / "file" / "out"], "OUT", "is a file"),
        (["to-marian", tmp_path / "ct2", tmp_path / "out"], "MODEL",
         "is a CTranslate2 export (model.bin), not a model directory of this project; pass the "
         "model directory it was exported from"),
        (["from-marian", tmp_path / "ct2", tmp_path / "out"], "MARIAN_DIR",
         "is a CTranslate2 export (model.bin), not a MarianMT model directory; pass a MarianMT "
         "model's directory (translate.py reads the export with --engine ctranslate2)"),
        (["from-marian", model, tmp_path / "out"], "MARIAN_DIR",
         f"{model} is already a model directory of this project (params.msgpack), not a "
         "MarianMT model directory; use it as it is with translate.py, to-marian or "
         "to-ctranslate2."),
        *[([command, exported if command == "from-marian" else model, "/proc/x"], "OUT",
           "/proc/x cannot be created (No such file or directory); choose another")
          for command in COMMANDS
          if command != "to-ctranslate2" or importlib.util.find_spec("ctranslate2")],
        # An empty path names its argument, not the current directory it would mean.
        *[([command, model, ""], "OUT", "was given an empty path; give a new or empty")
          for command in COMMANDS],
        (["to-marian", "", tmp_path / "out"], "MODEL", "was given an empty path; give a"),
        (["to-ctranslate2", "", tmp_path / "out"], "MODEL", "was given an empty path"),
        (["from-marian", "", tmp_path / "out"], "MARIAN_DIR", "was given an empty path"),
    ]
    for argv, flag, named in cases:
        code, err = convert(argv, capsys)
        assert code == 2 and len(err) == 1, (argv, err)
        assert err[0].startswith(f"{ERROR}{flag} ") and named in err[0], err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "file"]


@pytest.mark.parametrize("quantization", ["bfloat16", "int8_bfloat16"])
def test_bfloat16_without_torch_is_a_usage_error(quantization, model, tmp_path, capsys,
                                                 monkeypatch):
    """CTranslate2 converts to bfloat16 with torch; without it the export says so in one
    line before anything is written."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails
    code, err = convert(["to-ctranslate2", model, tmp_path / "ct2", "--quantization",
                         quantization], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"{ERROR}--quantization {quantization} needs torch, with which CTranslate2 "
                      "converts weights to bfloat16, and it is not installed: pip install torch "
                      "--index-url https://download.pytorch.org/whl/cpu (the CPU build), or "
                      "choose another quantization (float16, int8_float16).")
    assert not any(tmp_path.iterdir())


def test_a_bfloat16_export_prints_no_warning_from_inside_ctranslate2(exported, tmp_path,
                                                                    capsys):
    """CTranslate2 hands our read-only arrays (an output bias) to torch.from_numpy, which
    warns (once a process, hence a process of its own) of writes that never happen."""
    from safetensors.numpy import load_file, save_file

    pytest.importorskip("ctranslate2")
    pytest.importorskip("torch")
    directory = spoiled(exported, tmp_path)
    state = load_file(str(directory / "model.safetensors"))
    bias = state["final_logits_bias"]
    state["final_logits_bias"] = np.random.default_rng(0).normal(size=bias.shape).astype(bias.dtype)
    save_file(state, str(directory / "model.safetensors"))
    assert convert(["from-marian", directory, tmp_path / "biased"], capsys)[0] == 0
    out = tmp_path / "ct2"
    result = subprocess.run([sys.executable, "-m", "nmt.convert", "to-ctranslate2",
                             str(tmp_path / "biased"), str(out), "--quantization", "bfloat16"],
                            cwd=REPO, text=True, capture_output=True, timeout=300)
    assert result.returncode == 0 and result.stderr.splitlines() == [f"Wrote {out}"], \
        result.stderr


# ----------------------------------------------------------------------------- files written


COMMANDS = ["to-marian", "to-ctranslate2", "from-marian"]


def source_of(command: str, model: Path, exported: Path) -> Path:
    if command == "to-ctranslate2":
        pytest.importorskip("ctranslate2")
    return exported if command == "from-marian" else model


@pytest.mark.parametrize("command", COMMANDS)
def test_an_out_that_is_a_symbolic_link_is_refused(command, model, exported, tmp_path, capsys):
    """Outputs are renamed into place, which would replace a link (to an empty directory, or
    to nothing yet) by a directory of its own: the link is refused and left as it was."""
    source = source_of(command, model, exported)
    (tmp_path / "empty").mkdir()
    for target in ("empty", "missing"):
        link = tmp_path / f"to-{target}"
        link.symlink_to(target)
        code, err = convert([command, source, link], capsys)
        assert code == 2 and len(err) == 1, err
        assert err[0] == (f"{ERROR}OUT {link} is a symbolic link (to {target}), which the "
                          f"output would replace; give the directory it points to "
                          f"({tmp_path / target}) or a new path."), err[0]
        assert link.is_symlink() and os.readlink(link) == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "to-empty", "to-missing"]
    assert not any((tmp_path / "empty").iterdir())


@pytest.mark.parametrize("command", COMMANDS)
def test_written_files_follow_the_umask(command, model, exported, tmp_path, capsys):
    source = source_of(command, model, exported)
    previous = os.umask(0o022)
    try:
        code, err = convert([command, source, tmp_path / "out"], capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert modes and all(mode == 0o644 for mode in modes.values()), modes
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def run_command(argv: list, first: str = "") -> subprocess.Popen:
    """`python -m nmt.convert ARGV` (after the Python statements `first`), with SIGINT not
    ignored, as it would be if these tests ran as a background job."""
    python = [sys.executable, "-m", "nmt.convert"]
    if first:
        code = (f"{first}; import runpy, sys; sys.argv[0] = 'nmt'; "
                "runpy.run_module('nmt.convert', run_name='__main__', alter_sys=True)")
        python = [sys.executable, "-c", code]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # the child: SIG_DFL
    try:
        return subprocess.Popen([*python, *map(str, argv)], cwd=REPO, stderr=subprocess.PIPE,
                                text=True, env={k: v for k, v in os.environ.items()
                                                if k != "NMT_DEBUG"})
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_disk_names_the_file_and_keeps_the_old_output(command, model, exported,
                                                             tmp_path):
    """Writes beyond RLIMIT_FSIZE fail as on a full disk: an OSError that names no file."""
    source = source_of(command, model, exported)
    out = tmp_path / "out"
    out.mkdir()  # the old (empty) output
    process = run_command([command, source, out], first="import resource; resource.setrlimit("
                          "resource.RLIMIT_FSIZE, (100_000, 100_000))")
    err = process.communicate(timeout=300)[1].strip().splitlines()
    assert process.returncode == 1 and len(err) == 1, err
    # the file being written, as it would have been called in OUT
    named = {"to-marian": out / "model.safetensors", "to-ctranslate2": out / "model.bin",
             "from-marian": out / "params.msgpack"}[command]
    assert err[0] == f"{ERROR}{named}: File too large", err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not list(out.iterdir())


def test_a_full_disk_is_said_so(model, tmp_path, capsys, monkeypatch):
    real = Path.write_bytes

    def disk_full(self, data):
        if self.name == "model.safetensors":
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write(2) gives it
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", disk_full)
    code, err = convert(["to-marian", model, tmp_path / "out"], capsys)
    line = (f"{ERROR}{tmp_path / 'out' / 'model.safetensors'}: no space left on the device; "
            "free some space (or choose a directory on another disk) and run the same command "
            "again")
    assert code == 1 and err == [line]
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- interruptions


def test_an_interruption_a_library_swallows_still_stops_the_export(model, tmp_path, capsys,
                                                                   monkeypatch):
    """Python prints, and forgets, an exception raised in a garbage collection callback (JAX
    registers one): a Ctrl-C arriving there must still stop the command."""
    real_config = marian.marian_config

    def ctrl_c_during_collection(phase, info):
        if phase == "start":
            gc.callbacks.remove(ctrl_c_during_collection)
            signal.raise_signal(signal.SIGINT)

    def config_after_collection(config):
        gc.callbacks.append(ctrl_c_during_collection)
        gc.collect()
        return real_config(config)

    monkeypatch.setattr(marian, "marian_config", config_after_collection)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        code, err = convert(["to-marian", model, tmp_path / "out"], capsys)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and err[-1] == "python -m nmt.convert: interrupted", err
    assert list(tmp_path.iterdir()) == []


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_signal_leaves_nothing_behind(command, model, exported, tmp_path):
    """SIGINT and SIGTERM at a few points of a conversion (fractions of its duration here):
    exit status 130 or 143 and nothing left, or, when the signal came after the output was
    complete, that whole output."""
    source = source_of(command, model, exported)
    start = time.monotonic()
    complete = run_command([command, source, tmp_path / "complete"])
    complete.communicate(timeout=300)
    duration = time.monotonic() - start
    assert complete.returncode == 0
    expected = tree(tmp_path / "complete")
    interrupted = set()
    for signum in (signal.SIGINT, signal.SIGTERM):
        for fraction in (0.3, 0.7):
            parent = tmp_path / f"{signum}-{fraction}"
            parent.mkdir()
            process = run_command([command, source, parent / "out"])
            time.sleep(fraction * duration)
            process.send_signal(signum)
            err = process.communicate(timeout=300)[1]
            left = sorted(p.name for p in parent.iterdir())
            assert left in ([], ["out"]), (signum, fraction, left, err)
            if left:  # only a complete output, published before the signal was seen
                assert tree(parent / "out") == expected
            if f"Wrote {parent / 'out'}" in err:
                assert process.returncode in (0, 128 + signum, -signum), err
            else:
                assert process.returncode == 128 + signum, (signum, fraction, err)
                said = "interrupted" if signum == signal.SIGINT else "terminated"
                assert err.strip().splitlines()[-1] == f"python -m nmt.convert: {said}", err
                interrupted.add(signum)
    assert interrupted == {signal.SIGINT, signal.SIGTERM}


def test_a_hub_id_is_told_to_be_downloaded_first(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = convert(["from-marian", "Helsinki-NLP/opus-mt-en-de", "out"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "looks like a Hugging Face hub id" in err[0]
    assert ("huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de"
            in err[0])
    code, err = convert(["from-marian", "./missing", "out"], capsys)  # a path: no such hint
    assert code == 2 and "hub id" not in err[0] and "is not a directory" in err[0]
