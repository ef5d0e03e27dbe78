"""`gptlite export`: a trained model in a form other programs load without gptlite."""

import json
import pathlib

from gptlite.cli.command import check_model, command
from gptlite.cli.flags import add_backend_flags, Parser
from gptlite.errors import ConfigError, RunExistsError
from gptlite.weights import GGUF_OUTTYPES

SUMMARY = "write a model as a GGUF file (llama.cpp, Ollama), a Hugging Face folder, a KerasHub preset or a SavedModel"


def make_parser(prog):
    parser = Parser(prog=prog,
                     description="Write a trained model in a form other programs can serve without gptlite.")
    parser.add_argument("--model", type=pathlib.Path, default=pathlib.Path("out/model.keras"),
                        help="the model file (default: out/model.keras)")
    parser.add_argument("--format", choices=["saved_model", "hf", "kerashub", "gguf"], default="saved_model",
                        help="saved_model: a TensorFlow SavedModel, token ids in, next-token logits out (the "
                             "default); gguf: one GGUF file that llama.cpp, Ollama and LM Studio run; hf: a Hugging "
                             "Face folder, GPT-2 for GPT-2's layout, Llama, Qwen2 or Qwen3 "
                             "for a Llama-family one (transformers' AutoModelForCausalLM and AutoTokenizer load it); "
                             "kerashub: a KerasHub GPT-2 preset (GPT2CausalLM.from_preset)")
    parser.add_argument("--out", type=pathlib.Path, required=True,
                        help="the folder to write (for gguf, the file); must not exist")
    parser.add_argument("--outtype", choices=GGUF_OUTTYPES, default=None,
                        help="gguf only: how the weight matrices are stored: f32, f16 (the default: half the size) "
                             "or q8_0 (8-bit, about a quarter)")
    add_backend_flags(parser)
    return parser


def run(args):
    from gptlite.weights import gguf_export, gpt2, pretrained, saving

    # Checked before the model loads, so that the mistake shows at once (export checks again).
    if args.format == "saved_model":
        saving.check_export_backend()
    if args.outtype is not None and args.format != "gguf":
        raise ConfigError("`outtype` is for `format=gguf`: how a GGUF file stores its matrices")
    if args.out.exists():
        raise RunExistsError(f"{args.out} already exists; choose another `out`")
    model = saving.load(args.model)
    if args.format == "gguf":
        gguf_export.export_gguf(model, args.out, args.outtype or gguf_export.DEFAULT_OUTTYPE)
        print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB): run it with llama.cpp "
              f"(llama-cli -m {args.out}), or in Ollama with a Modelfile of one line, FROM ./{args.out.name}")
    elif args.format == "hf":
        pretrained.export_hugging_face(model, args.out)
        architecture = json.loads((args.out / "config.json").read_text())["architectures"][0]
        print(f"wrote {args.out}, a {architecture}: load it with transformers.AutoModelForCausalLM.from_pretrained "
              f"and AutoTokenizer.from_pretrained")
    elif args.format == "kerashub":
        gpt2.export_kerashub(model, args.out)
        print(f"wrote {args.out}: load it with keras_hub.models.GPT2CausalLM.from_preset")
    else:
        saving.export_saved_model(model, args.out)
        print(f"wrote {args.out}: load it with tf.saved_model.load; its 'serve' signature maps token_ids "
              f"(batch, up to {model.config.block_size} tokens, int32) to the next token's logits")


main = command("gptlite-export", make_parser, run, check=check_model)
