"""Model and search configuration: frozen dataclasses with named presets.

Variants are derived with `dataclasses.replace`, never mutated:

    config = dataclasses.replace(PRESETS["base"], vocab_size=37_000, dropout=0.3)

`validate()` runs in `__post_init__`, so an invalid config cannot exist.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

Norm = Literal["post", "pre"]
Positional = Literal["sinusoidal", "learned"]
DType = Literal["float32", "bfloat16"]


def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0)


class DictConfig:
    """`to_dict` and `from_dict` for frozen config dataclasses; `from_dict` rejects unknown keys
    (a typo in a recipe or an old run's config.json) instead of ignoring them."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown {cls.__name__} fields {unknown}; known fields: "
                             f"{sorted(known)}.")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ModelConfig(DictConfig):
    """Hyper-parameters of the encoder-decoder Transformer.

    Defaults are the paper's `base` model (Vaswani et al. 2017, Table 3).
    """

    vocab_size: int = 8000
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    # Dropout on the sum of embeddings and positions and on each sub-layer's output before
    # the residual add (the paper's P_drop).
    dropout: float = 0.1
    # Dropout on attention probabilities and on the FFN's hidden activation (not in the paper).
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    # "post": x = LayerNorm(x + Sublayer(x)) as in the paper; "pre": x = x + Sublayer(LayerNorm(x)).
    norm: Norm = "post"
    positional: Positional = "sinusoidal"
    max_len: int = 512  # longest sequence the positional encoding covers
    # One embedding matrix for source, target and the output projection (paper Sec. 3.4).
    share_embeddings: bool = True
    layer_norm_epsilon: float = 1e-6
    # Compute dtype of the matrix products; parameters always live in float32.
    dtype: DType = "float32"
    # dtype of the activations between products (LayerNorm, softmax, residuals, caches).
    # "auto": float32 on CPU, where XLA computes bfloat16 element-wise work through float32
    # anyway and its bfloat16 reductions round every partial sum (slower and less exact);
    # `dtype` on GPU and TPU, where halving the memory traffic pays.
    activation_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Implementation handed to jax.nn.dot_product_attention: None lets JAX choose (XLA);
    # "cudnn" asks for cuDNN's fused kernel on NVIDIA GPUs (bfloat16/float16 only).
    attention_impl: Literal["xla", "cudnn"] | None = None
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def validate(self) -> None:
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
        _check_choice("norm", self.norm, ("post", "pre"))
        _check_choice("positional", self.positional, ("sinusoidal", "learned"))
        _check_choice("dtype", self.dtype, ("float32", "bfloat16"))
        _check_choice("activation_dtype", self.activation_dtype, ("auto", "float32", "bfloat16"))
        _check_choice("attention_impl", self.attention_impl, (None, "xla", "cudnn"))
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
        if len(set(special.values())) != len(special):
            raise ValueError(f"ModelConfig special token ids must be distinct, got {special}.")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """How translations are searched for.

    The output may have at most `max_len_a * source_length + max_len_b` tokens (EOS
    included), the paper's "input length + 50" by default, capped by the model's max_len.
    """

    beam_size: int = 4
    # GNMT length penalty ((5 + len) / 6) ** alpha (Wu et al. 2016); the paper used 0.6.
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    # Outputs have at least this many tokens, EOS included (EOS is forbidden before), unless
    # the length limit is lower.
    min_len: int = 0
    nbest: int = 1
    # Sampling (used for back-translation): temperature > 0 and/or top_k > 0 with
    # strategy="sample"; ignored by greedy and beam search.
    strategy: Literal["beam", "greedy", "sample"] = "beam"
    temperature: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check_choice("strategy", self.strategy, ("beam", "greedy", "sample"))
        if self.beam_size < 1:
            raise ValueError(f"SearchConfig.beam_size must be >= 1, got {self.beam_size}.")
        if self.nbest < 1:
            raise ValueError(f"SearchConfig.nbest must be >= 1, got {self.nbest}.")
        if self.nbest > 1 and self.strategy != "beam":
            raise ValueError(
                f"SearchConfig.nbest ({self.nbest}) needs beam search; strategy "
                f"{self.strategy!r} gives one hypothesis per sentence. Use strategy='beam' "
                "or nbest=1.")
        if self.nbest > self.beam_size:
            raise ValueError(
                f"SearchConfig.nbest ({self.nbest}) must be <= beam_size ({self.beam_size}); "
                f"raise beam_size to at least {self.nbest} or lower nbest.")
        if self.max_len_a < 0 or self.max_len_b < 0 or self.min_len < 0:
            raise ValueError(
                "SearchConfig lengths must be non-negative, got "
                f"max_len_a={self.max_len_a}, max_len_b={self.max_len_b}, min_len={self.min_len}.")
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise ValueError("SearchConfig.max_len_a and max_len_b are both 0: no output could "
                             "be produced; set max_len_b >= 1.")
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
    # For tests: odd sizes catch transposed axes.
    "tiny": ModelConfig(vocab_size=64, d_model=24, num_heads=3, d_ff=40, encoder_layers=2,
                        decoder_layers=2, max_len=64),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset with `overrides` applied, e.g. get_preset("base", vocab_size=37000)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
    return dataclasses.replace(PRESETS[name], **overrides)
