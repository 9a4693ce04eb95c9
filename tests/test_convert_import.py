"""Importing MarianMT models (OPUS-MT checkpoints), checked against transformers.

An OPUS-MT-style model is made here: a random `MarianMTModel` with swish activations, an
output bias, Marian's ids (eos 0, unk 1, pad last, the decoder starting from pad) and
separate source and target SentencePiece models with one vocab.json, saved with transformers'
own `save_pretrained`. Imported, it must compute, translate and export as transformers does,
and fine-tune with train.py --init-from.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from conftest import deferred_or_skip

from nmt.convert import marian
from nmt.convert.common import ConversionError
from nmt.convert.marian_import import import_marian
from nmt.models.model_dir import load_model
from nmt.models.translator import Translator
from synthetic_corpus import write_corpus
from transformer.config import SearchConfig

torch, transformers, _ = deferred_or_skip("torch", "transformers", "safetensors")

LANGUAGE_TOKEN = ">>deu<<"


def train_spm(texts: list[str], vocab_size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model,
                                   vocab_size=vocab_size, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2)
    return model.getvalue()


def marian_vocab(*models: bytes) -> dict[str, int]:
    """vocab.json as Marian builds it: </s> 0, <unk> 1, the pieces of both models, then a
    language token, then <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if not processor.is_control(i) and not processor.is_unknown(i):
                vocab.setdefault(piece, len(vocab))
    vocab[LANGUAGE_TOKEN] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return {"train": write_corpus(root, 400, 0, "train"),
            "valid": write_corpus(root, 30, 1, "valid")}


def lines(prefix: str, side: str) -> list[str]:
    with open(f"{prefix}.{side}", encoding="utf-8") as f:
        return f.read().splitlines()


def make_opus_dir(directory, corpus, **config_overrides):
    """A MarianMT directory as OPUS-MT publishes them, with random weights, saved by
    transformers' own save_pretrained."""
    directory.mkdir(parents=True)
    source = train_spm(lines(corpus["train"], "en"), 40)
    target = train_spm(lines(corpus["train"], "de"), 48)
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    vocab = marian_vocab(source, target)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(**{
        "vocab_size": len(vocab), "decoder_vocab_size": len(vocab), "d_model": 24,
        "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 3,
        "decoder_attention_heads": 3, "encoder_ffn_dim": 40, "decoder_ffn_dim": 40,
        "activation_function": "swish", "scale_embedding": True, "max_position_embeddings": 64,
        "pad_token_id": pad, "eos_token_id": 0, "decoder_start_token_id": pad,
        "forced_eos_token_id": 0, "init_std": 0.3, **config_overrides})
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # OPUS-MT's bias is all zeros; a random one shows a lost bias
        model.final_logits_bias.normal_()
    model.generation_config.update(num_beams=4, bad_words_ids=[[pad]], max_length=64)
    model.save_pretrained(directory)
    tokenizer = transformers.MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"),
        str(directory / "vocab.json"), source_lang="en", target_lang="de")
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def opus_dir(corpus, tmp_path_factory):
    return make_opus_dir(tmp_path_factory.mktemp("opus") / "opus-mt-en-de", corpus)


@pytest.fixture(scope="module")
def hf(opus_dir):
    return (transformers.MarianMTModel.from_pretrained(opus_dir).eval(),
            transformers.MarianTokenizer.from_pretrained(opus_dir))


@pytest.fixture(scope="module")
def imported(opus_dir, tmp_path_factory):
    return import_marian(opus_dir, tmp_path_factory.mktemp("ours") / "model")


@pytest.fixture(scope="module")
def texts(corpus):
    valid = lines(corpus["valid"], "en")
    return valid[:12] + [f"{LANGUAGE_TOKEN} {valid[0]}", "red cat é zebra"]


def test_import_keeps_marian_conventions(imported, opus_dir):
    _, tokenizer, values = load_model(imported)
    config, vocab = values["model"], json.loads((opus_dir / "vocab.json").read_text())
    assert config.activation == "swish" and config.output_bias
    assert (config.eos_id, config.unk_id, config.pad_id) == (0, 1, len(vocab) - 1)
    assert config.bos_id == config.pad_id  # the decoder starts from pad
    assert config.layer_norm_epsilon == 1e-5
    assert values["search"].length_penalty == "power"
    assert values["search"].beam_rules == "transformers" and values["search"].beam_size == 4
    assert {"source.spm", "target.spm", "vocab.json"} <= {p.name for p in imported.iterdir()}


def test_tokenizer_gives_marian_ids(imported, hf, texts):
    _, hf_tokenizer = hf
    _, tokenizer, _ = load_model(imported)
    ours = [ids + [tokenizer.ids.eos] for ids in tokenizer.encode(texts)]
    assert ours == hf_tokenizer(texts)["input_ids"]
    assert ours[-2][0] == tokenizer.vocab[LANGUAGE_TOKEN]  # the language token is one piece
    assert tokenizer.ids.unk in ours[-1]  # "é" and "z" are in neither SentencePiece model


def test_round_trip_to_marian_is_identical(imported, opus_dir, tmp_path):
    from safetensors.numpy import load_file

    exported = marian.export_marian(imported, tmp_path / "again")
    before = load_file(str(opus_dir / "model.safetensors"))
    after = load_file(str(exported / "model.safetensors"))
    weights = {name for name in before if "embed_positions" not in name}
    assert weights <= set(after)
    for name in weights:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    for name in set(before) - weights:  # the same sinusoids, computed by each library
        np.testing.assert_allclose(after[name], before[name], atol=1e-6, err_msg=name)
    for name in ("source.spm", "target.spm"):
        assert (exported / name).read_bytes() == (opus_dir / name).read_bytes()
    assert json.loads((exported / "vocab.json").read_text()) == json.loads(
        (opus_dir / "vocab.json").read_text())


def test_teacher_forced_logits_equal_transformers(imported, hf, texts):
    hf_model, hf_tokenizer = hf
    model, tokenizer, _ = load_model(imported)
    src = hf_tokenizer(texts, return_tensors="np", padding=True)
    targets = [[tokenizer.ids.bos] + ids for ids in tokenizer.encode(texts[::-1], "target")]
    width = max(map(len, targets))
    tgt_in = np.array([t + [tokenizer.ids.pad] * (width - len(t)) for t in targets], np.int32)
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(src["input_ids"]),
                          attention_mask=torch.tensor(src["attention_mask"]),
                          decoder_input_ids=torch.tensor(tgt_in)).logits.numpy()
    mine = np.asarray(model(src["input_ids"].astype(np.int32), tgt_in))
    real = np.arange(width)[None, :] < np.array([len(t) for t in targets])[:, None]
    np.testing.assert_allclose(mine[real], theirs[real], atol=1e-4, rtol=0)


def test_untied_embeddings_import_and_export_exactly(corpus, texts, tmp_path):
    """Separate encoder and decoder tables, the output layer tied to the decoder's (and so
    left out of the weights file)."""
    from safetensors.numpy import load_file

    directory = make_opus_dir(tmp_path / "untied", corpus,
                              share_encoder_decoder_embeddings=False)
    assert "lm_head.weight" not in load_file(str(directory / "model.safetensors"))
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    imported = import_marian(directory, tmp_path / "ours")
    model, tokenizer, values = load_model(imported)
    assert not values["model"].share_embeddings
    src = np.array([tokenizer.encode(texts[:1])[0] + [tokenizer.ids.eos]], np.int32)
    tgt = np.array([[tokenizer.ids.bos] + tokenizer.encode(texts[1:2], "target")[0]], np.int32)
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(src),
                          decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(src, tgt)), theirs, atol=1e-4, rtol=0)
    again = transformers.MarianMTModel.from_pretrained(
        marian.export_marian(imported, tmp_path / "again")).eval()
    with torch.no_grad():
        np.testing.assert_array_equal(
            again(input_ids=torch.tensor(src), decoder_input_ids=torch.tensor(tgt)).logits,
            hf_model(input_ids=torch.tensor(src), decoder_input_ids=torch.tensor(tgt)).logits)


def test_a_shortlist_for_an_imported_model_is_refused_in_one_line(imported, corpus, capsys):
    """Marian's pad is its last id: the shortlist, which keeps the special ids first, would
    have to hold the whole vocabulary."""
    from nmt.distillation.shortlist import main

    assert main(["--model", str(imported), "--train-prefix", corpus["train"]]) == 1
    error = capsys.readouterr().err.strip()
    assert "are not its first ids, as in a model imported from Marian" in error
    assert "\n" not in error and not (imported / "shortlist.npz").exists()


def test_pytorch_bin_weights_import_as_safetensors_do(opus_dir, imported, tmp_path):
    directory = tmp_path / "bin"
    shutil.copytree(opus_dir, directory)
    state = transformers.MarianMTModel.from_pretrained(opus_dir).state_dict()
    torch.save(state, directory / "pytorch_model.bin")  # what older checkpoints hold
    (directory / "model.safetensors").unlink()
    from_bin = import_marian(directory, tmp_path / "ours")
    assert (from_bin / "params.msgpack").read_bytes() == (imported / "params.msgpack").read_bytes()


def generate(hf, texts: list[str], limit: int, beams: int) -> list[list[int]]:
    model, tokenizer = hf
    out = []
    for text in texts:
        batch = tokenizer([text], return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**batch, num_beams=beams, do_sample=False,
                                 max_length=limit + 1)[0, 1:].tolist()
        out.append([i for i in ids if i not in (0, model.config.pad_token_id)])
    return out


def target_text(hf_tokenizer, ids: list[list[int]]) -> list[str]:
    """Outputs as text, joined by the target SentencePiece model (as Marian does; transformers
    joins them with the source model unless told otherwise)."""
    return hf_tokenizer.batch_decode(ids, skip_special_tokens=True, use_source_tokenizer=False)


@pytest.mark.parametrize("beams", [1, 4])
def test_translations_equal_transformers_generate(imported, hf, texts, beams):
    model, tokenizer, values = load_model(imported)
    limit = 12
    search = SearchConfig(**{**values["search"].to_dict(), "beam_size": beams,
                             "strategy": "beam" if beams > 1 else "greedy",
                             "max_len_a": 0.0, "max_len_b": limit})
    ours = [h[0] for h in Translator(model, tokenizer, search).translate_nbest(texts)]
    theirs = generate(hf, texts, limit, beams)
    assert [list(h.tokens) for h in ours] == theirs
    _, hf_tokenizer = hf
    assert [h.text for h in ours] == target_text(hf_tokenizer, theirs)


def generation_dir(opus_dir, directory, settings: dict, eos_bias: float):
    """A copy of the MarianMT directory whose generation_config.json has `settings` and whose
    EOS logit is raised by `eos_bias` (so that outputs would end early: min_length matters)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(opus_dir, directory)
    path = directory / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    state = load_file(str(directory / "model.safetensors"))
    state["final_logits_bias"][0, 0] += eos_bias
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@pytest.mark.parametrize("settings", [
    {"num_beams": 3, "length_penalty": 0.7, "max_length": 9, "min_length": 5},
    {"num_beams": 1, "max_new_tokens": 7, "min_new_tokens": 4, "max_length": 30},
    {"num_beams": 4, "num_return_sequences": 2, "max_length": 8, "min_length": 3},
], ids=["beam min/max_length", "greedy max/min_new_tokens", "nbest"])
def test_the_imported_search_is_generates_own(settings, opus_dir, texts, tmp_path):
    """generation_config.json's lengths and n-best, read as generate reads them: the imported
    model translates as generate does with no arguments."""
    directory = generation_dir(opus_dir, tmp_path / "marian", settings, eos_bias=4.0)
    model, tokenizer, values = load_model(import_marian(directory, tmp_path / "ours"))
    search = values["search"]
    ours = [[list(h.tokens) for h in hyps]
            for hyps in Translator(model, tokenizer, search).translate_nbest(texts)]
    hf_model = transformers.MarianMTModel.from_pretrained(directory).eval()
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(directory)
    theirs, pad = [], hf_model.config.pad_token_id
    for text in texts:
        with torch.no_grad():
            rows = hf_model.generate(**hf_tokenizer([text], return_tensors="pt")).tolist()
        theirs.append([[i for i in row[1:] if i not in (0, pad)] for row in rows])
    assert ours == theirs
    assert search.nbest == settings.get("num_return_sequences", 1)
    floor = settings.get("min_length", settings.get("min_new_tokens", -1) + 1)
    assert floor == search.min_len
    unbounded = dataclasses.replace(search, min_len=0)  # the floor changes some outputs
    short = Translator(model, tokenizer, unbounded).translate_nbest(texts)
    assert any(len(hyps[0].tokens) + 1 < floor for hyps in short)


@pytest.mark.parametrize("settings, named", [
    ({"num_beams": "x"}, "num_beams is 'x': it must be an integer >= 1"),
    ({"num_beams": -2}, "num_beams is -2: it must be an integer >= 1"),
    ({"num_beams": 0}, "num_beams is 0: it must be an integer >= 1"),
    ({"length_penalty": "x"}, "length_penalty is 'x': it must be a number"),
    ({"max_length": 1}, "max_length is 1: it must be an integer >= 2 (it counts the decoder"),
    ({"do_sample": "yes"}, "do_sample is 'yes': it must be true or false"),
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences is 3: it must be at "
                                                  "most num_beams (2)"),
])
def test_bad_generation_settings_are_named(settings, named, opus_dir, tmp_path, capsys):
    directory = generation_dir(opus_dir, tmp_path / "marian", settings, eos_bias=0.0)
    code, err = convert(["from-marian", str(directory), str(tmp_path / "out")], capsys)
    assert code == 2 and len(err) == 1, err
    assert f"{directory / 'generation_config.json'}: {named}" in err[0], err[0]
    assert not (tmp_path / "out").exists()


def test_generation_settings_without_an_equivalent_are_named_in_a_warning(opus_dir, tmp_path,
                                                                         capsys):
    settings = {"do_sample": True, "num_beams": 1, "top_k": 7, "temperature": 0.5,
                "top_p": 0.9, "no_repeat_ngram_size": 3, "repetition_penalty": 1.2,
                "length_penalty": None}
    directory = generation_dir(opus_dir, tmp_path / "marian", settings, eos_bias=0.0)
    code, err = convert(["from-marian", str(directory), str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert err[0] == (f"python -m nmt.convert: warning: {directory / 'generation_config.json'}: "
                      "no_repeat_ngram_size 3, repetition_penalty 1.2, top_p 0.9: translate.py's "
                      "search has no equivalent, so they are ignored; translations may differ "
                      "from generate's.")
    search = load_model(tmp_path / "out")[2]["search"]
    assert (search.strategy, search.top_k, search.temperature, search.alpha) == (
        "sample", 7, 0.5, 1.0)  # a null length_penalty is transformers' default


def test_translate_py_prints_what_transformers_generates(imported, hf, texts, capsys):
    import translate

    code = translate.main(["--model", str(imported), "--greedy", "--max-len-a", "0",
                           "--max-len-b", "12", *texts[:4]])
    assert code == 0
    printed = capsys.readouterr().out.splitlines()
    _, hf_tokenizer = hf
    assert printed == target_text(hf_tokenizer, generate(hf, texts[:4], 12, 1))


def test_greedy_equals_ctranslate2_on_the_imported_model(imported, texts, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.convert.ctranslate2 import export_ctranslate2

    model, tokenizer, values = load_model(imported)
    search = SearchConfig(strategy="greedy", beam_size=1, max_len_a=0.0, max_len_b=12)
    ours = [h[0].tokens for h in Translator(model, tokenizer, search).translate_nbest(texts)]
    ct2 = ctranslate2.Translator(str(export_ctranslate2(imported, tmp_path / "ct2")))
    sources = [tokenizer.pieces(ids) for ids in tokenizer.encode(texts)]
    results = ct2.translate_batch(sources, beam_size=1, max_decoding_length=11,  # + EOS
                                  suppress_sequences=[["<pad>"]])
    assert [r.hypotheses[0] for r in results] == [tokenizer.pieces(ids) for ids in ours]


# ----------------------------------------------------------------------------- fine-tuning


def test_init_from_starts_from_the_models_parameters_placed_as_fresh_ones(imported):
    """train.py --init-from: the run's first parameters are the model directory's, with the
    sharding and dtype the freshly initialised ones have."""
    import jax
    from flax import nnx

    from nmt.training.starting import initial_params
    from transformer.training import OptimizerConfig, create_train_state

    model, _, values = load_model(imported)
    _, _, state = create_train_state(values["model"], OptimizerConfig(seed=1))
    placed = initial_params(str(imported), state.params)
    expected = jax.tree.leaves(nnx.state(model, nnx.Param))
    fresh = jax.tree.leaves(state.params)
    assert len(jax.tree.leaves(placed)) == len(expected) == len(fresh)
    for got, want, like in zip(jax.tree.leaves(placed), expected, fresh):
        assert got.sharding == like.sharding and got.dtype == like.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_fine_tuning_lowers_the_loss_and_exports_again(imported, corpus, tmp_path, capsys):
    import train

    out = tmp_path / "run"
    pairs = (lines(corpus["valid"], "en"), lines(corpus["valid"], "de"))
    _, tokenizer, _ = load_model(imported)

    def loss(model_dir) -> float:
        model, tok, values = load_model(model_dir)
        scores = Translator(model, tok, values["search"]).score(*pairs)
        return -sum(s for s, _ in scores) / sum(n for _, n in scores)

    code = train.main(["--init-from", str(imported), "--train-prefix", corpus["train"],
                       "--valid-prefix", corpus["valid"], "--max-steps", "40",
                       "--batch-tokens", "512", "--warmup", "10", "--schedule", "inverse_sqrt",
                       "--peak-lr", "3e-3", "--eval-every", "40", "--eval-sentences", "0",
                       "--dropout", "0", "--output-dir", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "Starting from the parameters of" in capsys.readouterr().out
    assert (out / "vocab.json").read_bytes() == (imported / "vocab.json").read_bytes()
    assert loss(out / "model") < loss(imported) - 1.0

    exported = marian.export_marian(out / "model", tmp_path / "marian")
    hf_model = transformers.MarianMTModel.from_pretrained(exported).eval()
    model, tok, _ = load_model(out / "model")
    src = np.array([tok.encode(pairs[0][:3])[0] + [tok.ids.eos]], np.int32)
    tgt = np.array([[tok.ids.bos] + tok.encode(pairs[1][:1], "target")[0]], np.int32)
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(src),
                          decoder_input_ids=torch.tensor(tgt)).logits.numpy()
    np.testing.assert_allclose(np.asarray(model(src, tgt)), theirs, atol=1e-4, rtol=0)

    # Resuming needs the same starting point: without it the run's parameters would be
    # continued under another architecture and tokenizer.
    code = train.main(["--train-prefix", corpus["train"], "--valid-prefix", corpus["valid"],
                       "--max-steps", "50", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"pass --init-from {imported} to resume it" in err, err


def test_init_from_refuses_another_architecture(imported, corpus, tmp_path, capsys):
    import train

    code = train.main(["--init-from", str(imported), "--train-prefix", corpus["train"],
                       "--d-model", "32", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--d-model 32 conflicts with --init-from" in err[0]
    assert "whose model has d_model 24" in err[0]
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- bad input


def convert(argv, capsys):
    from nmt.convert.__main__ import main

    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


def spoil(directory, case: str) -> str:
    """Break a copy of a MarianMT directory; returns what the error must name."""
    config = json.loads((directory / "config.json").read_text())
    if case == "no config.json":
        (directory / "config.json").unlink()
        return "config.json is missing"
    if case == "not marian":
        (directory / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
        return "model_type is 'bart', not 'marian'"
    if case == "gelu":
        (directory / "config.json").write_text(
            json.dumps({**config, "activation_function": "gelu"}))
        return "activation_function='gelu' cannot be imported"
    if case == "no vocab.json":
        (directory / "vocab.json").unlink()
        return "vocab.json is missing"
    if case == "vocabulary size":
        vocab = json.loads((directory / "vocab.json").read_text())
        vocab["extra"] = len(vocab)
        (directory / "vocab.json").write_text(json.dumps(vocab))
        return f"vocab.json has {len(vocab)} pieces but the weights' embedding has"
    if case in ("vocab_size", "decoder_vocab_size"):  # the other field agrees with vocab.json
        (directory / "config.json").write_text(json.dumps({**config, case: config[case] + 1}))
        return f"config.json: {case} is {config[case] + 1} but vocab.json has {config[case]} pieces"
    if case == "no weights":
        (directory / "model.safetensors").unlink()
        return "has no weights (model.safetensors or pytorch_model.bin)"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["no config.json", "not marian", "gelu", "no vocab.json",
                                  "vocabulary size", "vocab_size", "decoder_vocab_size",
                                  "no weights"])
def test_import_errors_name_the_file_and_write_nothing(case, opus_dir, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(opus_dir, broken)
    named = spoil(broken, case)
    code, err = convert(["from-marian", str(broken), str(tmp_path / "out")], capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("python -m nmt.convert: error: ") and named in err[0], err[0]
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["broken"]


def test_import_refuses_a_non_empty_output(opus_dir, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    code, err = convert(["from-marian", str(opus_dir), str(tmp_path / "out")], capsys)
    assert code == 2 and "exists and is not empty" in err[0]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_import_command_writes_a_model(opus_dir, tmp_path, capsys):
    code, err = convert(["from-marian", str(opus_dir), str(tmp_path / "out")], capsys)
    assert code == 0, err
    assert err[0] == f"Wrote {tmp_path / 'out'}"
    load_model(tmp_path / "out")
    with pytest.raises(ConversionError, match="exists and is not empty"):
        import_marian(opus_dir, tmp_path / "out")
