"""A GPT on text: files (or folders of them) read in pieces, a char or BPE tokenizer fitted to them, the text
encoded once into a token file, random windows of it as batches, and bits per character as its score."""

import sys

import numpy as np

from gptlite.data import induction, lm, LM_SYNTHETIC_TASKS
from gptlite.decode import generation
from gptlite.decode.settings import SamplingConfig
from gptlite.errors import ConfigError, InputError
from gptlite.evaluation import scores
from gptlite.inside import inspection
from gptlite.model.config import MLP_KINDS, NORM_KINDS
from gptlite.model.gpt import GPT
from gptlite.tasks.task import Task, Training
from gptlite.text import tokenizer_class
from gptlite.text.tokenizers import known_text

# How a run samples its model, at each TensorBoard evaluation and at its end.
SAMPLING = dict(max_new_tokens=300, temperature=0.8, top_k=200)
# Between the samples `write` prints together.
SAMPLE_DIVIDER = "\n" + "-" * 40 + "\n"
# Token ids counted at once when measuring how many characters a token stands for.
COUNTING_CHUNK = 1 << 22


class LanguageModel(Task):
    """A GPT that learns to continue text."""

    name = "lm"
    model_class = GPT
    measures_mfu = True  # a GPT's FLOPs per token are known (`GPT.training_flops_per_token`)
    synthetic = LM_SYNTHETIC_TASKS
    films = True

    def owns(self, model):
        return not model.writes_targets and not model.chats

    def check(self, asked):
        super().check(asked)
        if asked.synthetic and asked.sources:
            raise ConfigError(f"the synthetic {asked.synthetic} task makes its own rows; give no file")
        if asked.synthetic and asked.init_from:
            raise ConfigError(f"the synthetic {asked.synthetic} task trains a new model; leave out `init_from`")
        if asked.synthetic and asked.tokenizer not in (None, "char"):
            raise ConfigError(f"the synthetic {asked.synthetic} task's symbols are characters; leave out "
                              f"`tokenizer={asked.tokenizer}`")

    def __init__(self):
        self._corpus = None

    def corpus(self, plan):
        """The run's text, read once: its files, or about 2 MB of the Python standard library's sources."""
        if self._corpus is None:
            asked = plan.asked
            if asked.synthetic:  # its symbols: what its tokenizer is fitted to
                self._corpus = lm.Corpus.from_text(induction.SYMBOLS, f"the synthetic {asked.synthetic} task")
            elif asked.sources:
                self._corpus = lm.Corpus.from_files(asked.sources, asked.encoding, asked.errors)
            else:
                self._corpus = lm.Corpus.from_text(lm.default_corpus(), "the Python standard library's sources")
        return self._corpus

    def model(self, plan, data, say):
        """The GPT to train: the checkpoint's, or a new one of the plan's shape with a tokenizer fitted to its
        text."""
        if plan.checkpoint:
            return GPT.from_config(plan.checkpoint["model_config"])
        return GPT.from_gpt_config(plan.model_config, self.tokenizer(plan, data, say), dtype=plan.dtype)

    def tokenizer(self, plan, data, say):
        """A new model's tokenizer, fitted to the text."""
        return fitted_tokenizer(self.corpus(plan), plan.tokenizer, plan.asked.vocab_size, False, say)

    def sampler(self, plan):
        """What a run samples of its model, at each TensorBoard evaluation and at its end."""
        return lambda trained: sample_text(trained, plan.seed)

    def training(self, plan, model, data, say, make_folder):
        """The text encoded once into a token file in the run's folder, split into train and validation."""
        corpus = self.corpus(plan)
        make_folder()
        if plan.asked.synthetic:
            return self._synthetic_training(plan, model, corpus)
        try:
            token_ids = lm.encode_corpus(corpus, model.tokenizer, plan.out_dir, sys.stdout.isatty(),
                                         plan.asked.unknown)
        except InputError as error:
            if plan.checkpoint and any(model.tokenizer.unknown_characters(piece) for piece in corpus.pieces()):
                raise InputError(f"{error}: resume with the text the run started on") from None
            if plan.asked.init_from and not plan.checkpoint and plan.asked.unknown == "error":
                raise InputError(f"{error}: the pretrained model never saw them; `unknown='skip'` leaves them out, "
                                 f"`unknown='replace'` makes them spaces") from None
            raise
        train_ids, validation_ids = lm.split(token_ids)
        lm.check_enough_tokens(train_ids, validation_ids, model.config.block_size)
        line = (f"training on {corpus.name}: {len(train_ids) + len(validation_ids):,} tokens "
                f"({model.tokenizer.tokens_are}, {model.tokenizer.vocabulary_size:,} in the vocabulary); "
                f"{len(train_ids):,} train / {len(validation_ids):,} validation")
        return Training(train_ids, validation_ids, line, {}, self.sampler(plan))

    def _synthetic_training(self, plan, model, corpus):
        """The synthetic task's rows (`data.induction`), drawn from the run's seed."""
        symbols = model.tokenizer.encode(induction.SYMBOLS)
        train_rows, validation_rows = induction.task_rows(symbols, model.config.block_size, plan.seed)
        line = (f"training on {corpus.name}: rows that end with {(model.config.block_size + 1) // 4} to "
                f"{(model.config.block_size + 1) // 2} of {len(induction.SYMBOLS)} symbols and them again; "
                f"{len(train_rows):,} train / {len(validation_rows):,} validation rows")
        return Training(train_rows, validation_rows, line, {}, self.sampler(plan))

    def film_probe(self, model, training, text=None):
        block_size = model.config.block_size
        if text is not None:
            ids = generation.prompt_ids(model.tokenizer, known_text(model.tokenizer, text, "error", "`film_probe` text"),
                                        "error")[-block_size:]
            if len(ids) < 2:
                raise InputError(f"`film_probe` is {len(ids)} token; the film looks at a text of at least 2")
            return ids
        validation = training.validation
        return [int(i) for i in (validation[0] if validation.ndim == 2 else validation)[:block_size]]

    def describe(self, model):
        config = model.config
        return (f"{config.n_layer} layers, {_heads(config)}, width {config.n_embd}, context {config.block_size}, "
                f"{_architecture(config)}, {_parameters(model)}")

    def closing_words(self, run):
        """A sample from the final model, streamed."""
        yield "sample from the final model:\n\n"
        yield from generation.stream(run.model, "", seed=run.training_config.seed, **SAMPLING)
        yield "\n"

    def write(self, model, asked, settings, model_name="the model"):
        """The prompt continued: streamed (the prompt first), or whole where beams search for it (the best beam
        can change up to the last step) or several samples are drawn together (in one batch)."""
        prompt = self.given_text(asked.prompt, asked.source, model_name) or ""
        if asked.sources is not None:
            raise InputError(f"{model_name} is {self.called}: give it `prompt` TEXT to continue, not sources")
        options = dict(sampling=SamplingConfig(**settings), unknown=asked.unknown, use_cache=asked.use_cache,
                       slide=asked.slide)
        if asked.num_beams is not None:
            yield generation.generate(model, prompt, num_beams=asked.num_beams, **options)
        elif asked.stream and asked.num_samples == 1:
            pieces = generation.stream(model, prompt, **options)  # checked before the prompt is shown
            yield prompt
            yield from pieces
        else:
            yield SAMPLE_DIVIDER.join(generation.generate(model, [prompt] * asked.num_samples, **options))
        yield "\n"

    def draw_attention(self, model, path, asked, part=None, layer=None, head=None, model_name="the model"):
        """The attention over the prompt's tokens (its last block_size): causal self-attention, the one part."""
        prompt = self.given_text(asked.prompt, asked.source, model_name)
        if prompt is None:
            raise InputError(f"{model_name} is {self.called}: `attention` draws its attention over `prompt` TEXT")
        if part not in (None, "decoder"):
            raise InputError(f"{model_name} is {self.called}: it has causal self-attention only, no `part`")
        maps = inspection.attention_maps(model, prompt, part=part, unknown=asked.unknown)
        inspection.plot_attention(maps, path, layer=layer, head=head)
        length = len(model.tokenizer.encode(known_text(model.tokenizer, prompt, asked.unknown, "prompt")))
        drawn = f"{len(maps.tokens)} tokens" if length == len(maps.tokens) else \
            f"the last {len(maps.tokens)} of {length} tokens, the model's context"
        return f"{maps.title} for {drawn}"

    def batches(self, data, block_size, batch_size, count, **kwargs):
        if data.ndim == 2:  # a synthetic task's rows
            return induction.RowBatches(data, block_size, batch_size, count, **kwargs)
        return lm.RandomWindows(data, block_size, batch_size, count, **kwargs)

    def characters_per_token(self, tokenizer, validation):
        if tokenizer is None or validation.ndim == 2:  # a synthetic task's symbols are no text's characters
            return None
        characters = sum(tokenizer.character_count(validation[start:start + COUNTING_CHUNK])
                         for start in range(0, len(validation), COUNTING_CHUNK))
        return characters / len(validation) if characters and len(validation) else None

    def evaluate(self, model, sources, encoding, errors, unknown, verbose):
        return scores.evaluate_text(model, sources, encoding, errors, unknown, verbose)


def sample_text(model, seed):
    """What a GPT writes from nothing, as a run samples it (`SAMPLING`)."""
    return generation.generate(model, "", seed=seed, **SAMPLING)


def _heads(config):
    if config.kv_heads == config.n_head:
        return f"{config.n_head} heads"
    return f"{config.n_head} heads sharing {config.kv_heads} key/value heads"


def _architecture(config):
    """The architecture's switches, in a few words: "learned positions, LayerNorm, GELU" for GPT-2's."""
    norm = NORM_KINDS[config.norm].name
    words = [f"{config.position} positions", norm if config.norm_position == "pre" else f"post-norm {norm}",
             MLP_KINDS[config.mlp].name]
    return ", ".join(words + (["QK-norm"] if config.qk_norm else []))


def _parameters(model):
    total = model.count_params()
    trainable = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    return f"{total:,} parameters" + (f", {trainable:,} of them trained" if trainable != total else "")


def fitted_tokenizer(corpus, name, vocab_size, digits_apart, say):
    """A new tokenizer of the kind `name` (one of `text.TOKENIZERS`) fitted to the corpus: `vocab_size` tokens
    where it learns a vocabulary (a BPE's, from a sample of the text), `digits_apart` each digit a token."""
    kind = tokenizer_class(name)
    if not corpus.size:  # said before any tokenizer is learned from it
        raise InputError(f"{corpus.name} has no text in it")
    if not kind.learns_from_a_sample:
        return kind.fit(corpus.pieces(), vocab_size, digits_apart, what=corpus.name)
    say(f"learning {kind.fitting_words(vocab_size, digits_apart)} from {corpus.name} "
        f"(a sample of up to {lm.BPE_SAMPLE_BYTES // 2**20} MB)", flush=True)
    return kind.fit(corpus.sample(lm.BPE_SAMPLE_BYTES), vocab_size, digits_apart, sys.stdout.isatty(),
                    what=corpus.name)
