"""A chat model in llama.cpp: the synthetic arithmetic task's held-out questions, gptlite beside its GGUF files.

    python benchmarks/gguf_chat.py runs/arithmetic/model.keras

Takes a model trained with `python -m gptlite train --synthetic arithmetic --out runs/arithmetic`,
writes it as f32, f16 and q8_0 GGUF files, and asks the task's 300 held-out questions (number
pairs no training conversation holds) greedily: of gptlite
(`chat.greedy_answers`), and of llama.cpp through llama-cpp-python's chat
completion with the template the file holds. Counts the answers that are
exactly right, and how many of llama.cpp's are gptlite's own text. Needs
llama-cpp-python (pip install -e ".[llama]").
"""

import argparse
import pathlib
import tempfile
import time

from helpers.llama_cpp import open_llama_cpp

REPO = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=pathlib.Path)
    args = parser.parse_args()
    import gptlite
    from gptlite.data import chat_tasks
    from gptlite.decode import chat

    model = gptlite.load(args.model)
    questions = chat_tasks.synthetic("arithmetic").held_out
    started = time.perf_counter()
    ours, exact = chat.greedy_answers(model, questions)
    print("| answered by | exact | llama.cpp's text is gptlite's | seconds |\n|---|---:|---:|---:|")
    print(f"| gptlite | {sum(exact)} of {len(questions)} | | {time.perf_counter() - started:.1f} |", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for outtype in ("f32", "f16", "q8_0"):
            path = pathlib.Path(folder) / f"arithmetic-{outtype}.gguf"
            gptlite.export_gguf(model, path, outtype)
            # Without repacking: llama.cpp 0.3.36 crashes on q8_0 weights it repacks on machine D (vs_llama_cpp.py).
            llm = open_llama_cpp(path, model.config.block_size, repack=outtype != "q8_0")
            started = time.perf_counter()
            right = same = 0
            for (messages, want), gptlite_answer in zip(questions, ours):
                answer = llm.create_chat_completion(messages, temperature=0.0, max_tokens=16, repeat_penalty=1.0)
                text = answer["choices"][0]["message"]["content"]
                right += text.strip() == want.strip()
                same += text == gptlite_answer
            print(f"| llama.cpp {outtype} | {right} of {len(questions)} | {same} | "
                  f"{time.perf_counter() - started:.1f} |", flush=True)


if __name__ == "__main__":
    main()
