"""`gptlite chat`: a conversation with a chat model in the terminal, its answers streaming in."""

import contextlib
import pathlib
import signal
import sys

from gptlite.cli.command import check_model, command, print_piece, writing_backend
from gptlite.cli.flags import add_backend_flags, add_compile_cache_flags, add_sampling_flags, Parser, sampling_config

SUMMARY = "talk with a chat model in the terminal (/help lists its commands; Ctrl-C stops an answer, Ctrl-D leaves)"
# What a user types to leave, as other chat programs have it.
LEAVE = ("/bye", "/quit", "/exit")
# The chat's own commands, each with what it does: the one list that /help prints and that tells a command from a
# message (a line whose first word starts with / and is not here is a mistyped command, not sent to the model).
COMMANDS = {"/help": "lists these commands", "/reset": "starts a new conversation",
            " ".join(LEAVE): "leaves (as does Ctrl-D)"}
PROMPT = "you> "
ANSWER = "model> "


def make_parser(prog):
    parser = Parser(prog=prog, description="Talk with a gptlite chat model (one trained with --task chat, or "
                                           "imported with a chat template).")
    parser.add_argument("model", type=pathlib.Path, nargs="?", default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--system", default=None, metavar="TEXT", help="a system message to open the conversation")
    add_sampling_flags(parser, notes={"max_new_tokens": "the longest answer",
                                      "stop": "besides the chat template's end of turn"})
    add_compile_cache_flags(parser)
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.decode import chat
    from gptlite.errors import InputError
    from gptlite.weights import saving

    sampling = sampling_config(args)
    model = saving.load(args.model)
    conversation = chat.Conversation(model, system=args.system, sampling=sampling)
    print(f"talking with {args.model}: /help lists the commands, Ctrl-C stops an answer, Ctrl-D leaves", flush=True)
    while True:
        try:
            # The prompt written here rather than by input(), which writes it to standard error without a newline:
            # where the command holds back native log lines, that would wait for the line's end.
            print_piece(PROMPT)
            text = input()
        except EOFError:
            print()
            return
        except KeyboardInterrupt:  # at the prompt, Ctrl-C clears the line, as a shell does
            print()
            continue
        if text.strip() in LEAVE:
            return
        if text.strip() == "/reset":
            conversation.reset()
            print("(a new conversation)", flush=True)
            continue
        if text.strip() == "/help":
            print("\n".join(f"  {name}  {what}" for name, what in COMMANDS.items()), flush=True)
            continue
        if is_unknown_command(text):
            print(f"(no command {text.split()[0]}; /help lists the commands)", file=sys.stderr, flush=True)
            continue
        if not text.strip():
            continue
        with interrupts_noted() as interrupts:
            dropped = conversation.dropped
            try:
                answer = conversation.ask(text)
            except InputError as error:  # a message the model cannot read: say so, and ask again
                print(f"({error})", file=sys.stderr, flush=True)
                continue
            print_piece(ANSWER)
            for piece in answer:
                print_piece(piece)
                if interrupts:  # Ctrl-C: the answer stops here, and joins the history as far as it came
                    answer.close()
                    print_piece(" (stopped)")
                    break
            print(flush=True)
            if conversation.dropped > dropped:
                print(f"(the conversation outgrew the model's context: its {conversation.dropped - dropped} "
                      f"oldest messages were left out)", file=sys.stderr, flush=True)


def is_unknown_command(text):
    """Whether a line is a chat command this chat does not have: one word starting with "/" (a message that
    starts with a path, "/usr/bin is ...", has more words and goes to the model)."""
    words = text.split()
    return len(words) == 1 and words[0].startswith("/") and words[0] not in " ".join(COMMANDS).split()


@contextlib.contextmanager
def interrupts_noted():
    """Within, a first Ctrl-C (SIGINT) is noted in the list this gives rather than raised as KeyboardInterrupt;
    a second one raises it, for a user who will not wait.

    An answer stops at its next piece. A KeyboardInterrupt would be raised
    wherever the main thread happens to be, and inside the backend's own
    Python code (a compile, a dispatch) it can leave the backend's locks
    held: the process then hangs or crashes instead of asking again. A
    SIGINT the process was started to ignore, or that another handler
    owns, is left as it is.
    """
    noted = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield noted
        return

    def note(number, frame):
        if noted:
            raise KeyboardInterrupt
        noted.append(number)

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous)


def check(args):
    """What chat refuses before its backend starts: a path that is no model file, and sampling settings out of
    their range."""
    check_model(args)
    sampling_config(args)


main = command("gptlite-chat", make_parser, run, writing_backend, check)
