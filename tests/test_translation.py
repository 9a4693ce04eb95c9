"""transformer.translation.Translator: text in, text out, around search."""

import pytest
from flax import nnx

from transformer.config import SearchConfig, get_preset
from transformer.model import Transformer
from transformer.translation import (MetricError, Translator, bleu_metric, bleu_tokenizer_for,
                                     evaluate)


class NumberTokenizer:
    """Sentences of integers (the token ids themselves); enough for Translator."""

    def encode(self, sentences):
        return [[int(word) for word in sentence.split()] for sentence in sentences]

    def decode(self, rows):
        return [" ".join(map(str, row)) for row in rows]


def tiny_model(**overrides) -> Transformer:
    model = Transformer(get_preset("tiny", vocab_size=64, **overrides), rngs=nnx.Rngs(0))
    table = model.src_embedding.table.embedding
    table[...] = table[...] * 4.0  # peaked distributions, as a trained model has
    return model


@pytest.mark.parametrize("max_len", [50, 300])
def test_a_source_cut_to_the_model_length_is_never_padded_past_it(max_len):
    # 49 tokens + EOS fall in the default bucket 56, wider than 50 positions; past the last
    # bucket (256) widths round up to a multiple of 64: 320 for 299 + EOS.
    translator = Translator(tiny_model(max_len=max_len),
                            NumberTokenizer(), SearchConfig(beam_size=2, max_len_b=3))
    long_source = " ".join(["7"] * (max_len + 10))
    hypotheses = translator.translate([long_source, "5 6 7"])
    assert len(hypotheses) == 2
    assert translator.truncated == [0]
    assert max(translator.buckets) == max_len


def test_sampling_draws_new_numbers_on_every_call_and_repeats_with_the_seed():
    search = SearchConfig(strategy="sample", max_len_a=0, max_len_b=8)
    sentence = ["5 9 13 17"]

    def four_calls():
        translator = Translator(tiny_model(), NumberTokenizer(), search, seed=3)
        return [translator.translate(sentence)[0] for _ in range(4)]

    first = four_calls()
    assert len(set(first)) > 1, first  # each call (a stdin chunk in translate.py) draws anew
    assert four_calls() == first       # and the seed fixes the whole sequence


def test_top_k_beyond_the_vocabulary_is_refused_with_the_size():
    search = SearchConfig(strategy="sample", top_k=65)
    with pytest.raises(ValueError, match="top_k 65.*64 tokens"):
        Translator(tiny_model(), NumberTokenizer(), search)


# ----------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("language, tokenizer", [
    ("zh", "zh"), ("zh_TW", "zh"), ("ja", "ja-mecab"), ("ja-JP", "ja-mecab"),
    ("ko", "ko-mecab"), ("KO", "ko-mecab"), ("de", "13a"), ("jv", "13a"), (None, "13a")])
def test_bleu_tokenizer_follows_the_target_language(language, tokenizer):
    assert bleu_tokenizer_for(language) == tokenizer


def test_chinese_bleu_is_scored_on_segmented_words_not_whole_sentences():
    # Written without spaces: 13a sees one "word" per sentence, so one wrong character scores
    # 0, where sacreBLEU's zh tokenizer (one token per Chinese character) gives credit.
    hypotheses, references = ["我们今天去公园散步。"], ["我们明天去公园散步。"]
    as_13a = evaluate(hypotheses, references)
    as_zh = evaluate(hypotheses, references, target_language="zh")
    assert "tok:13a" in as_13a.bleu_signature and as_13a.bleu == 0.0
    assert "tok:zh" in as_zh.bleu_signature and 30 < as_zh.bleu < 100
    assert as_zh.chrf == as_13a.chrf  # chrF reads characters either way


def test_bleu_tokenize_overrides_the_language_choice():
    scores = evaluate(["猫がマットの上に座った。"], ["猫はマットの上に座った。"],
                      target_language="ja", bleu_tokenize="char")
    assert "tok:char" in scores.bleu_signature and 50 < scores.bleu < 100


def test_japanese_bleu_is_scored_on_mecab_words_when_installed():
    pytest.importorskip("MeCab", reason="the optional cjk extra: pip install -e '.[cjk]'")
    hypotheses, references = ["猫がマットの上に座った。"], ["猫はマットの上に座った。"]
    scores = evaluate(hypotheses, references, target_language="ja")
    assert "tok:ja-mecab" in scores.bleu_signature and 50 < scores.bleu < 100
    assert evaluate(hypotheses, references).bleu == 0.0  # 13a: one "word" per sentence


def test_japanese_bleu_without_mecab_says_what_to_install(monkeypatch):
    mecab = pytest.importorskip("sacrebleu.tokenizers.tokenizer_ja_mecab")
    monkeypatch.setattr(mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    with pytest.raises(MetricError, match=r"ja-mecab .*target language 'ja'.* pip install "
                                          r"'sacrebleu\[ja\]'.*--bleu-tokenize"):
        evaluate(["猫"], ["猫"], target_language="ja")
    with pytest.raises(MetricError, match="unknown BLEU tokenizer 'mecab'; choose one of.*13a"):
        bleu_metric("ja", "mecab")
