"""Flags: library settings written as a command's flags, and the flags' own shape."""

import pytest

pytestmark = pytest.mark.once("the flags are plain Python")


def test_library_settings_are_written_as_the_commands_flags():
    from gptlite.cli import train
    from gptlite.cli.flags import as_flags

    parser = train.make_parser("gptlite-train")
    assert as_flags("max_iters must be a positive whole number, got 0", parser) == \
        "--max-iters must be a positive whole number, got 0"
    assert as_flags("min_lr (0.1) must not be above lr (0.01)", parser) == "--min-lr (0.1) must not be above --lr (0.01)"
    assert as_flags("set `resume=True` to go on, or `overwrite=True`; `bias=False`", parser) == \
        "set --resume to go on, or --overwrite; --no-bias"
    assert as_flags("or set `block_size=9` or less; `errors='replace'`", parser) == \
        "or set --block-size 9 or less; --errors replace"
    # Words that only look like settings, and paths, stay as they are.
    assert as_flags("bad bytes in runs/max_iters.txt: the errors are many", parser) == \
        "bad bytes in runs/max_iters.txt: the errors are many"


def test_tensorboard_is_a_switch_that_leaves_the_texts_alone():
    from gptlite.cli import train

    parser = train.make_parser("gptlite-train")
    args = parser.parse_args(["--tensorboard", "books/"])
    assert args.tensorboard is True and [str(text) for text in args.texts] == ["books"]
    args = parser.parse_args(["notes.txt", "--tensorboard-dir", "events"])
    assert str(args.tensorboard_dir) == "events" and [str(text) for text in args.texts] == ["notes.txt"]


def test_the_architecture_settings_are_flags_of_the_same_names():
    from gptlite.cli import train
    from gptlite.cli.flags import as_flags

    parser = train.make_parser("gptlite-train")
    args = parser.parse_args(["--position", "rotary", "--rope-theta", "500", "--norm", "rms", "--mlp", "swiglu",
                              "--mlp-hidden-size", "96", "--n-kv-head", "1", "--qk-norm", "--no-qkv-bias",
                              "--norm-position", "post"])
    assert (args.position, args.rope_theta, args.norm, args.mlp, args.mlp_hidden_size, args.n_kv_head,
            args.qk_norm, args.qkv_bias, args.norm_position) == ("rotary", 500.0, "rms", "swiglu", 96, 1, True,
                                                                 False, "post")
    assert parser.parse_args([]).n_kv_head is None  # unset: the preset's, or n_head
    assert as_flags("n_head (6) must be divisible by n_kv_head (4)", parser) == \
        "--n-head (6) must be divisible by --n-kv-head (4)"


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_every_sampling_setting_is_a_flag_of_each_command_that_writes(command):
    import dataclasses
    import importlib

    from gptlite.cli.flags import parse, sampling_config
    from gptlite.decode.settings import SamplingConfig

    parser = importlib.import_module(f"gptlite.cli.{command}").make_parser(f"gptlite-{command}")
    flags = {option for action in parser._actions for option in action.option_strings}
    for field in dataclasses.fields(SamplingConfig):
        assert "--" + field.name.replace("_", "-") in flags
    asked = ["--max-new-tokens", "7", "--temperature", "0.5", "--top-k", "3", "--top-p", "0.9", "--min-p", "0.05",
             "--repetition-penalty", "1.3", "--seed", "4", "--stop", "\n\n", "--stop", "END"]
    assert sampling_config(parse(parser, asked)) == SamplingConfig(
        max_new_tokens=7, temperature=0.5, top_k=3, top_p=0.9, min_p=0.05, repetition_penalty=1.3, seed=4,
        stop=("\n\n", "END"))
    assert sampling_config(parse(parser, [])) == SamplingConfig()  # every flag left out: the defaults


def test_every_sampling_setting_is_a_field_of_a_request_to_the_server():
    from gptlite.decode.settings import SAMPLING_SETTINGS
    from gptlite.serving.parsing import FIELDS, REQUEST_NAMES

    assert set(REQUEST_NAMES.values()) == set(SAMPLING_SETTINGS)
    assert set(REQUEST_NAMES) <= FIELDS and "max_tokens" in REQUEST_NAMES
