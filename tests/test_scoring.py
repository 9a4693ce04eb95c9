"""nmt.translation.scoring: BLEU and chrF as the sacrebleu command computes them, tokenized
for the target language."""

import pytest

from nmt.translation.scoring import (
    MetricError,
    bleu_metric,
    bleu_settings,
    bleu_tokenizer_for,
    evaluate,
)


@pytest.mark.parametrize("language, tokenizer", [
    ("zh", "zh"), ("zh_TW", "zh"), ("ja", "ja-mecab"), ("ja-JP", "ja-mecab"),
    ("ko", "ko-mecab"), ("KO", "ko-mecab"), ("de", "13a"), ("jv", "13a"), (None, "13a"),
    # Three-letter codes, as FLORES and NLLB write them: 13a would score a Japanese sentence
    # as one "word".
    ("jpn", "ja-mecab"), ("jpn_Jpan", "ja-mecab"), ("zho", "zh"), ("cmn", "zh"),
    ("kor", "ko-mecab"), ("deu", "13a")])
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
                                          r"'sacrebleu\[ja\]'.*--bleu-tokenize char"):
        evaluate(["猫"], ["猫"], target_language="ja")
    with pytest.raises(MetricError, match="unknown BLEU tokenizer 'mecab'; choose one of.*13a"):
        bleu_metric("ja", "mecab")
    with pytest.raises(MetricError, match=r"^--bleu-tokenize: BLEU tokenizer ja-mecab needs "
                                          r"MeCab: pip install 'sacrebleu\[ja\]'") as given:
        bleu_settings("en", "ja-mecab")
    assert "bleu_tokenize" not in str(given.value)
