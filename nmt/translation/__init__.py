"""Translating as translate.py does it: the command line (`command`), reading input and
writing translations (`streams`), test sets, evaluation and force-decoding scores
(`evaluation`, with sacreBLEU in `scoring`), attention heatmaps (`plotting`), text and HTML
cut into sentences and joined back around their translations (`paragraphs`)."""
