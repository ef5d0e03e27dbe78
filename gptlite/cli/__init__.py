"""The command line: `gptlite COMMAND` and each command on its own (`gptlite-train`, `train.py`, ...).

One module per command (`train`, `generate`, `chat`, `eval`, `export`,
`inspect`, `serve`), each with its parser (`make_parser`), its work (`run`: a few
library calls) and its one-line `SUMMARY`; the parts they share live once:
`startup` (the backend, Keras without its native notices), `flags` (the
parser, shared flags, library settings written as flags) and `command`
(parse, run, map errors to exit statuses). A command's module imports the
library inside its functions, so that `--backend` takes effect before Keras
is imported and `--help` never waits for it.
"""

import sys

from gptlite.cli import eval as eval_command
from gptlite.cli import chat, export, generate, inspect, serve, train

COMMANDS = {"train": train, "generate": generate, "chat": chat, "eval": eval_command, "export": export,
            "inspect": inspect, "serve": serve}
train_main = train.main
generate_main = generate.main
chat_main = chat.main
eval_main = eval_command.main
export_main = export.main
inspect_main = inspect.main
serve_main = serve.main


def usage():
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: gptlite COMMAND [options]   (gptlite COMMAND --help for a command's options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {module.SUMMARY}" for name, module in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    """`gptlite COMMAND ...`: each command under one name."""
    whole_process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if not argv:
        print(usage(), file=sys.stderr)
        return 2
    if argv[0] not in COMMANDS:
        print(f"gptlite: error: unknown command {argv[0]!r}; the commands are {', '.join(COMMANDS)} "
              f"(see gptlite --help)", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]].main(argv[1:], whole_process=whole_process)
