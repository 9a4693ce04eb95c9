"""The translation server: `python -m nmt.serving --model runs/NAME` (docs/serving.md)."""
