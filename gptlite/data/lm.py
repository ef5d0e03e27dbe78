"""Training text: reading it, corpora of many files, the token cache, the default corpus, the split, the batches."""

import codecs
import functools
import hashlib
import json
import pathlib
import sysconfig

import keras
import numpy as np

from gptlite.backend.runtime import running
from gptlite.errors import InputError
from gptlite.files import atomic_path, check_exists, not_decodable
from gptlite.text.tokenizers import known_text

VALIDATION_FRACTION = 0.1
DEFAULT_CORPUS_CHARACTERS = 2_000_000
PIECE_BYTES = 1 << 16  # text is read and encoded in pieces of about this size
ENCODE_BATCH = 64  # pieces given to the tokenizer at once (it encodes a batch in parallel)
BPE_SAMPLE_BYTES = 32 * 2**20  # a BPE vocabulary is learned from at most this much of the text


def default_corpus(max_characters=DEFAULT_CORPUS_CHARACTERS):
    """Python source from the standard library of the running interpreter.

    Every Python install has it offline. The selection is deterministic: the
    ASCII-only `.py` files under the standard library folder, outside test
    suites, in sorted path order, until `max_characters` are collected.
    """
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skipped_folders = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    pieces, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if skipped_folders.intersection(path.relative_to(stdlib).parts):
            continue
        try:
            source = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        pieces.append(f"# {path.relative_to(stdlib).as_posix()}\n{source}\n")
        total += len(pieces[-1])
        if total >= max_characters:
            break
    if not pieces:
        raise InputError(f"found no Python sources under {stdlib} to train on; give a text file")
    return "".join(pieces)[:max_characters]


def text_files(paths):
    """The files that `paths` name: each a file, or a folder whose files are all taken
    (recursively, in sorted path order, hidden ones left out)."""
    files = []
    check_exists(paths)
    for path in map(pathlib.Path, paths):
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                raise InputError(f"{path} is a folder with no files in it")
            files.extend(found)
        else:
            files.append(path)
    return files


class Corpus:
    """Training text, one or more documents, read in pieces of about PIECE_BYTES.

    Pieces end at line ends where the lines allow, so no file has to fit in
    memory. Make one with `Corpus.from_files` or `Corpus.from_text`.
    """

    def __init__(self, documents, fingerprint, size, name):
        self._documents = documents  # callables, each giving an iterator of one document's pieces
        self.fingerprint = fingerprint  # changes whenever the text does
        self.size = size  # bytes, roughly: for progress and sampling
        self.name = name

    @classmethod
    def from_files(cls, paths, encoding="utf-8", errors="strict"):
        files = text_files(paths)
        try:
            codecs.lookup(encoding)
        except LookupError:
            raise InputError(f"unknown text encoding {encoding!r}") from None
        digest = hashlib.sha256(f"{encoding}:{errors}".encode())
        for path in files:
            digest.update(_file_digest(path) + b"\0")
        name = str(files[0]) if len(files) == 1 else f"{len(files)} files ({files[0]} ...)"
        documents = [functools.partial(_file_pieces, path, encoding, errors) for path in files]
        return cls(documents, digest.hexdigest(), sum(path.stat().st_size for path in files), name)

    @classmethod
    def from_text(cls, text, name="the text"):
        def pieces():
            for start in range(0, len(text), PIECE_BYTES):
                yield text[start:start + PIECE_BYTES]

        return cls([pieces], hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), len(text), name)

    def documents(self):
        """An iterator over the documents, each an iterator over its text pieces."""
        return (pieces() for pieces in self._documents)

    def pieces(self):
        return (piece for document in self.documents() for piece in document)

    def sample(self, max_size):
        """Evenly spaced pieces adding up to about `max_size`, for learning a vocabulary."""
        step = max(1, -(-self.size // max_size))
        return (piece for index, piece in enumerate(self.pieces()) if index % step == 0)


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(PIECE_BYTES), b""):
            digest.update(block)
    return digest.digest()


def _file_pieces(path, encoding, errors):
    """Decode a file in pieces that end at line ends; a bad byte is reported with its offset and line."""
    decoder = codecs.getincrementaldecoder(encoding)(errors)
    read = newlines = 0  # bytes, and line breaks among them, before the current block
    carried = ""  # the text after the last line end, for the next piece
    try:
        file = open(path, "rb")
    except OSError as error:
        raise InputError(f"cannot read {path}: {error.strerror}") from None
    with file:
        while True:
            block = file.read(PIECE_BYTES)
            buffered = decoder.getstate()[0]  # the start of a character cut off by the last block
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as error:
                at = read - len(buffered) + error.start
                line = newlines + (buffered + block).count(b"\n", 0, error.start) + 1
                raise not_decodable(path, encoding, (buffered + block)[error.start:error.start + 1], at,
                                    line) from None
            read += len(block)
            newlines += block.count(b"\n")
            text = carried + text
            if not block:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) < 4 * PIECE_BYTES:
                carried = text  # no line end yet: wait for one, a few blocks at most
                continue
            cut = cut or len(text)
            carried = text[cut:]
            yield text[:cut]


def encode_corpus(corpus, tokenizer, folder, show_progress=False, unknown="error"):
    """The corpus's token ids as a read-only memory map, encoded once and cached in `folder`.

    Characters the tokenizer lacks are an `InputError`, or with `unknown`
    "skip" or "replace" are left out or made spaces (`tokenizers.known_text`).

    The cache file's name holds a hash of the text and the tokenizer, so a
    changed file or tokenizer encodes anew; older caches there are removed.
    Ids take the smallest unsigned type that fits the vocabulary. Where the
    tokenizer has an end token, it separates documents.
    """
    folder = pathlib.Path(folder)
    dtype = np.dtype(np.uint16 if tokenizer.vocabulary_size <= 2**16 else np.uint32)
    tokenizer_config = json.dumps(keras.saving.serialize_keras_object(tokenizer), sort_keys=True)
    handling = "" if unknown == "error" else f"\n{unknown}"  # so that caches written before it stay valid
    key = hashlib.sha256(f"{corpus.fingerprint}\n{tokenizer_config}{handling}".encode()).hexdigest()[:16]
    path = folder / f"tokens-{key}.{dtype.name}"
    if not path.exists():
        progress = keras.utils.Progbar(corpus.size, unit_name="byte", verbose=1 if show_progress else 0)
        done = 0
        with atomic_path(path) as temporary, open(temporary, "wb") as file:
            for index, document in enumerate(corpus.documents()):
                if index and tokenizer.end_token_id is not None:
                    np.array([tokenizer.end_token_id], dtype).tofile(file)
                for batch in _batched(document, ENCODE_BATCH):
                    if unknown != "error":
                        batch = [known_text(tokenizer, piece, unknown, "text") for piece in batch]
                    for ids in tokenizer.encode_batch(batch):
                        ids.astype(dtype).tofile(file)
                    done += sum(len(piece) for piece in batch)
                    progress.update(min(done, corpus.size))
        for stale in folder.glob("tokens-*"):
            if stale != path:
                stale.unlink()
    if path.stat().st_size == 0:
        raise InputError(f"{corpus.name} has no text in it")
    return np.memmap(path, dtype=dtype, mode="r")


def _batched(iterable, size):
    batch = []
    for item in iterable:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def split(token_ids, validation_fraction=VALIDATION_FRACTION):
    """(train, validation): the validation part is the last fraction of the stream."""
    boundary = int(len(token_ids) * (1 - validation_fraction))
    return token_ids[:boundary], token_ids[boundary:]


def check_enough_tokens(train_ids, validation_ids, block_size):
    """Raise if either part is too short to cut one (block_size + 1)-token window from."""
    shortest = min(len(train_ids), len(validation_ids))
    if shortest < block_size + 1:
        total = len(train_ids) + len(validation_ids)
        if shortest < 2:
            raise InputError(
                f"the text has {total} tokens, too few to train on; give a longer text"
            )
        raise InputError(
            f"the text has {total} tokens, too few for block size {block_size} "
            f"(its validation part has {len(validation_ids)}); give a longer text "
            f"or set `block_size={shortest - 1}` or less"
        )


def draw_rows(population, batch_size, seed, index, micro_batches=1, part=(0, 1)):
    """Row numbers below `population` for item `index` of a stream of random batches.

    Each optimizer step draws `batch_size * micro_batches` rows from (seed,
    step) alone; with `micro_batches` above 1, item `index` is its
    `index % micro_batches`-th equal slice, so that accumulating the slices'
    gradients sees the rows one large batch would. With `part=(i, n)`, only
    the i-th of n equal slices of those rows: the share one of n training
    processes feeds.
    """
    step, micro = divmod(index, micro_batches)
    rng = np.random.default_rng((seed, step))
    rows = rng.integers(0, population, size=batch_size * micro_batches)
    part, parts = part
    rows = rows[micro * batch_size: (micro + 1) * batch_size]
    return rows[part * batch_size // parts: (part + 1) * batch_size // parts]


class DrawnBatches(keras.utils.PyDataset):
    """Batches of `batch_size` rows drawn at random from `population` rows (windows, pairs, packed conversations).

    Batch `i` depends only on (seed, first_index + i), so a run is reproducible
    and can be resumed at any step without replaying the ones before it.
    `micro_batches` and `part` slice each step's rows as `draw_rows` says;
    there are then `num_batches * micro_batches` items. A subclass's
    `__getitem__` makes its batch from `self.rows(index)`.
    """

    def __init__(self, population, batch_size, num_batches, seed=0, first_index=0, micro_batches=1, part=(0, 1),
                 **kwargs):
        super().__init__(**kwargs)
        self.population = population
        self.batch_size = batch_size
        self.batch_count = num_batches
        self.seed = seed
        self.first_index = first_index
        self.micro_batches = micro_batches
        self.part = part

    def __len__(self):
        return self.batch_count * self.micro_batches

    def rows(self, index):
        """Item `index`'s rows, indices into the population."""
        return draw_rows(self.population, self.batch_size, self.seed, self.first_index * self.micro_batches + index,
                         self.micro_batches, self.part)


# The most bytes of batches `fed_to_keras` draws ahead, at once: a `fit` call's batches, most often (the `gpu`
# preset's 250 steps take 33 MB).
STACKED_BYTES = 64 * 2**20


def fed_to_keras(batches):
    """`batches` (a `DrawnBatches`) as `fit` and `evaluate` read them at the pace of the compiled step.

    On TensorFlow, a tf.data pipeline that calls Python for its batches
    (Keras's for a PyDataset, or `from_generator`) slowed the `cpu` preset's
    steps from 29-33 ms to 36-45, even when it called Python once for all of
    them (benchmarks/journal.md, "The data's way in"). So batches that fit
    in STACKED_BYTES are drawn here, at once, and tf.data slices them from
    memory; more are read one by one from a generator. Either pipeline
    leaves tf.data's autotuning off: its tuning thread sleeps for periods
    that double up to a minute, and deleting the pipeline, as each `fit`
    call ends, waited for its next wake ("A minute lost at the end of each
    stretch of steps"). The batches and their order are the PyDataset's;
    batches drawn at once have one number of rows (a process's part of each
    step's). Other backends read the PyDataset itself.
    """
    if not running().reads_batches_through_tf_data:
        return batches
    import tensorflow as tf

    count = len(batches)
    first = batches[0]
    if count * sum(array.nbytes for array in tf.nest.flatten(first)) <= STACKED_BYTES:
        drawn = [first] + [batches[index] for index in range(1, count)]
        dataset = tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(lambda *arrays: np.stack(arrays), *drawn))
    else:
        def spec(array):  # read one by one, a batch may have any number of rows
            return tf.TensorSpec((None, *array.shape[1:]), tf.as_dtype(array.dtype))

        dataset = tf.data.Dataset.from_generator(lambda: (batches[index] for index in range(count)),
                                                 output_signature=tf.nest.map_structure(spec, first))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(count)).prefetch(2)
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


class RandomWindows(DrawnBatches):
    """Batches of random (block_size + 1)-token windows, as (inputs, next-token targets), drawn as
    `DrawnBatches` says.

    Yields x (B, T) and y (B, T) int32, where y is x shifted left by one token.
    """

    def __init__(self, token_ids, block_size, batch_size, num_batches, **kwargs):
        if len(token_ids) < block_size + 1:
            raise InputError(f"{len(token_ids)} tokens cannot fill a window of {block_size + 1}")
        super().__init__(len(token_ids) - block_size, batch_size, num_batches, **kwargs)
        self.token_ids = token_ids
        self.block_size = block_size
        self._offsets = np.arange(block_size + 1)  # (T + 1,)

    def __getitem__(self, index):
        starts = self.rows(index)
        windows = self.token_ids[starts[:, None] + self._offsets].astype(np.int32)  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]
