"""Training: the settings and presets, `model.fit` with evaluations and checkpoints, and a whole run."""
