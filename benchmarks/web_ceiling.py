"""What bounds the web page's speed at the `laptop` preset's shape: onnxruntime-web's step under Node, on one
thread, as V8 first runs it (its baseline WebAssembly compiler) and once optimised, beside native ONNX Runtime on
one thread, and the fastest matrix product onnxruntime-web computes on this CPU (GFLOP/s).

    python benchmarks/web_ceiling.py --npm FOLDER

FOLDER holds `node_modules/onnxruntime-web` at the version the page ships (`npm install onnxruntime-web@1.30.0`);
the script writes its Node program there. Measures, each the median of rounds:
- a step over the cache (one token), by rounds of 59 steps from a fresh cache: the first rounds run V8's baseline
  code, later ones optimised code (`--no-liftoff` optimises everything from the start);
- a 64-token pass (the whole window, as each token past it is read): milliseconds and GFLOP/s of its arithmetic;
- MatMul 64x512 by 512x512 and 512x512 by 512x512, alone in a graph: the runtime's best GFLOP/s.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import tempfile
import time

import numpy as np


NODE_PROGRAM = r"""
import * as ort from "onnxruntime-web";
import { readFileSync } from "node:fs";
ort.env.wasm.numThreads = 1;
const [folder, layers, kvHeads, headSize] = [process.argv[2], ...process.argv.slice(3).map(Number)];
const options = { executionProviders: ["wasm"], logSeverityLevel: 3 };
const session = await ort.InferenceSession.create(readFileSync(`${folder}/model.onnx`), options);
const empty = {};
for (let i = 0; i < layers; i++) for (const part of ["key", "value"]) {
  empty[`past_${part}_${i}`] = new ort.Tensor("float32", new Float32Array(0), [1, kvHeads, 0, headSize]);
}
const ids = (list) => new ort.Tensor("int64", BigInt64Array.from(list, BigInt), [1, list.length]);
const steps = [];
for (let round = 0; round < 12; round++) {
  let out = await session.run({ input_ids: ids([1, 2, 3, 4, 5]), ...empty });
  const started = performance.now();
  for (let s = 0; s < 59; s++) {
    const cache = {};
    for (const name of Object.keys(empty)) cache[name] = out[name.replace("past_", "present_")];
    out = await session.run({ input_ids: ids([7]), ...cache });
  }
  steps.push((performance.now() - started) / 59);
}
const window = ids(Array.from({ length: 64 }, (_, i) => i % 60));
const passes = [];
for (let round = 0; round < 5; round++) {
  const started = performance.now();
  for (let i = 0; i < 50; i++) await session.run({ input_ids: window, ...empty });
  passes.push((performance.now() - started) / 50);
}
const products = {};
for (const rows of [64, 512]) {
  const product = await ort.InferenceSession.create(readFileSync(`${folder}/matmul${rows}.onnx`), options);
  const feed = { a: new ort.Tensor("float32", new Float32Array(rows * 512).fill(0.5), [rows, 512]) };
  for (let i = 0; i < 20; i++) await product.run(feed);
  const repeats = rows === 64 ? 400 : 40;
  const started = performance.now();
  for (let i = 0; i < repeats; i++) await product.run(feed);
  products[rows] = (performance.now() - started) / repeats;
}
console.log(JSON.stringify({ steps, passes, products }));
"""


def pass_flops(graph, config, tokens):
    """Floating-point operations of a `tokens`-token pass from an empty cache: the weight products for every
    token (the head's for the last only) and attention's two products (scores and their weighted sum) over the
    window, each query by each key."""
    from onnx import numpy_helper

    shapes = {tensor.name: numpy_helper.to_array(tensor).shape for tensor in graph.graph.initializer}
    macs = 0
    for node in graph.graph.node:
        matrices = [shapes[name] for name in node.input if len(shapes.get(name, ())) == 2]
        if node.op_type in ("MatMul", "Gemm") and matrices:
            macs += int(np.prod(matrices[0])) * (1 if node.op_type == "Gemm" else tokens)
    macs += config.n_layer * 2 * tokens * tokens * config.n_head * config.head_size
    return 2 * macs


def matmul_graph(rows):
    from onnx import helper, numpy_helper, TensorProto

    weights = numpy_helper.from_array(np.random.default_rng(0).random((512, 512), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "product",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [rows, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 512])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def native(path, layers, kv_heads, head_size):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {f"past_{part}_{i}": np.zeros((1, kv_heads, 0, head_size), np.float32) for i in range(layers)
             for part in ("key", "value")}
    feeds["input_ids"] = (np.arange(64) % 60)[None].astype(np.int64)
    for _ in range(50):
        session.run(None, feeds)
    times = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(50):
            session.run(None, feeds)
        times.append((time.perf_counter() - started) / 50 * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npm", type=pathlib.Path, required=True,
                        help="a folder with node_modules/onnxruntime-web (npm install onnxruntime-web@1.30.0)")
    args = parser.parse_args()
    import onnx

    from gptlite.web import onnx_graph
    from helpers.models import laptop_model

    model = laptop_model()
    config = model.config
    graph = onnx_graph.decoder_graph(model)
    flops = pass_flops(graph, config, 64)
    with tempfile.TemporaryDirectory() as folder:
        onnx.save(graph, f"{folder}/model.onnx")
        for rows in (64, 512):
            onnx.save(matmul_graph(rows), f"{folder}/matmul{rows}.onnx")
        program = args.npm / "web_ceiling.mjs"
        program.write_text(NODE_PROGRAM)
        shape = [str(config.n_layer), str(config.kv_heads), str(config.head_size)]
        measured = {}
        for name, flags in (("as a page first runs it", []), ("optimised from the start", ["--no-liftoff"])):
            done = subprocess.run(["node", *flags, str(program), folder, *shape], capture_output=True, text=True,
                                  check=True)
            measured[name] = json.loads(done.stdout.strip().splitlines()[-1])
        native_pass = native(pathlib.Path(folder) / "model.onnx", config.n_layer, config.kv_heads, config.head_size)
    print(f"# node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}; "
          f"a 64-token pass is {flops / 1e6:.1f} MFLOP")
    for name, result in measured.items():
        steps, passes, products = result["steps"], result["passes"], result["products"]
        print(f"onnxruntime-web, {name}: a step {' '.join(f'{ms:.2f}' for ms in steps)} ms in rounds of 59; "
              f"64-token pass {statistics.median(passes):.2f} ms ({flops / statistics.median(passes) / 1e6:.1f} "
              f"GFLOP/s); MatMul 64x512x512 {2 * 64 * 512 * 512 / products['64'] / 1e6:.1f} GFLOP/s, 512x512x512 "
              f"{2 * 512 ** 3 / products['512'] / 1e6:.1f} GFLOP/s")
    print(f"native ONNX Runtime, one thread: 64-token pass {native_pass:.2f} ms "
          f"({flops / native_pass / 1e6:.1f} GFLOP/s)")


if __name__ == "__main__":
    main()
