"""The application around the `transformer` library and the `data` pipeline, grouped by what
it does (each subpackage's docstring says what it holds):

    runtime       process plumbing: one-line errors, atomic files, several processes, caches
    models        a trained model with its tokenizer: the model directory and the Translator
    convert       models to and from transformers' MarianMT and CTranslate2
    engines       other engines behind the Translator's interface: CTranslate2
    settings      a run's settings: RunConfig, recipes and train.py's flags
    rundir        the run directory: checkpoints, resume, the final models, the lock
    translation   translate.py: input and output, evaluation, scoring, attention plots
    distillation  a teacher's translations of a corpus, and vocabulary shortlists
    serving       the HTTP server: LibreTranslate's and OpenNMT-py's APIs
    training      train.py: the loop and what runs in it

Each imports only those above it in this list (tests/test_layering.py holds that).

    from nmt.settings import recipes
    from nmt.training.trainer import train

    summary = train(recipes.load("configs/multi30k_small.yaml"))

Modules import what they need; importing a package loads nothing heavy.
"""
