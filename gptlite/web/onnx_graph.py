"""A GPT's decoding step as an ONNX graph, written from its weights with the `onnx` package (as the GGUF export
writes its file with `gguf`), for ONNX Runtime: in a web page (`web.export`), or in Python.

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
go in merged. Matrices are stored as float32, as float16 (`outtype="f16"`), or as 8-bit integers with a float32
scale for each column (`"int8"`, a table's for each row), which the runtime widens to float32 once, as it loads
the graph: every product is computed in float32 each way, and only the download shrinks.
"""


import numpy as np

from gptlite.model.layers import weight_array
from gptlite.model.positions import rotary_angles

# ONNX's operator set: 23 has Attention (grouped-query, with a cache), RotaryEmbedding and RMSNormalization, each
# one operator where opset 17 took ten or more: onnxruntime-web's WebAssembly pays for each operator it runs, and a
# small model's step is mostly that. Every operator used here runs there.
OPSET = 23
OUTTYPES = ("f32", "f16", "int8")


def decoder_graph(model, outtype="f32"):
    """The decoding step of a GPT (see the module's docstring) as an `onnx.ModelProto`."""
    import onnx

    graph = Graph(model.config, outtype)
    graph.write(model)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "gptlite_decoder", graph.inputs, graph.outputs, graph.initializers),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="gptlite")
    proto.ir_version = 10  # opset 23's
    return proto


def cache_names(n_layer):
    """The cache's inputs in order: past_key_0, past_value_0, past_key_1, ..."""
    return [f"past_{part}_{index}" for index in range(n_layer) for part in ("key", "value")]


class Graph:
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
        embedding = model.embedding
        tokens_table = self.weight("token_embedding", weight_array(embedding.token_embedding, "embeddings"), rows=True)
        x = self.node("Gather", [tokens_table, "input_ids"])  # (1, T, C)
        if embedding.position_embeddings is not None:  # learned or sinusoidal: a table, added
            table = self.weight("position_table", weight_array(embedding, "position_embeddings"), rows=True)
            x = self.node("Add", [x, self.node("Gather", [table, positions])])
        self.rotation = None
        if config.position == "rotary":
            angles = np.asarray(rotary_angles(np.arange(config.block_size), size, config.rope_theta), np.float32)
            self.rotation = [self.initializer("rotary_cos", np.cos(angles)), self.initializer("rotary_sin", np.sin(
                angles)), self.node("Unsqueeze", [positions, self.constant([0])])]  # (block_size, D/2) twice, (1, T)
        weights = []
        for index, block in enumerate(model.blocks):
            x, block_weights = self.block(block, index, x)
            weights.append(block_weights)
        if model.final_norm is not None:
            x = self.norm(model.final_norm, x, "final_norm")
        last = self.node("Sub", [tokens, self.constant(1)])
        x = self.node("Gather", [x, last], axis=1)  # (1, C): only the last token's logits choose anything
        if config.tie_weights:
            logits = self.node("Gemm", [x, tokens_table], transB=1)
        else:
            logits = self.node("MatMul", [x, self.weight("output_head", weight_array(embedding.token_embedding,
                                                                                     "reverse_embeddings"))])
        self.output(logits, "logits", [1, config.vocab_size])
        # ONNX's shape inference leaves the Attention weights' last dimension blank, which ONNX Runtime reads as 0
        # and then warns of at every step; a reshape to the shape the tensor has at run time tells it nothing.
        attention = self.node("Concat", weights, axis=0)
        attention = self.node("Reshape", [attention, self.node("Shape", [attention])])
        self.output(attention, "attention", [config.n_layer, config.n_head, "tokens", "past_and_tokens"])

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
        """Causal self-attention over the cache and the new tokens: (1, T, C) -> (1, T, C), weights (1, H, T, S).
        ONNX's own Attention (grouped-query where K < H) appends the new keys and values to the cache."""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        name = f"block_{index}.attention"
        query, key, value = self.projected(layer, f"block_{index}", x)
        if config.qk_norm:
            query = self.norm(layer.query_norm, query, f"{name}.query_norm")
            key = self.norm(layer.key_norm, key, f"{name}.key_norm")
        if self.rotation is not None:  # (1, H|K, T, D), dimension i turned with i + D/2
            query, key = (self.node("RotaryEmbedding", [part, *self.rotation], interleaved=0) for part in (query, key))
        attended, key, value, weights = self.node(
            "Attention", [query, key, value, self.visible, f"past_key_{index}", f"past_value_{index}"], outputs=4,
            qk_matmul_output_mode=3)  # (1, H, T, D), the cache (1, K, S, D) twice, the weights (1, H, T, S)
        self.output(key, f"present_key_{index}", [1, kv, "past_and_tokens", size])
        self.output(value, f"present_value_{index}", [1, kv, "past_and_tokens", size])
        attended = self.node("Reshape", [self.node("Transpose", [attended], perm=[0, 2, 1, 3]),
                                         self.constant([1, -1, heads * size])])
        return self.linear(layer.output_projection, attended, f"{name}.output"), weights

    def projected(self, layer, named, x):
        """A causal attention layer's queries (1, H, T, D), keys and values (1, K, T, D) of x (1, T, C): one product,
        split. (QK-norm, over each head's D numbers, reads them so as well as before the heads come first.)"""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        qkv = self.node("Reshape", [self.linear(layer.qkv_projection, x, f"{named}.attention.qkv"),
                                    self.constant([1, -1, heads + 2 * kv, size])])  # (1, T, H + 2K, D)
        parts = self.node("Split", [qkv, self.constant([heads, kv, kv])], axis=2, outputs=3)
        return [self.node("Transpose", [part], perm=[0, 2, 1, 3]) for part in parts]

    def feed_forward(self, layer, index, x):
        name = f"block_{index}.feed_forward"
        expanded = self.linear(layer.expand, x, f"{name}.expand")
        if layer.mlp == "swiglu":
            gate, up = self.node("Split", [expanded], axis=-1, outputs=2, num_outputs=2)
            hidden = self.node("Mul", [self.node("Mul", [gate, self.node("Sigmoid", [gate])]), up])
        elif layer.mlp == "relu2":
            rectified = self.node("Relu", [expanded])
            hidden = self.node("Mul", [rectified, rectified])
        else:  # GPT-2's tanh approximation
            hidden = self.node("Gelu", [expanded], approximate="tanh")
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
        return self.node("RMSNormalization", [x, self.initializer(f"{name}.gamma", gamma)], axis=-1,
                         epsilon=float(layer.epsilon))

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

    def weight(self, name, matrix, rows=False):
        """A matrix, stored in the graph's `outtype` and used as float32: f16 widened, int8 times a float32 scale
        for each column (each row with `rows`: a table's entries). The runtime folds the widening into the weights
        as it loads the graph, so every step reads float32."""
        matrix = np.asarray(matrix, np.float32)
        if self.outtype == "f32":
            return self.initializer(name, matrix)
        if self.outtype == "f16":
            stored = self.initializer(name + ".f16", matrix.astype(np.float16))
            self.nodes.append(self.helper.make_node("Cast", [stored], [self.prefix + name], name=name + ".cast",
                                                    to=self.proto.FLOAT))
            return self.prefix + name
        scale = np.abs(matrix).max(axis=1 if rows else 0, keepdims=True) / 127  # (R, 1) or (1, C)
        scale = np.where(scale > 0, scale, 1).astype(np.float32)
        stored = self.initializer(name + ".int8", np.clip(np.rint(matrix / scale), -127, 127).astype(np.int8))
        widened = self.node("Cast", [stored], to=self.proto.FLOAT)
        self.nodes.append(self.helper.make_node("Mul", [widened, self.initializer(name + ".scale", scale)],
                                                [self.prefix + name], name=name + ".scaled"))
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
