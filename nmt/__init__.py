"""The application around the `transformer` library: training runs, their checkpoints and
logs, evaluation with sacreBLEU, recipes and command lines.

    from nmt.trainer import train
    from nmt import recipes

    summary = train(recipes.load("configs/multi30k_small.yaml"))

Modules import what they need; importing this package loads nothing heavy.
"""
