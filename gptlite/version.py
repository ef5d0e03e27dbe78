"""gptlite's version, written once: the package (`gptlite.__version__`), its wheel (pyproject.toml reads it) and
the run files a run writes (`training.run_config`) take it from here."""

__version__ = "0.1.0"
