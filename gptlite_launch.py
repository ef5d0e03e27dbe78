"""Entry points of gptlite's commands: they choose the Keras backend before anything imports Keras.

Keras fixes its backend when it is first imported, and importing the gptlite
package imports Keras. So this module, outside the package and importing
neither, reads `--backend` from the arguments, puts it in KERAS_BACKEND, and
only then imports `gptlite.cli` to run the command (whose parser checks
every argument again, `--backend` included).
"""

import argparse
import importlib.util
import os
import sys

BACKENDS = ("tensorflow", "jax", "torch")


def choose_backend(prog, argv):
    """Put `--backend NAME` from argv into KERAS_BACKEND; exit with a one-line error if NAME is not installed."""
    reader = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    reader.add_argument("--backend")
    try:
        known, _ = reader.parse_known_args(argv)
    except argparse.ArgumentError:
        return  # `--backend` with no name: the command's own parser says so
    if known.backend not in BACKENDS:
        return  # none given, or a wrong name, which the command's own parser reports
    if importlib.util.find_spec(known.backend) is None:
        extra = "" if known.backend == "tensorflow" else f"[{known.backend}]"
        sys.exit(f"{prog}: error: --backend {known.backend} needs {known.backend} installed "
                 f"(pip install \"gptlite{extra}\", or pip install -e \".{extra}\" in a checkout)")
    os.environ["KERAS_BACKEND"] = known.backend


def _command(prog, name):
    def run(argv=None):
        argv = sys.argv[1:] if argv is None else list(argv)
        choose_backend(prog, argv)
        from gptlite import cli

        return getattr(cli, name)(argv)

    return run


train = _command("gptlite-train", "train_main")
generate = _command("gptlite-generate", "generate_main")
export = _command("gptlite-export", "export_main")
inspect = _command("gptlite-inspect", "inspect_main")


def main(argv=None):
    """`gptlite train|generate|export|inspect ...`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    choose_backend("gptlite", argv)
    from gptlite import cli

    return cli.main(argv)
