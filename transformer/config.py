"""Model, optimisation and search settings: frozen dataclasses with named presets.

Variants are derived with `dataclasses.replace`, never mutated:

    config = dataclasses.replace(PRESETS["base"], vocab_size=37_000, dropout=0.3)

`validate()` runs in `__post_init__`, so an invalid config cannot exist. Each field is
declared once, with its help text in the field's metadata (`setting`): train.py builds its
flags and its recipe schema from these declarations (`nmt.settings.recipes`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import types
import typing
from typing import Any, Literal, Mapping

from transformer.strategies import plan_search

Norm = Literal["post", "pre"]
Positional = Literal["sinusoidal", "learned"]
Activation = Literal["relu", "swish"]
DType = Literal["float32", "bfloat16"]
Schedule = Literal["noam", "inverse_sqrt", "linear"]
SCHEDULES = ("noam", "inverse_sqrt", "linear")
LengthPenalty = Literal["gnmt", "power"]
BeamRules = Literal["heuristic", "exact", "k-finished", "transformers"]
BEAM_RULES = ("heuristic", "exact", "k-finished", "transformers")
# Stored search settings written before the rules had these names: "fairseq" was exact's.
_FORMER_BEAM_RULES = {"fairseq": "exact"}


def setting(default: Any, help: str, *, flag: str | None = None, derived: str | None = None
            ) -> Any:
    """A dataclass field with what a command line and a recipe need to know about it.

    `help` is the flag's help text; `flag` the command-line name when it is not the field's
    name with dashes (`--warmup` for `warmup_steps`). `derived` marks a value that is not a
    setting but filled in at run time (it says from what: "the tokenizer"); such a field gets
    no flag and is refused in recipes.
    """
    metadata = {"help": help, "flag": flag, "derived": derived}
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed; use a tuple")
    return dataclasses.field(default=default, metadata=metadata)


def check_finite(owner: str, values: Mapping[str, Any]) -> None:
    """ValueError naming the first number of `values` that is NaN or infinite: no setting
    means anything with one (a NaN length penalty scores every hypothesis NaN, and search
    then keeps empty ones), and comparisons such as `value < 0` let NaN through."""
    for name, value in values.items():
        real = isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
        if real and not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}.")


def check_finite_fields(config: Any) -> None:
    """`check_finite` over every field of a config dataclass; each one's `__post_init__`
    calls it first."""
    check_finite(type(config).__name__,
                 {f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


# The plain types a field may declare (besides Literal choices), as error messages name them.
TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def fits_type(kind: type, value: Any) -> bool:
    """Whether `value` is of the plain type `kind`. An int will do for a float (JSON and YAML
    write 0.0 as 0), but a bool is no number, though Python counts it an int (a file's true
    would read as 1), and only a bool is a bool (the string "no" is truthy)."""
    if kind is bool:
        return isinstance(value, bool)
    return isinstance(value, (int, float) if kind is float else kind) and not isinstance(
        value, bool)


@functools.cache
def _declared_types(cls: type) -> dict[str, tuple[type, bool]]:
    """{field: (its type, whether it may be None)} for the fields of `cls` declared int, float,
    bool or str, each optionally `| None`; Literal fields are checked against their choices."""
    hints = typing.get_type_hints(cls)
    declared = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1 and rest[0] in TYPE_NAMES:
            declared[field.name] = (rest[0], len(rest) < len(args))
    return declared


def check_field_types(config: Any) -> None:
    """ValueError naming the first field of a config dataclass whose value is not of the type
    it declares (`fits_type`)."""
    for name, (kind, optional) in _declared_types(type(config)).items():
        value = getattr(config, name)
        if value is None and optional:
            continue
        if not fits_type(kind, value):
            unset = ", or unset" if optional else ""
            raise ValueError(f"{type(config).__name__}.{name} must be {TYPE_NAMES[kind]}"
                             f"{unset}, got {value!r}.")


def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0)


class DictConfig:
    """`to_dict` and `from_dict` for frozen config dataclasses; `from_dict` rejects unknown keys
    (a typo, or a file written by another version) instead of ignoring them, and missing
    `required` ones instead of filling in their defaults."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, values: dict[str, Any], required: tuple[str, ...] = ()):
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown {cls.__name__} fields {unknown}; known fields: "
                             f"{sorted(known)}.")
        missing = [name for name in required if name not in values]
        if missing:
            what = "field {} is" if len(missing) == 1 else "fields {} are"
            raise ValueError(f"{cls.__name__} {what.format(', '.join(missing))} missing: the "
                             "file is damaged or was written by another tool.")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ModelConfig(DictConfig):
    """Hyper-parameters of the encoder-decoder Transformer.

    Defaults are the paper's `base` model (Vaswani et al. 2017, Table 3).
    """

    vocab_size: int = setting(8000, "vocabulary size", derived="the tokenizer")
    d_model: int = setting(512, "model width (the residual stream)")
    num_heads: int = setting(8, "attention heads")
    d_ff: int = setting(2048, "feed-forward width")
    encoder_layers: int = setting(6, "encoder layers")
    decoder_layers: int = setting(6, "decoder layers")
    dropout: float = setting(
        0.1, "dropout on the sum of embeddings and positions and on each sub-layer's output "
             "before the residual add (the paper's P_drop)")
    attention_dropout: float = setting(0.0, "dropout on attention weights (not in the paper)")
    activation_dropout: float = setting(
        0.0, "dropout on the feed-forward layer's hidden activation (not in the paper)")
    activation: Activation = setting(
        "relu", "the feed-forward layer's activation: relu (paper) or swish (SiLU, as Marian's "
                "OPUS-MT models)")
    norm: Norm = setting("post", "post: x = LayerNorm(x + Sublayer(x)) as in the paper; pre: "
                                 "x = x + Sublayer(LayerNorm(x))")
    positional: Positional = setting("sinusoidal", "sinusoidal (paper) or learned positions")
    max_len: int = setting(512, "longest sequence the positional encoding covers")
    share_embeddings: bool = setting(
        True, "one embedding matrix for source, target and the output projection (paper "
              "Sec. 3.4)")
    output_bias: bool = setting(
        False, "a bias on the output logits (MarianMT's final_logits_bias; not in the paper)")
    layer_norm_epsilon: float = setting(1e-6, "LayerNorm epsilon")
    dtype: DType = setting("float32", "compute dtype of the matrix products (parameters always "
                                      "live in float32)")
    activation_dtype: Literal["auto", "float32", "bfloat16"] = setting(
        "auto", "dtype of the activations between products (LayerNorm, softmax, residuals, "
                "caches); auto: float32 on CPU, where XLA computes bfloat16 element-wise work "
                "through float32 anyway, the compute dtype on GPU and TPU")
    attention_impl: Literal["xla", "cudnn"] | None = setting(
        None, "implementation handed to jax.nn.dot_product_attention: unset lets JAX choose "
              "(XLA); cudnn asks for cuDNN's fused kernel on NVIDIA GPUs (bfloat16 only)")
    pad_id: int = setting(0, "padding id", derived="the tokenizer")
    unk_id: int = setting(1, "unknown-piece id", derived="the tokenizer")
    bos_id: int = setting(2, "the decoder's first input: beginning-of-sentence (MarianMT models "
                             "have no BOS and start from their pad id)", derived="the tokenizer")
    eos_id: int = setting(3, "end-of-sentence id", derived="the tokenizer")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def validate(self) -> None:
        check_field_types(self)
        check_finite_fields(self)
        positive = ("vocab_size", "d_model", "num_heads", "d_ff", "encoder_layers",
                    "decoder_layers", "max_len")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}.")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by num_heads "
                f"({self.num_heads}); change one of them, e.g. num_heads="
                f"{_largest_divisor_at_most(self.d_model, self.num_heads)}.")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"ModelConfig.{name} must be in [0, 1), got {value!r}.")
        _check_choice("ModelConfig.norm", self.norm, ("post", "pre"))
        _check_choice("ModelConfig.activation", self.activation, ("relu", "swish"))
        _check_choice("ModelConfig.positional", self.positional, ("sinusoidal", "learned"))
        _check_choice("ModelConfig.dtype", self.dtype, ("float32", "bfloat16"))
        _check_choice("ModelConfig.activation_dtype", self.activation_dtype,
                      ("auto", "float32", "bfloat16"))
        _check_choice("ModelConfig.attention_impl", self.attention_impl, (None, "xla", "cudnn"))
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"ModelConfig.layer_norm_epsilon must be > 0, got "
                             f"{self.layer_norm_epsilon!r}.")
        if self.attention_impl == "cudnn" and "float32" in (self.dtype, self.activation_dtype):
            raise ValueError(
                "ModelConfig.attention_impl='cudnn' needs bfloat16 attention inputs (cuDNN's "
                f"fused kernel has no float32 form), got dtype={self.dtype!r}, activation_dtype="
                f"{self.activation_dtype!r}; use dtype='bfloat16' with activation_dtype "
                "'auto' or 'bfloat16', or attention_impl=None.")
        special = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id,
                   "eos_id": self.eos_id}
        for name, value in special.items():
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"ModelConfig.{name} ({value}) must lie in [0, vocab_size={self.vocab_size}).")
        # BOS may be the pad id (MarianMT's decoder starts from pad): it is never a target.
        distinct = {name: value for name, value in special.items() if name != "bos_id"}
        if (len(set(distinct.values())) != len(distinct)
                or self.bos_id in (self.unk_id, self.eos_id)):
            raise ValueError(f"ModelConfig special token ids must be distinct (bos_id may equal "
                             f"pad_id), got {special}.")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# The ModelConfig fields that define what the parameters compute, besides the vocabulary: a
# model fine-tuned from another (train.py --init-from) keeps that model's.
ARCHITECTURE = ("d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers",
                "activation", "norm", "positional", "max_len", "share_embeddings",
                "output_bias", "layer_norm_epsilon")


# SentencePiece's random generator (subword sampling) takes an unsigned 32-bit seed.
MAX_SEED = 2**32 - 1
FLOAT32_MAX = float.fromhex("0x1.fffffep+127")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(DictConfig):
    """How the parameters are optimised: the learning-rate schedule, Adam, the label-smoothed
    loss, gradient clipping and accumulation, weight decay, and the random seed of
    initialisation and dropout. Defaults follow the paper (Sec. 5.3 and 5.4).

    schedule "noam":         lr(s) = lr_scale * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)
    schedule "inverse_sqrt": lr(s) = peak_lr * min(s / warmup, sqrt(warmup / s))
    schedule "linear":       lr(s) = peak_lr * min(s / warmup, (D - s) / (D - warmup)),
                             D = decay_steps + 1: the line reaches zero just after update
                             decay_steps, the last that learns
    where s = 1, 2, ... is the number of the update being made (the first update uses s = 1).
    """

    schedule: Schedule = setting(
        "noam", "learning-rate schedule: noam (paper), inverse_sqrt, or linear (to zero after "
                "decay_steps)")
    warmup_steps: int = setting(4000, "warm-up steps", flag="--warmup")
    lr_scale: float = setting(1.0, "noam: multiplier of d_model^-0.5 * min(...)")
    peak_lr: float = setting(1e-3, "inverse_sqrt, linear: learning rate after warm-up")
    decay_steps: int | None = setting(
        None, "linear: the last update, after which the learning rate reaches zero (unset: "
              "train.py fits it to --max-steps or --max-minutes)")
    adam_b1: float = setting(0.9, "Adam beta1")
    adam_b2: float = setting(0.98, "Adam beta2")
    adam_eps: float = setting(1e-9, "Adam epsilon")
    label_smoothing: float = setting(0.1, "label smoothing")
    rdrop: float = setting(
        0.0, "R-Drop (Liang et al. 2021): the weight alpha of the symmetric KL divergence "
             "between two dropout passes of each batch, in CE1 + CE2 + alpha * KL (the paper "
             "uses 5 on IWSLT); 0: off. An update then computes its batch twice")
    clip_norm: float | None = setting(
        None, "clip the global gradient norm to this value before Adam (unset: no clipping)")
    accum_steps: int = setting(
        1, "accumulate K micro-batches per update (one update per step)", flag="--accum")
    loss_chunk: int | None = setting(
        None, "make the loss's logits about this many tokens at a time (less memory; 0: the "
              "whole batch at once); unset: 1024 on CPU, where it is also faster, the whole "
              "batch on GPU and TPU")
    weight_decay: float = setting(
        0.0, "decoupled weight decay (AdamW) on matrices only, not on biases or LayerNorm "
             "parameters; 0 = plain Adam as in the paper")
    seed: int = setting(0, "random seed: initialisation, dropout, the order of the training "
                           "pairs and the validation pairs held out of them")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_field_types(self)
        check_finite_fields(self)
        _check_choice("OptimizerConfig.schedule", self.schedule, SCHEDULES)
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise ValueError(f"OptimizerConfig.warmup_steps must be an integer >= 1, "
                             f"got {self.warmup_steps!r}.")
        if self.decay_steps is not None and not (
                isinstance(self.decay_steps, int) and self.decay_steps > self.warmup_steps):
            raise ValueError(f"OptimizerConfig.decay_steps (--decay-steps) must be an integer "
                             f"above warmup_steps ({self.warmup_steps}), or unset, got "
                             f"{self.decay_steps!r}.")
        if not isinstance(self.accum_steps, int) or self.accum_steps < 1:
            raise ValueError(f"OptimizerConfig.accum_steps must be an integer >= 1 (1 = no "
                             f"accumulation), got {self.accum_steps!r}.")
        if self.loss_chunk is not None and not (isinstance(self.loss_chunk, int)
                                                and self.loss_chunk >= 0):
            raise ValueError(f"OptimizerConfig.loss_chunk (--loss-chunk) must be an integer "
                             f">= 0 (0: the whole batch at once), or unset, got "
                             f"{self.loss_chunk!r}.")
        for name in ("lr_scale", "peak_lr", "adam_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"OptimizerConfig.{name} must be > 0, "
                                 f"got {getattr(self, name)!r}.")
        for name in ("lr_scale", "peak_lr"):
            if getattr(self, name) > FLOAT32_MAX:  # the schedule computes the rate in float32
                raise ValueError(f"OptimizerConfig.{name} must be at most {FLOAT32_MAX:.4g}, the "
                                 f"largest float32 (the learning rate is one), got "
                                 f"{getattr(self, name)!r}.")
        for name in ("adam_b1", "adam_b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimizerConfig.{name} must be in [0, 1), "
                                 f"got {getattr(self, name)!r}.")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"OptimizerConfig.label_smoothing must be in [0, 1) (the paper "
                             f"uses 0.1), got {self.label_smoothing!r}.")
        if not self.rdrop >= 0:
            raise ValueError(f"OptimizerConfig.rdrop (--rdrop) must be a number >= 0 (0: off; "
                             f"Liang et al. use 5), got {self.rdrop!r}.")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ValueError(f"OptimizerConfig.clip_norm must be > 0, or None to disable "
                             f"clipping; got {self.clip_norm!r}.")
        if not self.weight_decay >= 0:
            raise ValueError(f"OptimizerConfig.weight_decay must be >= 0, "
                             f"got {self.weight_decay!r}.")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"OptimizerConfig.seed must be an integer from 0 to {MAX_SEED} "
                             f"(2**32 - 1), got {self.seed!r}.")


@dataclasses.dataclass(frozen=True)
class SearchConfig(DictConfig):
    """How translations are searched for.

    The output may have at most `max_len_a * source_length + max_len_b` tokens (EOS
    included), capped by the model's max_len. The default 1.5 x source + 15 holds every
    training pair of Multi30k en-de and of the English-Japanese corpus (their longest target
    is at most 1.5 x its source + 14 and + 15 tokens); the paper's "input length + 50"
    (max_len_a 1, max_len_b 50) gives the same translations there, each step attending over
    more cache slots.
    """

    beam_size: int = setting(4, "beam size", flag="--beam")
    alpha: float = setting(0.6, "length penalty exponent; the paper used 0.6 (with GNMT's "
                                "penalty)")
    length_penalty: LengthPenalty = setting(
        "gnmt", "what a finished hypothesis's log-probability is divided by: gnmt: "
                "((5 + len) / 6) ** alpha (Wu et al. 2016); power: len ** alpha (transformers, "
                "CTranslate2, Marian); len counts EOS")
    beam_rules: BeamRules = setting(
        "heuristic", "when hypotheses finish and search stops: heuristic: an EOS among a "
                     "step's k best candidates finishes, and a sentence stops once k have "
                     "finished and its best live beam, scored at its length so far, does not "
                     "beat the k-th of them (transformers' test); exact: any EOS among the "
                     "2k best finishes, and a sentence stops only when no live beam could beat "
                     "its nbest-th finished one even at the length limit (the beam's best "
                     "hypothesis, 1.3 to 1.8 times the steps); k-finished: an EOS among the "
                     "k best finishes, and a sentence stops once k have finished (fairseq, Marian, "
                     "CTranslate2); transformers: heuristic, but an EOS forced at the limit "
                     "adds 0 (reproduces transformers' generate)")
    max_len_a: float = setting(1.5, "output limit a * source length + b tokens: a")
    max_len_b: int = setting(15, "output limit a * source length + b tokens: b")
    min_len: int = setting(0, "outputs have at least this many tokens, EOS included (EOS is "
                              "forbidden before), unless the length limit is lower")
    nbest: int = setting(1, "hypotheses per sentence, best first (beam search)")
    strategy: Literal["beam", "greedy", "sample"] = setting(
        "beam", "beam, greedy or sample (sampling is for back-translation)")
    temperature: float = setting(1.0, "sampling temperature")
    top_k: int = setting(0, "sample from the K most likely tokens (0 = all)")

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SearchConfig":
        """Stored settings; a former rule name reads as the rule it named."""
        rules = values.get("beam_rules")
        if isinstance(rules, str) and rules in _FORMER_BEAM_RULES:
            values = {**values, "beam_rules": _FORMER_BEAM_RULES[rules]}
        return super().from_dict(values)

    def validate(self) -> None:
        check_field_types(self)
        check_finite_fields(self)
        _check_choice("SearchConfig.strategy", self.strategy, ("beam", "greedy", "sample"))
        _check_choice("SearchConfig.length_penalty", self.length_penalty, ("gnmt", "power"))
        _check_choice("SearchConfig.beam_rules", self.beam_rules, BEAM_RULES)
        if self.beam_size < 1:
            raise ValueError(f"SearchConfig.beam_size must be >= 1, got {self.beam_size}.")
        if self.nbest < 1:
            raise ValueError(f"SearchConfig.nbest must be >= 1, got {self.nbest}.")
        plan_search(self)  # settings that cannot go together
        if self.nbest > self.beam_size:
            raise ValueError(
                f"SearchConfig.nbest ({self.nbest}) must be <= SearchConfig.beam_size "
                f"({self.beam_size}); raise SearchConfig.beam_size to at least {self.nbest} or "
                "lower SearchConfig.nbest.")
        for name in ("max_len_a", "max_len_b", "min_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"SearchConfig.{name} must be >= 0, got {getattr(self, name)}.")
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ValueError("SearchConfig.max_len_b must be >= 1 when SearchConfig.max_len_a "
                             f"is 0, got {self.max_len_b}: no output could be produced.")
        if self.alpha < 0:
            raise ValueError(f"SearchConfig.alpha must be >= 0, got {self.alpha}.")
        if self.temperature <= 0:
            raise ValueError(f"SearchConfig.temperature must be > 0, got {self.temperature}.")
        if self.top_k < 0:
            raise ValueError(f"SearchConfig.top_k must be >= 0 (0 = no limit), got {self.top_k}.")

    def max_output_len(self, source_len: int, model_max_len: int) -> int:
        """Output length limit (EOS included) for a source of `source_len` tokens."""
        limit = int(self.max_len_a * source_len + self.max_len_b)
        return max(1, min(limit, model_max_len))


PRESETS: dict[str, ModelConfig] = {
    # Vaswani et al. 2017, Table 3, "base": 65M parameters with a 37k shared vocabulary.
    "base": ModelConfig(),
    # Table 3, "big": 213M parameters.
    "big": ModelConfig(d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
    # A model that trains in minutes on a CPU.
    "small": ModelConfig(d_model=256, num_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
    # Narrow and deep, with heavy dropout: Wu et al. 2021 ("Good for Misconceived Reasons",
    # ACL), Transformer-tiny on Multi30k: 4+4 layers, d_model 128, FFN 256, 4 heads, dropout
    # 0.3. A quarter of small's products per token.
    "compact": ModelConfig(d_model=128, num_heads=4, d_ff=256, encoder_layers=4,
                           decoder_layers=4, dropout=0.3),
    # Students: `compact`'s width with a deep encoder and a shallow decoder, to train on a
    # teacher's translations (`python -m nmt.distillation`). Decoding runs the decoder once
    # per output token and the encoder once per sentence, so decoder layers are what a
    # translation waits for (Kasai et al., ICLR 2021: 12+1 layers, distilled, match 6+6 at
    # about 2.5x the decoding speed; Bergamot's CPU students are 6+2). Pre-norm: post-norm
    # 6+2 students of this width did not fit their corpus (docs/performance.md, "Students").
    "student-6-2": ModelConfig(d_model=128, num_heads=4, d_ff=256, encoder_layers=6,
                               decoder_layers=2, dropout=0.1, norm="pre"),
    "student-6-1": ModelConfig(d_model=128, num_heads=4, d_ff=256, encoder_layers=6,
                               decoder_layers=1, dropout=0.1, norm="pre"),
    # For tests: odd sizes catch transposed axes.
    "tiny": ModelConfig(vocab_size=64, d_model=24, num_heads=3, d_ff=40, encoder_layers=2,
                        decoder_layers=2, max_len=64),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with `overrides` applied, e.g. get_preset("base", vocab_size=37000)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
    return dataclasses.replace(PRESETS[name], **overrides)
