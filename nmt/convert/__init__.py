"""Models in other toolkits' formats: to transformers' MarianMT and CTranslate2, and from
MarianMT (OPUS-MT checkpoints).

    python -m nmt.convert to-marian runs/NAME/averaged exported/marian
    python -m nmt.convert to-ctranslate2 runs/NAME/averaged exported/ct2 --quantization int8
    python -m nmt.convert from-marian opus-mt-en-de models/opus-mt-en-de

Needs the export extra (`pip install -e '.[export]'`).
"""
