"""A trained model with its tokenizer: the model directory on disk (`model_dir`: export,
load, ensembles of several) and the `Translator` that turns sentences into translations with
it (`translator`). Needs no training dependency (orbax, sacreBLEU, TensorBoard)."""
