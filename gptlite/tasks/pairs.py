"""A Seq2Seq on source/target pairs: one file of source<TAB>target lines (a tenth held out) or a built-in
synthetic task, read as characters; its loss is over the target tokens, and its score how many held-out targets
it decodes exactly."""

import dataclasses

import numpy as np

from gptlite.data import pairs, SYNTHETIC_TASKS
from gptlite.decode import generation
from gptlite.errors import ConfigError, InputError
from gptlite.evaluation import scores
from gptlite.inside import inspection
from gptlite.model.gpt import Seq2Seq
from gptlite.tasks.task import Sizing, Task, Training
from gptlite.text.tokenizers import CharTokenizer


@dataclasses.dataclass
class HeldOutPairs:
    """A seq2seq run's pairs: those it trains on and those it holds out, and their characters' tokenizer."""

    train: pairs.Pairs
    held_out: pairs.Pairs
    name: str
    tokenizer: CharTokenizer = None  # a new model's


class Pairs(Task):
    """An encoder-decoder that learns to write a target for each source."""

    name = "seq2seq"
    called = "a seq2seq model"
    reads = "source"
    model_class = Seq2Seq
    synthetic = SYNTHETIC_TASKS

    def owns(self, model):
        return model.writes_targets

    def check(self, asked):
        super().check(asked)
        if asked.init_from:
            raise ConfigError("`init_from` fine-tunes a GPT; a seq2seq model trains from the start")
        if asked.tokenizer not in (None, "char"):
            raise ConfigError("the seq2seq model reads characters; `tokenizer='bpe'` is for language models")
        if asked.distribute:
            raise ConfigError("`distribute=True` trains language models only for now")
        if asked.mfu or asked.peak_flops is not None:
            raise ConfigError("MFU (`mfu`, `peak_flops`) is estimated for a GPT; a seq2seq run has none")
        if asked.synthetic and asked.sources:
            raise ConfigError(f"the synthetic {asked.synthetic} task makes its own pairs; give no file")
        if not asked.synthetic and len(asked.sources) != 1:
            raise ConfigError("a seq2seq model trains on one file of source<TAB>target lines, or on a `synthetic` "
                              "task")

    def read(self, asked, seed, new_model, say):
        """The pairs, a tenth held out (chosen by the seed, so that a resumed run holds out the same ones); a new
        model reads their characters, and its context holds the longest pair unless `block_size` is given."""
        if asked.synthetic:
            train, held_out = pairs.synthetic(asked.synthetic, seed)
            data = HeldOutPairs(train, held_out, f"the synthetic {asked.synthetic} task")
        else:
            train, held_out = pairs.split(pairs.read_pairs(asked.sources[0], asked.encoding, asked.errors), seed)
            data = HeldOutPairs(train, held_out, str(asked.sources[0]))
        if not new_model:
            return data, None
        texts = (text for part in (train, held_out) for text in part.sources + part.targets)
        data.tokenizer = CharTokenizer.from_texts(texts, special_tokens=CharTokenizer.SPECIAL_TOKENS)
        return data, Sizing({"block_size": pairs.block_size_needed(data.tokenizer, train, held_out)})

    def model(self, plan, data, say):
        if plan.checkpoint:
            return Seq2Seq.from_config(plan.checkpoint["model_config"])
        return Seq2Seq.from_gpt_config(plan.model_config, data.tokenizer, dtype=plan.dtype)

    def training(self, plan, model, data, say, make_folder):
        """The pairs encoded, and the held-out ones each evaluation decodes (at most HELD_OUT_PAIRS)."""
        tokenizer, block_size = model.tokenizer, model.config.block_size
        train_set = pairs.encode(data.train, tokenizer, block_size)
        held_out_set = pairs.encode(data.held_out, tokenizer, block_size)
        make_folder()
        measured = data.held_out.subset(range(min(len(data.held_out), pairs.HELD_OUT_PAIRS)))
        shown = measured.subset(range(min(len(measured), 8)))
        line = (f"training on {data.name}: {len(data.train):,} pairs, {len(data.held_out):,} held out "
                f"({tokenizer.vocabulary_size - len(tokenizer.special_tokens)} characters); exact match measured "
                f"on {len(measured):,} held-out pairs")
        metrics = {"exact_match": lambda trained: scores.exact_matches(trained, measured) / len(measured)}
        return Training(train_set, held_out_set, line, metrics, lambda trained: target_lines(trained, shown),
                        data.held_out)

    def closing_words(self, run, shown=8):
        """The final model's exact match on the held-out pairs the evaluations decoded, and a few of its targets."""
        # As many as the evaluations decoded, in batches of the same size: no new compile.
        measured = run.held_out.subset(range(min(len(run.held_out), pairs.HELD_OUT_PAIRS)))
        decoded = generation.generate_target(run.model, measured.sources)
        right = sum(got == want for got, want in zip(decoded, measured.targets))
        yield f"the final model decodes {right:,} of {len(measured):,} held-out pairs exactly; a few:\n"
        for source, want, got in list(zip(measured.sources, measured.targets, decoded))[:shown]:
            yield f"  {source!r} -> {got!r}" + ("" if got == want else f"   (expected {want!r})") + "\n"

    def describe(self, model):
        config = model.config
        blocks = "post-norm layers" if config.norm_position == "post" else "layers"
        return (f"seq2seq, encoder and decoder of {config.n_layer} {blocks} each, {config.n_head} heads, width "
                f"{config.n_embd}, sources and targets of up to {config.block_size} tokens, "
                f"{model.count_params():,} parameters")

    def decoding_rows(self, tokenizer, block_size, texts, texts_ids=None):
        """Each source, read by the encoder; each row's target starts from the start token."""
        sources = generation.source_ids(tokenizer, block_size, texts)
        return [[tokenizer.start_token_id]] * len(texts), sources, [int(np.count_nonzero(row)) for row in sources]

    def warm_rows(self, tokenizer, block_size, length, count):
        return [[tokenizer.start_token_id]] * count, np.full((count, block_size), tokenizer.start_token_id, np.int32)

    def write(self, model, asked, settings, model_name="the model"):
        """A target for each source (`num_samples` of each), a line each, as it is decoded: at most block_size - 1
        tokens unless `max_new_tokens` says fewer."""
        if asked.prompt is not None:
            raise InputError(f"{model_name} is {self.called}: give it `source` TEXT or `source_file` FILE, not "
                             f"`prompt`")
        if (asked.source is None) == (asked.sources is None):
            raise InputError(f"{model_name} is {self.called}: give it one of `source` TEXT and `source_file` FILE")
        if asked.slide != 1:
            raise InputError("`slide` moves a language model's context window; a seq2seq target never outgrows its "
                             "own")
        sources = [asked.source] if asked.source is not None else asked.sources
        settings = dict(settings)
        max_new_tokens = settings.pop("max_new_tokens", None)
        targets = generation.iter_targets(
            model, [source for source in sources for _ in range(asked.num_samples)], max_new_tokens,
            unknown=asked.unknown, use_cache=asked.use_cache, num_beams=asked.num_beams, **settings)
        for target in targets:
            yield target + "\n"

    def draw_attention(self, model, path, asked, part=None, layer=None, head=None, model_name="the model"):
        """The attention of the source and the target the model writes for it (greedy): cross-attention by
        default, the encoder's or the decoder's by `part`."""
        source = self.given_text(asked.prompt, asked.source, model_name)
        if source is None:
            raise InputError(f"{model_name} is {self.called}: `attention` draws its attention for `source` TEXT")
        target = generation.generate_target(model, source, unknown=asked.unknown)
        maps = inspection.attention_maps(model, source, part=part, target=target, unknown=asked.unknown)
        inspection.plot_attention(maps, path, layer=layer, head=head)
        return f"{maps.title} for {source!r} -> {target!r}"

    def request_refusal(self, field):
        if field in ("echo", "logprobs"):
            return f"{field} is for a language model's completions; this model writes targets"
        if field == "attention":
            return "the attention view draws a language model's self-attention"
        return super().request_refusal(field)

    def traced(self, model, text, target=None, **options):
        from gptlite.inside.trace import trace_target

        if "position" in options:
            raise InputError("a Seq2Seq reads its source and its target whole: there is no window to choose "
                             "(position)")
        return trace_target(model, text, target, **options)

    def cuts_long_texts(self, truncate):
        return False  # a source is read whole, or not at all

    def bounded(self, sampling, block_size):
        """A target of at most block_size - 1 tokens: the decoder's window holds it after the start token."""
        return sampling.replace(max_new_tokens=min(sampling.max_new_tokens, block_size - 1))

    def batches(self, data, block_size, batch_size, count, **kwargs):
        return pairs.PairBatches(data, batch_size, count, **kwargs)

    def ignored_class(self, model):
        return model.PAD_ID  # the padding after a target

    def characters_per_token(self, tokenizer, validation):
        if tokenizer is None:
            return None
        targets = validation.target_ids  # the predicted target tokens, the end token among them
        predicted = int((targets[:, 1:] != tokenizer.pad_token_id).sum())
        characters = tokenizer.character_count(targets)
        return characters / predicted if characters and predicted else None

    def evaluate(self, model, sources, encoding, errors, unknown, verbose):
        return scores.evaluate_pairs(model, sources, encoding, errors, unknown, verbose)


def target_lines(model, held_out):
    """A line for each held-out pair: its source, and the target a Seq2Seq decodes for it (greedily)."""
    decoded = generation.generate_target(model, held_out.sources, temperature=0.0)
    return "\n".join(f"{source} -> {got}" + ("" if got == want else f"   (expected {want})")
                     for source, got, want in zip(held_out.sources, decoded, held_out.targets))
