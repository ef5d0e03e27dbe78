"""A GPT's decoding step as an ONNX graph, written from its weights with the `onnx` package (as the GGUF export
writes its file with `gguf`), for ONNX Runtime: in a web page (`web_export`), or in Python.

One graph serves the prompt and every later token, batch 1:

    inputs   input_ids (1, T) int64: the new tokens, at positions P .. P + T - 1
             past_key_N, past_value_N (1, K, P, D) float32 for each block N: the keys (rotated, with rotary
             positions) and values of the P tokens before them; P = 0 for a prompt
    outputs  logits (1, V) float32: the next token's, after the last new token
             present_key_N, present_value_N (1, K, P + T, D): the cache with the new tokens' keys and values
             attention (L, H, T, P + T) float32: every block's attention weights of the new tokens

So a prompt is one call and each new token one more, reading the cache and computing one position. The graph is
written node by node, not traced by Keras's `export(format="onnx")`: tf2onnx needed some 30-40 times the weights'
bytes (GPT-2 small's size was killed at 17 GB), and Keras's export writes a fixed cache, copied whole each step.
Here the export holds the weights about twice (the arrays and the graph's bytes).

Every architecture switch of a GPT is written (learned, sinusoidal or rotary positions; LayerNorm or RMSNorm;
GELU, SwiGLU or ReLU²; grouped-query attention; QK-norm; pre- or post-norm; tied or untied head); LoRA adapters
go in merged. Matrices are stored as float32, or as float16 (`outtype="f16"`) that the runtime widens to float32
once, as it loads the graph: every product is computed in float32 either way.
"""

import math

import numpy as np

from gptlite.model.layers import weight_array
from gptlite.model.positions import rotary_angles

# ONNX's operator set: 17 has LayerNormalization; every operator used here runs in onnxruntime-web's WebAssembly.
OPSET = 17
OUTTYPES = ("f32", "f16")


def decoder_graph(model, outtype="f32"):
    """The decoding step of a GPT (see the module's docstring) as an `onnx.ModelProto`."""
    import onnx

    graph = _Graph(model.config, outtype)
    graph.write(model)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "gptlite_decoder", graph.inputs, graph.outputs, graph.initializers),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="gptlite")
    proto.ir_version = 8  # what onnxruntime-web reads at opset 17
    return proto


def cache_names(n_layer):
    """The cache's inputs in order: past_key_0, past_value_0, past_key_1, ..."""
    return [f"past_{part}_{index}" for index in range(n_layer) for part in ("key", "value")]


class _Graph:
    """The nodes, initializers, inputs and outputs of the step, added in the order they run."""

    def __init__(self, config, outtype):
        from onnx import helper, TensorProto

        self.config, self.outtype, self.helper, self.proto = config, outtype, helper, TensorProto
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self.count = 0

    # --- the graph's parts

    def write(self, model):
        config, helper, types = self.config, self.helper, self.proto
        kv, size = config.kv_heads, config.head_size
        self.inputs.append(helper.make_tensor_value_info("input_ids", types.INT64, [1, "tokens"]))
        for name in cache_names(config.n_layer):
            self.inputs.append(helper.make_tensor_value_info(name, types.FLOAT, [1, kv, "past", size]))
        # Where the new tokens sit: P .. P + T - 1, P the cache's length.
        past = self.node("Squeeze", [self.node("Shape", ["past_key_0"], start=2, end=3), self.constant([0])])
        tokens = self.node("Squeeze", [self.node("Shape", ["input_ids"], start=1, end=2), self.constant([0])])
        end = self.node("Add", [past, tokens])
        positions = self.node("Range", [past, end, self.constant(1)])  # (T,)
        # Query t (at P + t) sees every key up to its own position: (T, P + T).
        keys = self.node("Range", [self.constant(0), end, self.constant(1)])
        self.visible = self.node("LessOrEqual", [self.node("Unsqueeze", [keys, self.constant([0])]),
                                                 self.node("Unsqueeze", [positions, self.constant([1])])])
        self.weights_shape = self.node("Concat", [self.constant([1, config.n_head]), self.node(
            "Unsqueeze", [tokens, self.constant([0])]), self.node("Unsqueeze", [end, self.constant([0])])], axis=0)
        embedding = model.embedding
        x = self.node("Gather", [self.weight("token_embedding", weight_array(embedding.token_embedding, "embeddings")),
                                 "input_ids"])  # (1, T, C)
        if embedding.position_embeddings is not None:  # learned or sinusoidal: a table, added
            table = self.weight("position_table", weight_array(embedding, "position_embeddings"))
            x = self.node("Add", [x, self.node("Gather", [table, positions])])
        self.rotation = None
        if config.position == "rotary":
            angles = np.asarray(rotary_angles(np.arange(config.block_size), size, config.rope_theta), np.float32)
            self.rotation = [self.node("Unsqueeze", [self.node("Gather", [self.initializer(name, table), positions]),
                                                     self.constant([1])])  # (T, 1, D/2)
                             for name, table in (("rotary_cos", np.cos(angles)), ("rotary_sin", np.sin(angles)))]
        weights = []
        for index, block in enumerate(model.blocks):
            x, block_weights = self.block(block, index, x)
            weights.append(block_weights)
        if model.final_norm is not None:
            x = self.norm(model.final_norm, x, "final_norm")
        last = self.node("Sub", [tokens, self.constant(1)])
        x = self.node("Gather", [x, last], axis=1)  # (1, C): only the last token's logits choose anything
        if config.tie_weights:
            logits = self.node("Gemm", [x, f"{self.prefix}token_embedding"], transB=1)
        else:
            logits = self.node("MatMul", [x, self.weight("output_head", weight_array(embedding.token_embedding,
                                                                                     "reverse_embeddings"))])
        self.output(logits, "logits", [1, config.vocab_size])
        self.output(self.node("Concat", weights, axis=0), "attention", [config.n_layer, config.n_head, "tokens",
                                                                          "past_and_tokens"])

    def block(self, block, index, x):
        """One transformer block, pre- or post-norm: x (1, T, C) -> x, its attention weights (1, H, T, S)."""
        post = block.config.norm_position == "post"
        normed = x if post else self.norm(block.attention_norm, x, f"block_{index}.attention_norm")
        attended, weights = self.attention(block.attention, index, normed)
        x = self.node("Add", [x, attended])
        if post:
            x = self.norm(block.attention_norm, x, f"block_{index}.attention_norm")
        normed = x if post else self.norm(block.feed_forward_norm, x, f"block_{index}.feed_forward_norm")
        x = self.node("Add", [x, self.feed_forward(block.feed_forward, index, normed)])
        if post:
            x = self.norm(block.feed_forward_norm, x, f"block_{index}.feed_forward_norm")
        return x, weights

    def attention(self, layer, index, x):
        """Causal self-attention over the cache and the new tokens: (1, T, C) -> (1, T, C), weights (1, H, T, S)."""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        name = f"block_{index}.attention"
        qkv = self.node("Reshape", [self.linear(layer.qkv_projection, x, f"{name}.qkv"),
                                    self.constant([1, -1, heads + 2 * kv, size])])  # (1, T, H + 2K, D)
        query, key, value = self.node("Split", [qkv, self.constant([heads, kv, kv])], axis=2, outputs=3)
        if config.qk_norm:
            query = self.norm(layer.query_norm, query, f"{name}.query_norm")
            key = self.norm(layer.key_norm, key, f"{name}.key_norm")
        if self.rotation is not None:
            query, key = self.rotated(query), self.rotated(key)
        query, key, value = (self.node("Transpose", [part], perm=[0, 2, 1, 3]) for part in (query, key, value))
        key = self.node("Concat", [f"past_key_{index}", key], axis=2)  # (1, K, S, D)
        value = self.node("Concat", [f"past_value_{index}", value], axis=2)
        self.output(key, f"present_key_{index}", [1, kv, "past_and_tokens", size])
        self.output(value, f"present_value_{index}", [1, kv, "past_and_tokens", size])
        groups = heads // kv
        # Query heads k G .. k G + G - 1 share key/value head k: (1, K, G, T, D) against (1, K, 1, S, D).
        query = self.node("Reshape", [query, self.constant([1, kv, groups, -1, size])])
        key_t = self.node("Transpose", [self.node("Unsqueeze", [key, self.constant([2])])], perm=[0, 1, 2, 4, 3])
        scores = self.node("Mul", [self.node("MatMul", [query, key_t]),
                                   self.constant(np.float32(1 / math.sqrt(size)))])  # (1, K, G, T, S)
        lowest = self.constant(np.finfo(np.float32).min)
        weights = self.node("Softmax", [self.node("Where", [self.visible, scores, lowest])], axis=-1)
        attended = self.node("MatMul", [weights, self.node("Unsqueeze", [value, self.constant([2])])])
        attended = self.node("Reshape", [self.node("Transpose", [self.node("Reshape", [
            attended, self.constant([1, heads, -1, size])])], perm=[0, 2, 1, 3]), self.constant([1, -1, heads * size])])
        by_head = self.node("Reshape", [weights, self.weights_shape])  # (1, H, T, S)
        return self.linear(layer.output_projection, attended, f"{name}.output"), by_head

    def rotated(self, x):
        """Heads (1, T, H, D) turned by their positions: dimension i with i + D/2, as `positions.rotate`."""
        cos, sin = self.rotation
        first, second = self.node("Split", [x], axis=-1, outputs=2)
        return self.node("Concat", [
            self.node("Sub", [self.node("Mul", [first, cos]), self.node("Mul", [second, sin])]),
            self.node("Add", [self.node("Mul", [second, cos]), self.node("Mul", [first, sin])])], axis=-1)

    def feed_forward(self, layer, index, x):
        name = f"block_{index}.feed_forward"
        expanded = self.linear(layer.expand, x, f"{name}.expand")
        if layer.mlp == "swiglu":
            gate, up = self.node("Split", [expanded], axis=-1, outputs=2)
            hidden = self.node("Mul", [self.node("Mul", [gate, self.node("Sigmoid", [gate])]), up])
        elif layer.mlp == "relu2":
            rectified = self.node("Relu", [expanded])
            hidden = self.node("Mul", [rectified, rectified])
        else:  # GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            cubed = self.node("Mul", [self.node("Mul", [expanded, expanded]), expanded])
            inner = self.node("Mul", [self.node("Add", [expanded, self.node("Mul", [
                cubed, self.constant(np.float32(0.044715))])]), self.constant(np.float32(math.sqrt(2 / math.pi)))])
            hidden = self.node("Mul", [self.node("Mul", [expanded, self.constant(np.float32(0.5))]),
                                       self.node("Add", [self.node("Tanh", [inner]), self.constant(np.float32(1))])])
        return self.linear(layer.contract, hidden, f"{name}.contract")

    def linear(self, layer, x, name):
        """x W (+ b) of a `Linear`, its LoRA adapters merged into W."""
        y = self.node("MatMul", [x, self.weight(f"{name}.kernel", weight_array(layer, "kernel"))])
        if layer.bias is not None:
            y = self.node("Add", [y, self.initializer(f"{name}.bias", weight_array(layer, "bias"))])
        return y

    def norm(self, layer, x, name):
        """A LayerNormalization or an RMSNorm, as the model holds it."""
        gamma = weight_array(layer, "gamma")
        if hasattr(layer, "beta"):  # Keras's LayerNormalization
            inputs = [x, self.initializer(f"{name}.gamma", gamma)]
            if layer.beta is not None:
                inputs.append(self.initializer(f"{name}.beta", weight_array(layer, "beta")))
            return self.node("LayerNormalization", inputs, axis=-1, epsilon=float(layer.epsilon))
        mean_square = self.node("ReduceMean", [self.node("Mul", [x, x])], axes=[-1], keepdims=1)
        scale = self.node("Reciprocal", [self.node("Sqrt", [self.node("Add", [mean_square, self.constant(
            np.float32(layer.epsilon))])])])
        return self.node("Mul", [self.node("Mul", [x, scale]), self.initializer(f"{name}.gamma", gamma)])

    # --- writing nodes and weights

    prefix = "weights."

    def node(self, kind, inputs, outputs=1, **attributes):
        """Add a node; its output's name (a list of `outputs` names where it has several)."""
        self.count += 1
        names = [f"{kind.lower()}_{self.count}" + (f"_{index}" if outputs > 1 else "") for index in range(outputs)]
        attributes = {key: value for key, value in attributes.items() if value is not None}
        self.nodes.append(self.helper.make_node(kind, inputs, names, name=names[0], **attributes))
        return names if outputs > 1 else names[0]

    def initializer(self, name, array):
        """A float32 or int64 array the graph holds as it is (vectors, tables, constants)."""
        from onnx import numpy_helper

        full = self.prefix + name
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), full))  # 0-d stays 0-d
        return full

    def weight(self, name, matrix):
        """A matrix, stored in the graph's `outtype` and used as float32."""
        if self.outtype == "f32":
            return self.initializer(name, np.asarray(matrix, np.float32))
        stored = self.initializer(name + ".f16", np.asarray(matrix, np.float16))
        self.nodes.append(self.helper.make_node("Cast", [stored], [self.prefix + name], name=name + ".cast",
                                                to=self.proto.FLOAT))
        return self.prefix + name

    def constant(self, value):
        """A small constant: whole numbers as int64, others as they come."""
        array = np.asarray(value)
        if array.dtype.kind in "iu":
            array = array.astype(np.int64)
        self.count += 1
        return self.initializer(f"constant_{self.count}", array)

    def output(self, name, as_name, shape):
        self.nodes.append(self.helper.make_node("Identity", [name], [as_name], name=as_name))
        self.outputs.append(self.helper.make_tensor_value_info(as_name, self.proto.FLOAT, shape))
