"""A training run's settings: `RunConfig` and the loop's `TrainerConfig` (`config`), recipes
and train.py's flags derived from the dataclass fields (`recipes`, train.py's defaults in
`defaults.yaml`), and the settings implied by files they name (`derived`: --init-from,
--spm-model). Imports no JAX."""
