"""How a chat run from scratch that names no preset is sized from its conversations: its tokenizer
(`chat_tokenizer`), its context, steps and batches (`chat_settings`), laid over the `CHAT_PRESET` preset's.

Nothing here imports Keras: it is plain arithmetic on the conversations' lengths.
"""

import math

from gptlite.data.packing import pack_lengths
from gptlite.errors import ConfigError

# The preset whose model a chat run from scratch trains, with the settings sized below laid over it.
CHAT_PRESET = "modern"
# A chat run from scratch that names no preset is sized from its conversations (`chat_settings`): the modern
# preset's model (trained as the cpu preset, the arithmetic task answered 3% of held-out questions exactly after
# 1,500 steps, against 91%; benchmarks/journal.md) with small batches, trained by Muon (CHAT_OPTIMIZER); the
# shortest of CHAT_CONTEXTS that holds CHAT_COVERED of the conversations whole; CHAT_EPOCHS passes over the packed
# rows, at least CHAT_MIN_STEPS steps and at most CHAT_MAX_TOKENS tokens at a context of 128 (fewer above it and
# the same steps below it: see chat_token_cost), evaluated and saved about CHAT_EVALUATIONS times, the validation
# loss over CHAT_VALIDATION_ROWS rows (as many as 20 batches of 32 gave).
# Muon, since it learned each task of the family in half AdamW's steps or fewer (the direct task, whose jump moves
# with the seed, by the median: 90% of held-out questions by step 2,400, 3,000, 3,600, 4,200, 5,400 and 3,000 over
# six seeds, where AdamW took 9,000, 11,000, 11,000, 6,000, 9,600 and 7,000); so the cap is half AdamW's 12,000 steps: 14.0 minutes launch to exit on 2
# cores of machine D (an Intel Xeon whose chat steps are slower than the Zen 2's), some 11 to 12 by the steps' speed
# on an AMD Zen 2 (machine H, where AdamW's 12,000 steps took 21; benchmarks/journal.md, "Chat by Muon in half the
# steps").
# Small batches, since the same tokens in more steps learn the tasks sooner: with batches of 32, three seeds
# answered 98%, 80% and 65% of the direct task's held-out questions exactly; with batches of 8 and the same
# tokens, 100%, 90% and 93% (benchmarks/journal.md, "Chat tasks with batches of 8"). Contexts between 128 and 256,
# since a file whose longest conversations were a little over 128 tokens went to 256, where its cap in tokens
# took 20 minutes, not 12 (benchmarks/journal.md, "A file of another shape").
CHAT_BATCH_SIZE = 8
CHAT_OPTIMIZER = "muon"
CHAT_CONTEXTS = (64, 128, 160, 192, 256)
CHAT_COVERED = 0.99
CHAT_EPOCHS = 20
CHAT_MIN_STEPS = 1000
CHAT_MAX_TOKENS = 1500 * 32 * 128
# A token's training time at a context of 256 over one at 128 (the attention grows with the context, the rest
# does not): 1.58 on machine B (benchmarks/journal.md, "A file of another shape"); taken as linear in between.
CHAT_COST_AT_256 = 1.58
CHAT_EVALUATIONS = 10
CHAT_VALIDATION_ROWS = 640
# How a chat run from scratch that names no tokenizer reads its conversations: as byte-level BPE tokens, each digit
# a token of its own, where at least CHAT_BPE_SHARE of the words its answers write are words that CHAT_REPEATED
# conversations or more hold, so that a word is a token it learns from many examples; as characters where they spell
# out strings the file rarely repeats (made-up words to copy or reverse, which BPE would cut into pieces learned
# from other strings), or hold no words (numbers alone read as short in characters). A file of arithmetic questions
# answered in a sentence: 77% of its held-out questions right in characters, 100% in BPE tokens in fewer steps
# (benchmarks/journal.md, "Chat in words and digits").
CHAT_REPEATED = 10
CHAT_BPE_SHARE = 0.8

def chat_tokenizer(repeated):
    """The tokenizer of a chat run from scratch ("bpe" or "char") whose answers' words are `repeated` (the share
    that CHAT_REPEATED conversations or more hold; None where the answers hold no words), and why, in a few words."""
    if repeated is None:
        return "char", "characters, since the answers hold no words"
    if repeated >= CHAT_BPE_SHARE:
        return "bpe", (f"byte-level BPE tokens with each digit apart, since {repeated:.0%} of the answers' words are "
                       f"in {CHAT_REPEATED} conversations or more")
    return "char", f"characters, since {1 - repeated:.0%} of the answers' words are in fewer than {CHAT_REPEATED} " \
                   f"conversations"


def chat_settings(lengths, reading=None):
    """The settings a chat run from scratch starts from, laid over the CHAT_PRESET preset's, sized from its
    conversations' `lengths` in tokens, and a line that says what was chosen and why (see CHAT_BATCH_SIZE and the
    constants beside it), with `reading` (how the conversations are read, `chat_tokenizer`'s words) where given."""
    lengths = sorted(int(length) for length in lengths)
    if not lengths:
        raise ConfigError("there are no conversations to size a chat run from")
    covered = lengths[max(0, math.ceil(CHAT_COVERED * len(lengths)) - 1)]  # CHAT_COVERED of them are this long
    block_size = next((context for context in CHAT_CONTEXTS if context + 1 >= covered), CHAT_CONTEXTS[-1])
    rows = packed_rows(lengths, block_size)
    batch_size = CHAT_BATCH_SIZE
    most = max(CHAT_MIN_STEPS, int(CHAT_MAX_TOKENS / chat_token_cost(block_size)) // (batch_size * block_size)
               // 100 * 100)
    steps = min(most, max(CHAT_MIN_STEPS, -(-CHAT_EPOCHS * rows // batch_size // 100) * 100))
    interval = max(100, steps // CHAT_EVALUATIONS // 100 * 100)
    chosen = {"optimizer": CHAT_OPTIMIZER, "batch_size": batch_size, "block_size": block_size, "max_iters": steps,
              "eval_interval": interval, "checkpoint_interval": interval,
              "eval_iters": CHAT_VALIDATION_ROWS // batch_size}
    whole = sum(length <= block_size + 1 for length in lengths) / len(lengths)
    line = (f"chat settings sized from {len(lengths):,} conversations: " + (f"{reading}; " if reading else "")
            + f"context {block_size} ({whole:.0%} fit whole; "
            f"{CHAT_COVERED:.0%} are at most {covered} tokens), {steps:,} steps of {batch_size} rows "
            f"({steps * batch_size / rows:.1f} passes over {rows:,} packed rows"
            + ("; the most that trains in about 14 minutes on 2 cores of a slow CPU, less on a recent one"
               if steps == most else "")
            + "), the modern preset's model trained by Muon; a setting given overrides these")
    return chosen, line


def chat_token_cost(block_size):
    """How long a token of a chat run at `block_size` trains, as a multiple of one at a context of 128: 1 at 128
    (measured there), growing linearly to CHAT_COST_AT_256 at 256; below 128, as a step of 128 does (8 rows of 64
    took from 41 to 59 ms a step on machine B, of 128 from 63 to 80 ms: so small a step keeps two cores less
    busy), so that a shorter context gets the steps of 128, which fit the time at the slower figure too."""
    return 1 + (CHAT_COST_AT_256 - 1) * max(0, block_size - 128) / 128 if block_size >= 128 else 128 / block_size


def packed_rows(lengths, block_size):
    """How many rows of block_size + 1 tokens conversations of `lengths` pack into (see `packing`), as
    `conversations.pack` packs them."""
    return len(pack_lengths(lengths, block_size + 1))
