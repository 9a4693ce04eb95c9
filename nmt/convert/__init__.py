"""Models in other toolkits' formats: transformers' MarianMT and CTranslate2.

    python -m nmt.convert to-marian runs/NAME/averaged exported/marian
    python -m nmt.convert to-ctranslate2 runs/NAME/averaged exported/ct2 --quantization int8

Needs the export extra (`pip install -e '.[export]'`).
"""
