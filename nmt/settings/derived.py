"""Settings that follow from files the settings name: the architecture of the model given by
`trainer.init_from`, the vocabulary size of the SentencePiece model given by
`tokenizer.spm_model` (and its type).

`nmt.settings.recipes.resolve` applies them, so train.py's flags and `recipes.load` build the
same settings. A layer is `{section: {name: (value, origin)}}` (`nmt.settings.recipes.Layer`);
the functions here take the layers the user gave (train.py's defaults do not count) merged
into one, and return the layers those files imply. The files are read only when named:
SentencePiece and JAX load only then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from data.config import TRAINED_TYPES, TokenizerConfig
from nmt.settings.config import SECTIONS, Layer, SettingsError
from transformer.config import ARCHITECTURE, PRESETS, ModelConfig

log = logging.getLogger("train.py")

PRESET_KEY = "preset"  # in the model section (as in nmt.settings.recipes)
MODEL_IDS = ("vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")  # the tokenizer's


def implied_layers(asked: Layer, layers: Sequence[Layer]) -> list[Layer]:
    """The layers implied by `asked` (the user's `layers` merged): none, the vocabulary of
    --spm-model, or the architecture of --init-from; SettingsError on a conflict."""
    spm_model = asked["tokenizer"].get("spm_model", (None,))[0]
    init_from = asked["trainer"].get("init_from", (None,))[0]
    if init_from and spm_model:
        raise SettingsError(f"--init-from {init_from} brings its own tokenizer: drop "
                            f"--spm-model {spm_model}.")
    if spm_model:
        return [spm_model_vocabulary(spm_model, asked, layers)]
    if init_from:
        return [init_from_architecture(init_from, asked)]
    return []


def _layer(section: str, values: dict[str, Any], origin: str) -> Layer:
    layer: Layer = {name: {} for name in SECTIONS}
    layer[section] = {name: (value, origin) for name, value in values.items()}
    return layer


def init_from_architecture(path: str, asked: Layer) -> Layer:
    """With --init-from, the model's architecture, vocabulary and special ids are that
    model's: a layer setting them (and the tokenizer's vocab_size, where TokenizerConfig can
    hold the model's). SettingsError if the directory is no model, or the recipe or flags ask
    for another architecture (a key, or a preset with another) or vocabulary size."""
    from nmt.models.model_dir import ModelDirError, read_model_config, resolve_model_dir
    from nmt.models.model_files import stored_languages

    try:
        config, values = read_model_config(resolve_model_dir(path))
    except ModelDirError as err:
        raise SettingsError(f"--init-from: {err}") from None
    origin = f"--init-from {path}"
    _check_architecture(config, asked, origin)
    if "vocab_size" in asked["tokenizer"] and (
            asked["tokenizer"]["vocab_size"][0] != config.vocab_size):
        value, where = asked["tokenizer"]["vocab_size"]
        raise SettingsError(f"{where} conflicts with {origin}, whose model has "
                            f"{config.vocab_size} pieces, not {value}: a fine-tuned model keeps "
                            f"its tokenizer; drop {where}.")
    # The vocabulary is the model's tokenizer's: no tokenizer is trained.
    layer = _layer("model", {name: getattr(config, name) for name in (*ARCHITECTURE, *MODEL_IDS)},
                   origin)
    if _tokenizer_can_hold(config.vocab_size):  # Marian vocabularies may be smaller
        layer["tokenizer"]["vocab_size"] = (config.vocab_size, f"{origin} (vocab_size)")
    layer["data"] = _languages(stored_languages(values), asked, origin)
    return layer


def _languages(pair: tuple[str | None, str | None], asked: Layer, origin: str
               ) -> dict[str, tuple[str, str]]:
    """--src and --tgt the model records, where the user gives none (as translate.py takes
    them); a warning where the user gives others: fine-tuning into another pair is allowed."""
    implied, differ = {}, []
    for name, recorded in zip(("src", "tgt"), pair):
        if recorded is None:
            continue
        if name not in asked["data"]:
            implied[name] = (recorded, f"{origin} (its --{name})")
        elif asked["data"][name][0] != recorded:
            differ.append(f"{asked['data'][name][1]} against its {recorded}")
    if differ:
        log.warning("%s was trained for %s; fine-tuning it into another language pair (%s)",
                    origin, "->".join(lang or "?" for lang in pair), "; ".join(differ))
    return implied


def _check_architecture(config: ModelConfig, asked: Layer, origin: str) -> None:
    """SettingsError unless the architecture asked for, the preset named (if any) with the
    model keys given, is `config`'s."""
    preset = asked["model"].get(PRESET_KEY)
    for name in ARCHITECTURE:
        own = getattr(config, name)
        if name in asked["model"]:
            value, where = asked["model"][name]
            if value != own:
                raise SettingsError(
                    f"{where} conflicts with {origin}, whose model has {name} {own!r}: a "
                    f"fine-tuned model keeps the architecture it starts from; drop {where}.")
        elif preset is not None and getattr(PRESETS[preset[0]], name) != own:
            name_of_preset, where = preset
            same = preset_with_architecture(config)
            instead = f"--preset {same} (that model's architecture), or " if same else ""
            raise SettingsError(
                f"{where} conflicts with {origin}, whose model has {name} {own!r} (preset "
                f"{name_of_preset} has {getattr(PRESETS[name_of_preset], name)!r}): a "
                f"fine-tuned model keeps the architecture it starts from; give {instead}drop "
                f"{where} (dropout and dtype have flags of their own).")


def preset_with_architecture(model: ModelConfig) -> str | None:
    """The preset whose architecture is `model`'s, or None."""
    return next((name for name, preset in PRESETS.items()
                 if all(getattr(preset, key) == getattr(model, key) for key in ARCHITECTURE)),
                None)


def _tokenizer_can_hold(vocab_size: int) -> bool:
    """Whether a TokenizerConfig takes `vocab_size` (it refuses sizes below its minimum)."""
    try:
        TokenizerConfig(vocab_size=vocab_size)
    except ValueError:
        return False
    return True


def spm_model_vocabulary(path: str, asked: Layer, layers: Sequence[Layer]) -> Layer:
    """With --spm-model, the run's vocabulary is that model's: a layer setting vocab_size to
    its size. Another size from an earlier layer than the one naming the model (a recipe's,
    under the flag) gives way to it, as --train-file replaces a recipe's train_prefix;
    SettingsError if the file is no usable SentencePiece model or the layer naming it, or a
    later one, asks for another size. The tokenizer type is the model's: another one asked
    for does not apply, and a model without byte fallback turns unseen characters into <unk>
    (a warning says each)."""
    from data.config import DataError
    from data.tokenizer import Tokenizer  # loads SentencePiece: only when a model is given

    try:
        given = Tokenizer.load(path)
    except DataError as err:
        raise SettingsError(f"--spm-model: {err}") from None
    pieces = given.vocab_size
    tokenizer = asked["tokenizer"]
    if "vocab_size" in tokenizer and tokenizer["vocab_size"][0] != pieces:
        value, origin = tokenizer["vocab_size"]
        if _last_setting(layers, "vocab_size") < _last_setting(layers, "spm_model"):
            log.info("--spm-model %s has %d pieces: they replace the vocabulary size %s of %s",
                     path, pieces, value, origin)
        else:
            size = origin if origin.startswith("--vocab-size") else f"{origin}: {value}"
            raise SettingsError(
                f"{size} but --spm-model {path} has {pieces} pieces; drop it or pass "
                f"--vocab-size {pieces}, or train a new tokenizer without --spm-model.")
    own_type = given.model_type
    if "model_type" in tokenizer and tokenizer["model_type"][0] != own_type:
        log.warning("%s does not apply: --spm-model %s is a %s model, and no tokenizer is "
                    "trained", tokenizer["model_type"][1], path, own_type)
    if not given.byte_fallback:
        log.warning("--spm-model %s has no byte fallback: characters it has not seen become "
                    "<unk> (\u2047) in training and translation; train it with "
                    "--byte_fallback=true to avoid that", path)
    layer = _layer("tokenizer", {"vocab_size": pieces}, f"--spm-model {path} (vocab_size)")
    if own_type in TRAINED_TYPES:  # config.yaml records the model's type (word and char: none)
        layer["tokenizer"]["model_type"] = (own_type, f"--spm-model {path} (model_type)")
    return layer


def _last_setting(layers: Sequence[Layer], name: str) -> int:
    """The index of the last of `layers` that sets tokenizer.`name`; -1 for none."""
    return max((i for i, layer in enumerate(layers) if name in layer["tokenizer"]), default=-1)
