"""Our model directory <-> a Hugging Face MarianMT directory (transformers' `MarianMTModel`).

MarianMT describes the same network as the paper's Transformer (post-norm, sinusoidal
positions, embeddings scaled by sqrt(d_model), biases on every projection), so a conversion
moves arrays and renames them. Two things differ:

- **The positional table's layout.** Ours interleaves sine and cosine per frequency
  (PE[pos, 2i] = sin, PE[pos, 2i+1] = cos, paper Sec. 3.5); MarianMT puts every sine first
  and every cosine after, at the same frequencies. Coordinate j of MarianMT's residual
  stream is coordinate `residual_permutation(d)[j]` of ours. Permuting, in every weight
  that reads or writes the residual stream, the axis that touches it (embedding columns,
  the inputs of query/key/value and of the first feed-forward layer, the outputs of the
  attention output and second feed-forward layer, LayerNorm scales and biases) gives a
  network that computes the same function: LayerNorm and the residual adds are symmetric in
  the coordinates, and the product E x^T does not depend on their order. Permutations and
  transposes are exact, so a round trip returns the same bits.
- **LayerNorm epsilon.** MarianMT's layers use PyTorch's default 1e-5; ours is a setting
  (1e-6 by default). It is recorded in config.json as `layer_norm_eps` (transformers keeps
  unknown keys and ignores it), so an import restores it; in transformers a model trained
  with 1e-6 computes logits that differ by about 1e-5.

The arrays are numpy, float32. Weights in transformers' `nn.Linear` are [out, in]; ours
(`Dense.kernel`) are [in, out].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nmt.convert.common import ConversionError, load_params, staged_directory, write_json
from nmt.convert.generation import generate_settings
from transformer.config import ModelConfig, SearchConfig

Params = dict[str, Any]  # nnx.to_pure_dict of a Transformer: nested dicts of arrays

# MarianMT's LayerNorm epsilon (torch.nn.LayerNorm's default; not a setting there).
MARIAN_LAYER_NORM_EPS = 1e-5

# Our attention projections and MarianMT's names for them.
_ATTENTION = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "out_proj"}
# Our sub-layers of an encoder / decoder layer and MarianMT's names for them (attention,
# its LayerNorm).
_ENCODER_SUBLAYERS = {"self_attention": ("self_attn", "self_attn_layer_norm")}
_DECODER_SUBLAYERS = {"self_attention": ("self_attn", "self_attn_layer_norm"),
                      "cross_attention": ("encoder_attn", "encoder_attn_layer_norm")}
_NORM_OF = {"self_attention": "self_attention_norm", "cross_attention": "cross_attention_norm"}


def residual_permutation(d_model: int, target: str = "MarianMT") -> np.ndarray:
    """[d_model] int: MarianMT's coordinate j is our coordinate perm[j] (sines, then cosines);
    `target` names the format in the error."""
    if d_model % 2:
        raise ConversionError(f"d_model {d_model} is odd: {target}'s positional table needs an "
                              "even model width.")
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def check_exportable(config: ModelConfig, ctranslate2: bool = False) -> None:
    """Refuse options MarianMT has no form for, naming them (a silently different model
    would be worse than none); `ctranslate2`: the caller's layout is CTranslate2's, which
    also holds pre-norm stacks and a learned position table (added as the sinusoids are)."""
    unsupported = {} if ctranslate2 else {
        "norm": (config.norm, "post", "MarianMT's layers are post-norm"),
        "positional": (config.positional, "sinusoidal", "MarianMT's positions are sinusoidal"),
    }
    for name, (value, needed, why) in unsupported.items():
        if value != needed:
            raise ConversionError(
                f"model option {name}={value!r} cannot be exported to MarianMT: {why} (only "
                f"{name}={needed!r} converts exactly); to-ctranslate2 converts such a model.")
    residual_permutation(config.d_model, "CTranslate2" if ctranslate2 else "MarianMT")


# ----------------------------------------------------------------------------- ours -> MarianMT


def to_marian_state(params: Params, config: ModelConfig, ctranslate2: bool = False
                    ) -> dict[str, np.ndarray]:
    """Our parameters -> MarianMTModel's state dict (names as `save_pretrained` writes them).

    Tied matrices appear once, as transformers saves them: with shared embeddings only
    `model.shared.weight` (the encoder's, decoder's and output's table); otherwise the
    encoder's, the decoder's and `lm_head.weight` apart. With `ctranslate2` (the layout
    `nmt.convert.ctranslate2` reads), a pre-norm model is written too, its stacks' final
    LayerNorms as `model.{encoder,decoder}.layer_norm` (mBART's names), and a learned position
    table as `embed_positions` (MarianMTModel itself cannot load either).
    """
    check_exportable(config, ctranslate2)
    writer = _MarianWriter(residual_permutation(config.d_model))
    for side, sublayers in (("encoder", _ENCODER_SUBLAYERS), ("decoder", _DECODER_SUBLAYERS)):
        layers = params[f"{side}_layers"]
        for i in range(len(layers)):
            writer.layer(f"model.{side}.layers.{i}", layers[i], sublayers)
        if config.norm == "pre":
            writer.norm(f"model.{side}.layer_norm", {"norm": params[f"{side}_norm"]})
    writer.tables(params, config)
    positions = (writer.permuted(params["positional"]["table"]) if config.positional == "learned"
                 else marian_positions(config.max_len, config.d_model))
    for side in ("encoder", "decoder"):  # one table for both, as in our model
        writer.put(f"model.{side}.embed_positions.weight", positions)
    return writer.out


class _MarianWriter:
    """Collects MarianMT's tensors from ours, with the model dimension permuted into
    MarianMT's order wherever a matrix reads or writes the residual stream."""

    def __init__(self, perm: np.ndarray):
        self.perm = perm
        self.out: dict[str, np.ndarray] = {}

    def put(self, name: str, value: Any) -> None:
        self.out[name] = np.ascontiguousarray(np.asarray(value, np.float32))

    def reads(self, kernel) -> np.ndarray:
        """[d_model, n] reading the residual stream -> [n, d_model]."""
        return np.asarray(kernel)[self.perm, :].T

    def writes(self, kernel) -> np.ndarray:
        """[n, d_model] writing the residual stream -> [d_model, n]."""
        return np.asarray(kernel)[:, self.perm].T

    def permuted(self, vector) -> np.ndarray:
        return np.asarray(vector)[..., self.perm]

    def attention(self, prefix: str, ours: Params) -> None:
        for name, theirs in _ATTENTION.items():
            layer = ours[name]
            if name == "output":
                self.put(f"{prefix}.{theirs}.weight", self.writes(layer["kernel"]))
                self.put(f"{prefix}.{theirs}.bias", self.permuted(layer["bias"]))
            else:
                self.put(f"{prefix}.{theirs}.weight", self.reads(layer["kernel"]))
                self.put(f"{prefix}.{theirs}.bias", layer["bias"])

    def norm(self, prefix: str, ours: Params) -> None:
        self.put(f"{prefix}.weight", self.permuted(ours["norm"]["scale"]))
        self.put(f"{prefix}.bias", self.permuted(ours["norm"]["bias"]))

    def layer(self, prefix: str, ours: Params, sublayers) -> None:
        """One encoder or decoder layer: its attention sublayers, then the feed-forward."""
        for name, (attn, attn_norm) in sublayers.items():
            self.attention(f"{prefix}.{attn}", ours[name])
            self.norm(f"{prefix}.{attn_norm}", ours[_NORM_OF[name]])
        inner, outer = ours["feed_forward"]["inner"], ours["feed_forward"]["outer"]
        self.put(f"{prefix}.fc1.weight", self.reads(inner["kernel"]))
        self.put(f"{prefix}.fc1.bias", inner["bias"])
        self.put(f"{prefix}.fc2.weight", self.writes(outer["kernel"]))
        self.put(f"{prefix}.fc2.bias", self.permuted(outer["bias"]))
        self.norm(f"{prefix}.final_layer_norm", ours["feed_forward_norm"])

    def tables(self, params: Params, config: ModelConfig) -> None:
        """The embedding tables, the output projection unless tied, and the logits' bias."""
        source_table = self.permuted(params["src_embedding"]["table"]["embedding"])
        if config.share_embeddings:
            self.put("model.shared.weight", source_table)
        else:
            self.put("model.encoder.embed_tokens.weight", source_table)
            self.put("model.decoder.embed_tokens.weight",
                     self.permuted(params["tgt_embedding"]["table"]["embedding"]))
            self.put("lm_head.weight", self.reads(params["output_projection"]["kernel"]))
        bias = (np.asarray(params["output_bias"]) if config.output_bias
                else np.zeros(config.vocab_size, np.float32))
        self.put("final_logits_bias", bias[None, :])


def marian_shapes(config: ModelConfig) -> dict[str, tuple[str | int, ...]]:
    """The tensors `to_marian_state` writes for `config`, each with its shape spelled as the
    ModelConfig fields that give it (fc1.weight: ("d_ff", "d_model")): what an import checks
    a checkpoint against before reading it."""
    d, ff, vocab = "d_model", "d_ff", "vocab_size"
    tables = (["model.shared.weight"] if config.share_embeddings else
              ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
               "lm_head.weight"])
    shapes: dict[str, tuple[str | int, ...]] = {name: (vocab, d) for name in tables}
    shapes["final_logits_bias"] = (1, vocab)
    for side, sublayers in (("encoder", _ENCODER_SUBLAYERS), ("decoder", _DECODER_SUBLAYERS)):
        shapes[f"model.{side}.embed_positions.weight"] = ("max_len", d)
        for i in range(getattr(config, f"{side}_layers")):
            prefix = f"model.{side}.layers.{i}"
            for attn, attn_norm in sublayers.values():
                for projection in _ATTENTION.values():
                    shapes[f"{prefix}.{attn}.{projection}.weight"] = (d, d)
                    shapes[f"{prefix}.{attn}.{projection}.bias"] = (d,)
                shapes.update({f"{prefix}.{attn_norm}.{p}": (d,) for p in ("weight", "bias")})
            shapes.update({f"{prefix}.fc1.weight": (ff, d), f"{prefix}.fc1.bias": (ff,),
                           f"{prefix}.fc2.weight": (d, ff), f"{prefix}.fc2.bias": (d,),
                           f"{prefix}.final_layer_norm.weight": (d,),
                           f"{prefix}.final_layer_norm.bias": (d,)})
    return shapes


def marian_positions(max_len: int, d_model: int) -> np.ndarray:
    """[max_len, d_model] MarianMT's sinusoidal table: sin(pos * w_i) in the first half,
    cos(pos * w_i) in the second, w_i = 10000^(-2i / d_model); our table's columns in
    `residual_permutation` order."""
    from transformer.layers import sinusoidal_positions
    return sinusoidal_positions(max_len, d_model)[:, residual_permutation(d_model)]


# ----------------------------------------------------------------------------- MarianMT -> ours


def from_marian_state(state: dict[str, np.ndarray], config: ModelConfig) -> Params:
    """MarianMTModel's state dict -> our parameters (the inverse of `to_marian_state`).

    Accepts what `save_pretrained` writes with tied tables once (`model.shared.weight`) or
    spelled out under each name.
    """
    reader = _MarianReader(state, np.argsort(residual_permutation(config.d_model)))
    params: Params = {
        "encoder_layers": {i: reader.layer(f"model.encoder.layers.{i}", _ENCODER_SUBLAYERS)
                           for i in range(config.encoder_layers)},
        "decoder_layers": {i: reader.layer(f"model.decoder.layers.{i}", _DECODER_SUBLAYERS)
                           for i in range(config.decoder_layers)},
        **reader.tables(config),
    }
    if config.output_bias:
        params["output_bias"] = reader.get("final_logits_bias").reshape(-1)
    return params


class _MarianReader:
    """Reads our parameters out of MarianMT's tensors, undoing the permutation of the model
    dimension that `_MarianWriter` applies."""

    def __init__(self, state: dict[str, np.ndarray], inverse: np.ndarray):
        self.state = state
        self.inverse = inverse

    def get(self, name: str) -> np.ndarray:
        if name not in self.state:
            raise ConversionError(f"the weights have no {name!r}, which a MarianMT model "
                                  f"with this config.json has.")
        return np.asarray(self.state[name], np.float32)

    def reads(self, name: str) -> np.ndarray:
        """[n, d_model] -> kernel [d_model, n]."""
        return np.ascontiguousarray(self.get(name).T[self.inverse, :])

    def writes(self, name: str) -> np.ndarray:
        """[d_model, n] -> kernel [n, d_model]."""
        return np.ascontiguousarray(self.get(name).T[:, self.inverse])

    def unpermuted(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.get(name)[..., self.inverse])

    def attention(self, prefix: str) -> Params:
        ours = {}
        for name, theirs in _ATTENTION.items():
            if name == "output":
                ours[name] = {"kernel": self.writes(f"{prefix}.{theirs}.weight"),
                              "bias": self.unpermuted(f"{prefix}.{theirs}.bias")}
            else:
                ours[name] = {"kernel": self.reads(f"{prefix}.{theirs}.weight"),
                              "bias": self.get(f"{prefix}.{theirs}.bias")}
        return ours

    def norm(self, prefix: str) -> Params:
        return {"norm": {"scale": self.unpermuted(f"{prefix}.weight"),
                         "bias": self.unpermuted(f"{prefix}.bias")}}

    def layer(self, prefix: str, sublayers) -> Params:
        """One encoder or decoder layer: its attention sublayers, then the feed-forward."""
        ours: Params = {}
        for name, (attn, attn_norm) in sublayers.items():
            ours[name] = self.attention(f"{prefix}.{attn}")
            ours[_NORM_OF[name]] = self.norm(f"{prefix}.{attn_norm}")
        ours["feed_forward"] = {
            "inner": {"kernel": self.reads(f"{prefix}.fc1.weight"),
                      "bias": self.get(f"{prefix}.fc1.bias")},
            "outer": {"kernel": self.writes(f"{prefix}.fc2.weight"),
                      "bias": self.unpermuted(f"{prefix}.fc2.bias")}}
        ours["feed_forward_norm"] = self.norm(f"{prefix}.final_layer_norm")
        return ours

    def tables(self, config: ModelConfig) -> Params:
        """The embedding tables and, unless tied, the output projection."""
        shared, source = "model.shared.weight", "model.encoder.embed_tokens.weight"
        if config.share_embeddings:
            table = self.unpermuted(shared if shared in self.state else source)
            return {"src_embedding": {"table": {"embedding": table}}}
        # A checkpoint whose output layer is tied to the decoder's table may leave it out.
        output = ("lm_head.weight" if "lm_head.weight" in self.state
                  else "model.decoder.embed_tokens.weight")
        return {"src_embedding": {"table": {"embedding": self.unpermuted(source)}},
                "tgt_embedding": {"table": {"embedding": self.unpermuted(
                    "model.decoder.embed_tokens.weight")}},
                "output_projection": {"kernel": self.reads(output)}}


# ----------------------------------------------------------------------------- directories


def marian_config(config: ModelConfig) -> dict[str, Any]:
    """config.json of a MarianMTModel with our model's dimensions and ids."""
    check_exportable(config)
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": config.vocab_size,
        "decoder_vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": config.activation,
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "activation_dropout": config.activation_dropout,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "max_position_embeddings": config.max_len,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": config.share_embeddings,
        "init_std": 0.02,
        "is_encoder_decoder": True,
        "use_cache": True,
        "pad_token_id": config.pad_id,
        "eos_token_id": config.eos_id,
        "bos_token_id": config.bos_id,
        "decoder_start_token_id": config.bos_id,
        "forced_eos_token_id": config.eos_id,
        "dtype": "float32",
        # Not read by transformers (which uses 1e-5); an import restores the model's own.
        "layer_norm_eps": config.layer_norm_epsilon,
    }


# generation_config.json's field holding our search settings whole, which `generate` ignores
# and an import reads back, so that a model goes through MarianMT and back searching as before.
SEARCH_FIELD = "nmt_search"


def generation_config(config: ModelConfig, search: SearchConfig) -> dict[str, Any]:
    """generation_config.json: our search defaults as far as `generate` has them
    (`nmt.convert.generation`: greedy as num_beams 1, sampling as do_sample, min_len, nbest,
    the output limit as max_length), and whole under `SEARCH_FIELD`. PAD and BOS are never
    generated (as in our search); `length_penalty` divides the log-probability by
    length ** alpha, not by GNMT's ((5 + length) / 6) ** alpha."""
    return {
        "decoder_start_token_id": config.bos_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        "forced_eos_token_id": config.eos_id,
        "pad_token_id": config.pad_id,
        "bad_words_ids": [[config.pad_id], [config.bos_id]],
        **generate_settings(search, config.max_len),
        SEARCH_FIELD: search.to_dict(),
    }


def tokenizer_files(tokenizer, config: ModelConfig, languages: dict[str, str]
                    ) -> dict[str, bytes | dict[str, Any]]:
    """MarianTokenizer's files: source.spm and target.spm (our joint SentencePiece model
    twice, or an imported model's own two), vocab.json mapping every piece to our id, and the
    config."""
    pieces = tokenizer.vocabulary()
    vocab = {piece: i for i, piece in enumerate(pieces)}
    if len(vocab) != tokenizer.vocab_size:
        raise ConversionError("the SentencePiece model has repeated pieces; MarianTokenizer's "
                              "vocab.json cannot map them.")
    names = {"pad_token": config.pad_id, "unk_token": config.unk_id, "eos_token": config.eos_id}
    special = {name: pieces[i] for name, i in names.items()}
    source, target = tokenizer.sentencepiece_models()
    return {
        "source.spm": source,
        "target.spm": target,
        "vocab.json": vocab,
        "tokenizer_config.json": {
            "tokenizer_class": "MarianTokenizer",
            "source_lang": languages.get("source_lang"),
            "target_lang": languages.get("target_lang"),
            "separate_vocabs": False,
            "model_max_length": config.max_len,
            **special,
        },
        "special_tokens_map.json": special,
    }


def export_marian(model_path: str | Path, out_dir: str | Path) -> Path:
    """Write a run's model directory (or a model directory) as a MarianMTModel directory that
    `MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load.

    Raises ConversionError for a model MarianMT cannot express (pre-norm, learned positions)
    or an unusable output directory; writes everything or nothing.
    """
    from safetensors.numpy import save

    params, tokenizer, values = load_params(model_path)
    config = values["model"]
    state = to_marian_state(params, config)
    languages = {k: values[k] for k in ("source_lang", "target_lang") if k in values}
    with staged_directory(out_dir) as tmp:
        # Serialized here and written as the other files are: safetensors' save_file writes
        # through a private temporary file (mode 0600), and its errors are not OSErrors.
        (tmp / "model.safetensors").write_bytes(save(state, metadata={"format": "pt"}))
        write_json(tmp / "config.json", marian_config(config))
        write_json(tmp / "generation_config.json", generation_config(config, values["search"]))
        for name, content in tokenizer_files(tokenizer, config, languages).items():
            if isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                write_json(tmp / name, content)
    return Path(out_dir)
