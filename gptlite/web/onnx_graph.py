"""A model's forward pass as ONNX graphs, written from its weights with the `onnx` package (as the GGUF export
writes its file with `gguf`), for ONNX Runtime: in a web page (`web.export`), or in Python. One writer, `Graph`,
writes both the page's graphs:

`decoder_graph`, a GPT's decoding step, which serves the prompt and every later token, batch 1:

    inputs   input_ids (1, T) int64: the new tokens, at positions P .. P + T - 1
             past_key_N, past_value_N (1, K, P, D) float32 for each block N: the keys (rotated, with rotary
             positions) and values of the P tokens before them; P = 0 for a prompt
    outputs  logits (1, V) float32: the next token's, after the last new token
             present_key_N, present_value_N (1, K, P + T, D): the cache with the new tokens' keys and values
             attention (L, H, T, P + T) float32: every block's attention weights of the new tokens

So a prompt is one call and each new token one more, reading the cache and computing one position, with ONNX's
own fused Attention.

`inside_graph`, the same pass over a whole text (no cache) with every step kept, for the page's Inside view: its
outputs are named and shaped as `gptlite.trace` names and shapes the steps (`gptlite.model.hooks`: a step outside
the blocks by its name, block N's as `layer_N.<step>`, a Seq2Seq's encoder's as `encoder_layer_N.<step>`), with the
position table, the rotary angles and each token's NEIGHBOURS nearest tokens, so that the page's view reads
either; attention is written out (the product, the scaling, the mask, the softmax, the weighted sum) to keep each
step. It takes `head_scale` (L, H) float32 (a Seq2Seq's `cross_head_scale` and `encoder_head_scale` too): each
head's weighted values are multiplied by it before the output projection, so 1 leaves the model as it is and 0
knocks a head out as `gptlite.trace(..., ablate=...)` does; the page gives ones unless asked otherwise.

The graphs are written node by node, not traced by Keras's `export(format="onnx")`: tf2onnx needed some 30-40 times
the weights' bytes (GPT-2 small's size was killed at 17 GB), and Keras's export writes a fixed cache, copied whole
each step. Here the export holds the weights about twice (the arrays and the graph's bytes).

Every architecture switch is written (learned, sinusoidal or rotary positions; LayerNorm or RMSNorm; GELU, SwiGLU
or ReLU²; grouped-query attention; QK-norm; pre- or post-norm; tied or untied head); LoRA adapters go in merged.
Matrices are stored as float32, as float16 (`outtype="f16"`), or as 8-bit integers with a float32 scale for each
column (`"int8"`, a table's for each row), which the runtime widens to float32 once, as it loads the graph: every
product is computed in float32 each way, and only the download shrinks.
"""

import numpy as np

from gptlite.errors import ConfigError
from gptlite.inside.trace import NEIGHBOURS
from gptlite.model.config import MLP_KINDS
from gptlite.model.layers import weight_array
from gptlite.model.positions import rotary_angles

# ONNX's operator set: 23 has Attention (grouped-query, with a cache), RotaryEmbedding and RMSNormalization, each
# one operator where opset 17 took ten or more: onnxruntime-web's WebAssembly pays for each operator it runs, and a
# small model's step is mostly that. Every operator used here runs there.
OPSET = 23
OUTTYPES = ("f32", "f16", "int8")
# The inputs that scale each head's output in the inside graph, by attention part (`ATTENTION_PARTS`).
HEAD_SCALES = {"decoder": "head_scale", "cross": "cross_head_scale", "encoder": "encoder_head_scale"}


def decoder_graph(model, outtype="f32"):
    """The decoding step of a GPT (see the module's docstring) as an `onnx.ModelProto`."""
    return Graph(model.config, outtype, inside=False).written(model, "gptlite_decoder")


def inside_graph(model, outtype="f32"):
    """The forward pass of a GPT or a Seq2Seq with every step an output (see the module's docstring), an
    `onnx.ModelProto`."""
    return Graph(model.config, outtype, inside=True).written(model, "gptlite_inside")


def check_forms(config):
    """Refuse a model with a choice these graphs have no form of (a ConfigError saying which), before anything is
    written."""
    if config.mlp not in FEED_FORWARD_FORMS:
        raise ConfigError(f"the web page's graphs have no form of a {MLP_KINDS[config.mlp].name} feed-forward (mlp "
                          f"{config.mlp!r}); they write {', '.join(FEED_FORWARD_FORMS)}")


def cache_names(n_layer):
    """The cache's inputs in order: past_key_0, past_value_0, past_key_1, ..."""
    return [f"past_{part}_{index}" for index in range(n_layer) for part in ("key", "value")]


class Graph:
    """The nodes, initializers, inputs and outputs of a graph, added in the order they run: the decoding step, or
    (`inside`) the whole pass with every step kept."""

    def __init__(self, config, outtype, inside):
        from onnx import helper, TensorProto

        self.config, self.outtype, self.inside, self.helper, self.proto = config, outtype, inside, helper, TensorProto
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self.count = 0

    def written(self, model, name):
        import onnx

        check_forms(self.config)
        self.write(model)
        proto = onnx.helper.make_model(onnx.helper.make_graph(self.nodes, name, self.inputs, self.outputs,
                                                              self.initializers),
                                       opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="gptlite")
        proto.ir_version = 10  # opset 23's
        return proto

    # --- the graph's parts

    def write(self, model):
        config, embedding = self.config, model.embedding
        self.table = self.weight("token_embedding", weight_array(embedding.token_embedding, "embeddings"), rows=True)
        self.positions_table = None
        if embedding.position_embeddings is not None:  # learned or sinusoidal: a table, added
            self.positions_table = self.weight("position_table", weight_array(embedding, "position_embeddings"),
                                               rows=True)
            self.keep(self.positions_table, "position_table", batched=False)
        if config.position == "rotary":
            angles = np.asarray(rotary_angles(np.arange(config.block_size), config.head_size, config.rope_theta),
                                np.float32)  # (block_size, D/2)
            self.angles = self.initializer("rotary_angles", angles)
            self.turns = [self.initializer("rotary_cos", np.cos(angles)), self.initializer("rotary_sin",
                                                                                            np.sin(angles))]
        self.scales = {}
        encoded = None
        if "encoder" in model.attention_parts:  # the encoder reads the source first
            self.add_input("source_ids", self.proto.INT64, [1, "source"])
            source, _ = self.embedded("source_ids", self.constant(0), kept=False)
            self.keep(source, "source_embedding")
            for index, block in enumerate(model.encoder_blocks):
                source = self.block(block, f"encoder_layer_{index}", source, "encoder")
            if model.encoder_norm is not None:
                source = self.norm(model.encoder_norm, source, "encoder_norm")
            encoded = self.keep(source, "encoded", unbatched=False)
        self.add_input("input_ids", self.proto.INT64, [1, "tokens"])
        past = self.constant(0)
        if not self.inside:
            for name in cache_names(config.n_layer):
                self.add_input(name, self.proto.FLOAT, [1, config.kv_heads, "past", config.head_size])
            past = self.node("Squeeze", [self.node("Shape", ["past_key_0"], start=2, end=3), self.constant([0])])
        x, positions = self.embedded("input_ids", past)
        # Query t (at P + t) sees every key up to its own position: (T, P + T).
        keys = self.node("Range", [self.constant(0), self.node("Add", [past, self.length("input_ids")]),
                                   self.constant(1)])
        self.visible = self.node("LessOrEqual", [self.node("Unsqueeze", [keys, self.constant([0])]),
                                                 self.node("Unsqueeze", [positions, self.constant([1])])])
        weights = []
        for index, block in enumerate(model.blocks):
            x = self.block(block, f"layer_{index}", x, "decoder", encoded, weights)
        if model.final_norm is not None:
            x = self.norm(model.final_norm, x, "final_norm")
        self.head(model, x, weights)

    def embedded(self, ids, past, kept=True):
        """The ids' (1, T) vectors at positions past .. past + T - 1, their positions added where a table holds
        them, the rotation set for their positions where they turn: (x (1, T, C), positions (T,)). `kept`: the
        steps kept, as a text's."""
        positions = self.node("Range", [past, self.node("Add", [past, self.length(ids)]), self.constant(1)])  # (T,)
        x = self.node("Gather", [self.table, ids])  # (1, T, C)
        if kept:
            self.token_vectors = self.keep(x, "token_embedding")
        if self.positions_table is not None:
            added = self.node("Gather", [self.positions_table, positions])  # (T, C)
            if kept:
                self.keep(added, "position", batched=False)
            x = self.node("Add", [x, added])
        self.rotation = None
        if hasattr(self, "angles"):
            if kept:
                self.keep(self.node("Gather", [self.angles, positions]), "rotary_angles", batched=False)
            self.rotation = [*self.turns, self.node("Unsqueeze", [positions, self.constant([0])])]
        if kept:
            self.keep(x, "embedding")
        return x, positions

    def length(self, ids):
        """How many tokens `ids` (1, T) holds, as a scalar."""
        return self.node("Squeeze", [self.node("Shape", [ids], start=1, end=2), self.constant([0])])

    def head(self, model, x, weights):
        """The output layer: the decoding step's next-token logits (1, V) after its last token and every block's
        attention weights; the inside graph's logits (T, V) at every position and each token's nearest tokens."""
        config = self.config
        if self.inside:
            x = self.keep(x, "final_normed")  # (T, C)
        else:  # only the last token's logits choose anything
            x = self.node("Gather", [x, self.node("Sub", [self.length("input_ids"), self.constant(1)])], axis=1)
        if config.tie_weights:
            logits = self.node("Gemm", [x, self.table], transB=1)
        else:
            logits = self.node("MatMul", [x, self.weight("output_head", weight_array(model.embedding.token_embedding,
                                                                                     "reverse_embeddings"))])
        if self.inside:
            self.keep(logits, "logits", batched=False)  # (T, V)
            self.neighbours(self.token_vectors, self.table, min(NEIGHBOURS, config.vocab_size))
            return
        self.output(logits, "logits", [1, config.vocab_size])
        # ONNX's shape inference leaves the Attention weights' last dimension blank, which ONNX Runtime reads as 0
        # and then warns of at every step; a reshape to the shape the tensor has at run time tells it nothing.
        attention = self.node("Concat", weights, axis=0)
        attention = self.node("Reshape", [attention, self.node("Shape", [attention])])
        self.output(attention, "attention", [config.n_layer, config.n_head, "tokens", "past_and_tokens"])

    def neighbours(self, vectors, table, count):
        """The `count` tokens whose vectors in `table` (V, C) are nearest each of `vectors` (T, C), by dot product
        and by cosine similarity."""
        dot = self.node("Gemm", [vectors, table], transB=1)  # (T, V)
        floor = self.constant(np.float32(1e-12))
        lengths = self.node("Max", [self.node("ReduceL2", [vectors, self.constant([1])], keepdims=1), floor])
        table_lengths = self.node("Max", [self.node("ReduceL2", [table, self.constant([1])], keepdims=0), floor])
        cosine = self.node("Div", [self.node("Div", [dot, lengths]), table_lengths])
        for by, values in (("dot", dot), ("cosine", cosine)):
            best, ids = self.node("TopK", [values, self.constant([count])], outputs=2, axis=-1)
            self.keep(best, f"neighbours_{by}", batched=False)
            self.keep(ids, f"neighbours_{by}_ids", batched=False, kind=self.proto.INT64)

    def block(self, block, named, x, part, encoded=None, weights=None):
        """One block, pre- or post-norm, each step kept as <named>.<step> (`named`: layer_N, or encoder_layer_N for
        a Seq2Seq's encoder, whose heads are `part`'s; a decoder's block attends over `encoded` (1, S, C) too):
        x (1, T, C) -> x. The decoding step appends its attention weights (1, H, T, S) to `weights`."""
        def keep(tensor, step, **kwargs):
            return self.keep(tensor, f"{named}.{step}", **kwargs)

        def attention(normed):
            if self.inside:
                return self.inside_attention(block.attention, named, normed, keep, part)
            attended, block_weights = self.attention(block.attention, named, normed)
            weights.append(block_weights)
            return attended

        keep(x, "input")
        x = self.residual(block, block.attention_norm, f"{named}.attention_norm", x, "attention_normed", keep,
                          attention, "attention_output")
        keep(x, "attention_residual")
        if block.has_cross_attention:
            x = self.residual(block, block.cross_attention_norm, f"{named}.cross_attention_norm", x, "cross_normed",
                              keep, lambda normed: self.inside_attention(block.cross_attention, named, normed, keep,
                                                                         "cross", encoded, "cross_"), "cross_output")
            keep(x, "cross_residual")
        x = self.residual(block, block.feed_forward_norm, f"{named}.feed_forward_norm", x, "feed_forward_normed",
                          keep, lambda normed: self.feed_forward(block.feed_forward, named, normed, keep),
                          "feed_forward_output")
        keep(x, "output")
        return x

    def residual(self, block, norm, name, x, normed_step, keep, sublayer, output_step):
        """x plus `sublayer` of it (its output kept as `output_step`), normalised before (its input kept as
        `normed_step`) or after (post-norm)."""
        post = block.config.norm_position == "post"
        normed = x if post else keep(self.norm(norm, x, name), normed_step, unbatched=False)
        x = self.node("Add", [x, keep(sublayer(normed), output_step, unbatched=False)])
        return self.norm(norm, x, name) if post else x

    def attention(self, layer, named, x):
        """The decoding step's causal self-attention over the cache and the new tokens: (1, T, C) -> (1, T, C),
        weights (1, H, T, S). ONNX's own Attention (grouped-query where K < H) appends the new keys and values to
        the cache."""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        index = named.rsplit("_", 1)[1]
        query, key, value = self.projected(layer, named, x)
        if config.qk_norm:
            query = self.norm(layer.query_norm, query, f"{named}.attention.query_norm")
            key = self.norm(layer.key_norm, key, f"{named}.attention.key_norm")
        if self.rotation is not None:  # (1, H|K, T, D), dimension i turned with i + D/2
            query, key = (self.node("RotaryEmbedding", [part, *self.rotation], interleaved=0) for part in (query, key))
        attended, key, value, weights = self.node(
            "Attention", [query, key, value, self.visible, f"past_key_{index}", f"past_value_{index}"], outputs=4,
            qk_matmul_output_mode=3)  # (1, H, T, D), the cache (1, K, S, D) twice, the weights (1, H, T, S)
        self.output(key, f"present_key_{index}", [1, kv, "past_and_tokens", size])
        self.output(value, f"present_value_{index}", [1, kv, "past_and_tokens", size])
        attended = self.node("Reshape", [self.node("Transpose", [attended], perm=[0, 2, 1, 3]),
                                         self.constant([1, -1, heads * size])])
        return self.linear(layer.output_projection, attended, f"{named}.attention.output"), weights

    def inside_attention(self, layer, named, x, keep, part, context=None, step=""):
        """Attention written out, step by step, each kept as <step><name>: causal self-attention, an encoder's over
        the whole of x, or cross-attention over `context` (1, S, C); each head's weighted values scaled by `part`'s
        head scale: (1, T, C) -> (1, T, C)."""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        if layer.causal:
            query, key, value = self.projected(layer, named, x)
            self.keep_head_weights(layer.qkv_projection, f"{named}.attention.qkv", ("query", "key", "value"),
                                   [heads, kv, kv], keep, step)
        else:
            query = self.node("Transpose", [self.node("Reshape", [
                self.linear(layer.query_projection, x, f"{named}.{step}query"), self.constant([1, -1, heads, size])])],
                perm=[0, 2, 1, 3])  # (1, H, T, D)
            key_value = self.node("Reshape", [self.linear(layer.key_value_projection, x if context is None else context,
                                                          f"{named}.{step}key_value"),
                                              self.constant([1, -1, 2 * kv, size])])  # (1, S, 2K, D)
            key, value = (self.node("Transpose", [part_], perm=[0, 2, 1, 3])
                          for part_ in self.node("Split", [key_value], axis=2, outputs=2, num_outputs=2))
            self.keep_head_weights(layer.query_projection, f"{named}.{step}query", ("query",), [heads], keep, step)
            self.keep_head_weights(layer.key_value_projection, f"{named}.{step}key_value", ("key", "value"),
                                   [kv, kv], keep, step)
        for tensor, name in ((query, "query"), (key, "key"), (value, "value")):
            keep(tensor, step + name)  # (H|K, T, D)
        if config.qk_norm:  # over each head's D numbers, as the layer norms them
            query = keep(self.norm(layer.query_norm, query, f"{named}.{step}query_norm"), step + "query_normed",
                         unbatched=False)
            key = keep(self.norm(layer.key_norm, key, f"{named}.{step}key_norm"), step + "key_normed", unbatched=False)
        if self.rotation is not None and layer.rotary:
            query, key = (self.node("RotaryEmbedding", [tensor, *self.rotation], interleaved=0) for tensor in (query,
                                                                                                             key))
            keep(query, step + "query_rotated")
            keep(key, step + "key_rotated")
        groups = heads // kv
        if groups > 1:  # query head h reads key/value head h // G
            key, value = (self.node("Reshape", [self.node("Tile", [self.node("Unsqueeze", [tensor, self.constant([2])]),
                                                                    self.constant([1, 1, groups, 1, 1])]),
                                                self.constant([1, heads, -1, size])]) for tensor in (key, value))
        products = keep(self.node("MatMul", [query, self.node("Transpose", [key], perm=[0, 1, 3, 2])]),
                        step + "products", unbatched=False)  # (1, H, T, S): q.k
        scores = keep(self.node("Div", [products, self.constant(np.float32(np.sqrt(size)))]), step + "scores",
                      unbatched=False)
        if layer.causal:  # an encoder and cross-attention see every token of one whole source
            lowest = self.constant(np.float32(np.finfo(np.float32).min))
            scores = self.node("Where", [self.visible, scores, lowest])
        weights = keep(self.node("Softmax", [scores], axis=-1), step + "attention", unbatched=False)
        attended = self.node("MatMul", [weights, value])  # (1, H, T, D)
        attended = keep(self.node("Mul", [attended, self.head_scale(part, named)]), step + "heads", unbatched=False)
        joined = keep(self.node("Reshape", [self.node("Transpose", [attended], perm=[0, 2, 1, 3]),
                                            self.constant([1, -1, heads * size])]), step + "joined", unbatched=False)
        return self.linear(layer.output_projection, joined, f"{named}.{step}output")

    def keep_head_weights(self, projection, name, parts, counts, keep, step):
        """In the inside graph, keep the weights of `projection` (written as `name`), the heads of each of `parts`
        side by side, by head, as `Attention.head_weights` gives them: <step><part>_weight (n, C, D) and, with a
        bias, <step><part>_bias (n, D), from the graph's own weights (as stored: f16 or int8 widened)."""
        if not self.inside:
            return
        size = self.config.head_size
        kernel = self.node("Reshape", [self.prefix + f"{name}.kernel", self.constant([0, -1, size])])  # (C, n, D)
        kernels = self.node("Split", [kernel, self.constant(counts)], axis=1, outputs=len(parts))
        for part, tensor in zip(parts, kernels if len(parts) > 1 else [kernels]):
            keep(self.node("Transpose", [tensor], perm=[1, 0, 2]), f"{step}{part}_weight", batched=False)
        if projection.bias is not None:
            bias = self.node("Reshape", [self.prefix + f"{name}.bias", self.constant([-1, size])])  # (n, D)
            biases = self.node("Split", [bias, self.constant(counts)], axis=0, outputs=len(parts))
            for part, tensor in zip(parts, biases if len(parts) > 1 else [biases]):
                keep(tensor, f"{step}{part}_bias", batched=False)

    def head_scale(self, part, named):
        """Block `named`'s row of `part`'s head-scale input (L, H), shaped (1, H, 1, 1) to scale its heads; the
        input is added where a part first needs it. (An input, not an initializer that a caller may override: ONNX
        Runtime warns of those, and folds no constant it could.)"""
        name = HEAD_SCALES[part]
        if name not in self.scales:
            self.add_input(name, self.proto.FLOAT, [self.config.n_layer, self.config.n_head])
            self.scales[name] = name
        row = self.node("Gather", [name, self.constant(int(named.rsplit("_", 1)[1]))], axis=0)  # (H,)
        return self.node("Reshape", [row, self.constant([1, -1, 1, 1])])

    def projected(self, layer, named, x):
        """A causal attention layer's queries (1, H, T, D), keys and values (1, K, T, D) of x (1, T, C): one product,
        split. (QK-norm, over each head's D numbers, reads them so as well as before the heads come first.)"""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        qkv = self.node("Reshape", [self.linear(layer.qkv_projection, x, f"{named}.attention.qkv"),
                                    self.constant([1, -1, heads + 2 * kv, size])])  # (1, T, H + 2K, D)
        parts = self.node("Split", [qkv, self.constant([heads, kv, kv])], axis=2, outputs=3)
        return [self.node("Transpose", [part], perm=[0, 2, 1, 3]) for part in parts]

    def feed_forward(self, layer, named, x, keep):
        name = f"{named}.feed_forward"
        hidden = keep(FEED_FORWARD_FORMS[layer.mlp](self, self.linear(layer.expand, x, f"{name}.expand"), keep),
                      "hidden", unbatched=False)
        return self.linear(layer.contract, hidden, f"{name}.contract")

    def gelu_hidden(self, expanded, keep):  # GPT-2's tanh approximation
        return self.node("Gelu", [keep(expanded, "expanded", unbatched=False)], approximate="tanh")

    def swiglu_hidden(self, expanded, keep):
        gate, up = self.node("Split", [expanded], axis=-1, outputs=2, num_outputs=2)
        keep(gate, "gate")
        keep(up, "up")
        return self.node("Mul", [self.node("Mul", [gate, self.node("Sigmoid", [gate])]), up])

    def relu2_hidden(self, expanded, keep):
        rectified = self.node("Relu", [keep(expanded, "expanded", unbatched=False)])
        return self.node("Mul", [rectified, rectified])

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

    # --- writing nodes, weights, inputs and outputs

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

    def add_input(self, name, kind, shape):
        self.inputs.append(self.helper.make_tensor_value_info(name, kind, shape))

    def output(self, name, as_name, shape, kind=None):
        self.nodes.append(self.helper.make_node("Identity", [name], [as_name], name=as_name))
        self.outputs.append(self.helper.make_tensor_value_info(as_name, kind or self.proto.FLOAT, shape))

    def keep(self, tensor, name, batched=True, unbatched=True, kind=None):
        """In the inside graph, make `tensor` an output called `name`, its batch of one left out where it is
        `batched`. Returns, where `unbatched`, what was output (the tensor without its batch); else the tensor
        itself, to compute on. The decoding step keeps nothing: the tensor itself."""
        if not self.inside:
            return tensor
        kept = self.node("Squeeze", [tensor, self.constant([0])]) if batched else tensor
        self.output(kept, name, None, kind)
        return kept if unbatched else tensor


# Each feed-forward kind's ONNX form, by its name in `gptlite.model.config.MLP_KINDS`: its hidden activations from
# its widened vector, as `gptlite.model.layers.FEED_FORWARD_KINDS` computes them.
FEED_FORWARD_FORMS = {"gelu": Graph.gelu_hidden, "swiglu": Graph.swiglu_hidden, "relu2": Graph.relu2_hidden}
