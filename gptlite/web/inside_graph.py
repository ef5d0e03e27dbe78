"""A GPT's forward pass over a text as an ONNX graph that gives every step it takes, for the page's Inside view:
the numbers it shows are this graph's, computed from the model's weights by ONNX Runtime in the page, not by
JavaScript. Its outputs are named and shaped as `gptlite.trace` names and shapes the steps (the trace's `STEPS`
and, for block N, `layer_N.` and its `LAYER_STEPS`), so that the page's view reads either.

    inputs   input_ids (1, T) int64: the text's tokens at positions 0 .. T - 1, T <= block_size
    outputs  token_embedding (T, C), position_table and position (learned or sinusoidal), rotary_angles (rotary),
             embedding (T, C); for each block layer_N.input, .query (H, T, D), .scores (H, T, T), .attention,
             ... (see `gptlite.evaluation.trace`); final_normed (T, C), logits (T, V); the NEIGHBOURS nearest
             tokens of each token's vector by cosine and by dot product, values (T, k) and ids (T, k) int64.

Unlike the decoding step (`onnx_graph`), which attends with ONNX's fused Attention over a cache, this graph
writes attention out (the product, the scaling, the mask, the softmax, the weighted sum) to keep each; it has no
cache, and runs once for a text, when the reader looks inside.
"""

import numpy as np

from gptlite.model.layers import weight_array
from gptlite.model.positions import rotary_angles
from gptlite.web import onnx_graph

NEIGHBOURS = 10  # as gptlite.evaluation.trace.NEIGHBOURS (a room below cannot read it): the tests hold them equal


def inside_graph(model, outtype="f32"):
    """The forward pass of a GPT with every step an output (see the module's docstring), an `onnx.ModelProto`."""
    import onnx

    graph = _Inside(model.config, outtype)
    graph.write(model)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(graph.nodes, "gptlite_inside", graph.inputs, graph.outputs, graph.initializers),
        opset_imports=[onnx.helper.make_opsetid("", onnx_graph.OPSET)], producer_name="gptlite")
    proto.ir_version = 10
    return proto


def reads_a_source(model):
    """Whether the model reads a source through an encoder (a Seq2Seq's `encoder_blocks`): its graph takes
    source_ids too, and its page writes a target for a source rather than continuing a prompt."""
    return bool(getattr(model, "encoder_blocks", None))


class _Inside(onnx_graph.Graph):
    """The decoding step's writer, made to write a whole forward pass and keep each step as an output."""

    def write(self, model):
        config, helper, types = self.config, self.helper, self.proto
        embedding = model.embedding
        self.table = self.weight("token_embedding", weight_array(embedding.token_embedding, "embeddings"), rows=True)
        if embedding.position_embeddings is not None:
            self.positions_table = self.weight("position_table", weight_array(embedding, "position_embeddings"),
                                               rows=True)
            self.keep(self.positions_table, "position_table", batched=False)
        if config.position == "rotary":
            angles = np.asarray(rotary_angles(np.arange(config.block_size), config.head_size, config.rope_theta),
                                np.float32)  # (block_size, D/2)
            self.angles = self.initializer("rotary_angles", angles)
            self.turns = [self.initializer("rotary_cos", np.cos(angles)), self.initializer("rotary_sin",
                                                                                            np.sin(angles))]
        encoded = None
        if reads_a_source(model):  # the encoder reads the source first
            self.inputs.append(helper.make_tensor_value_info("source_ids", types.INT64, [1, "source"]))
            source, _, _ = self.embedded("source_ids", kept=False)
            self.keep(source, "source_embedding")
            for index, block in enumerate(model.encoder_blocks):
                source = self.inside_block(block, f"encoder_layer_{index}", source)
            if model.encoder_norm is not None:
                source = self.norm(model.encoder_norm, source, "encoder_norm")
            self.keep(source, "encoded")
            encoded = source
        self.inputs.append(helper.make_tensor_value_info("input_ids", types.INT64, [1, "tokens"]))
        x, positions, token_vectors = self.embedded("input_ids")
        # Query t sees key s where s <= t: (T, T).
        self.visible = self.node("LessOrEqual", [self.node("Unsqueeze", [positions, self.constant([0])]),
                                                 self.node("Unsqueeze", [positions, self.constant([1])])])
        for index, block in enumerate(model.blocks):
            x = self.inside_block(block, f"layer_{index}", x, encoded)
        if model.final_norm is not None:
            x = self.norm(model.final_norm, x, "final_norm")
        final = self.keep(x, "final_normed")  # (T, C)
        if config.tie_weights:
            logits = self.node("Gemm", [final, self.table], transB=1)
        else:
            logits = self.node("MatMul", [final, self.weight("output_head", weight_array(
                embedding.token_embedding, "reverse_embeddings"))])
        self.keep(logits, "logits", batched=False)  # (T, V)
        self.neighbours(token_vectors, self.table, min(NEIGHBOURS, config.vocab_size))

    def embedded(self, ids, kept=True):
        """The ids' (1, T) vectors, their positions added where a table holds them, the rotation set for their
        positions where they turn: (x (1, T, C), positions (T,), the token vectors (T, C)). `kept`: the steps kept,
        as a text's."""
        tokens = self.node("Squeeze", [self.node("Shape", [ids], start=1, end=2), self.constant([0])])
        positions = self.node("Range", [self.constant(0), tokens, self.constant(1)])  # (T,)
        x = self.node("Gather", [self.table, ids])  # (1, T, C)
        vectors = self.keep(x, "token_embedding") if kept else None
        if hasattr(self, "positions_table"):
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
        return x, positions, vectors

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

    def inside_block(self, block, named, x, encoded=None):
        """One block, pre- or post-norm, each step kept as <named>.<step> (`named`: layer_N, or encoder_layer_N for
        a Seq2Seq's encoder; a decoder's block attends over `encoded` (1, S, C) too): x (1, T, C) -> x."""
        def keep(tensor, step, **kwargs):
            return self.keep(tensor, f"{named}.{step}", **kwargs)

        keep(x, "input")
        x = self.residual(block, block.attention_norm, f"{named}.attention_norm", x, "attention_normed", keep,
                          lambda normed: self.inside_attention(block.attention, named, normed, keep))
        keep(x, "attention_residual")
        if block.has_cross_attention:
            x = self.residual(block, block.cross_attention_norm, f"{named}.cross_attention_norm", x, "cross_normed",
                              keep, lambda normed: self.inside_attention(block.cross_attention, named, normed, keep,
                                                                         encoded, "cross_"))
            keep(x, "cross_residual")
        x = self.residual(block, block.feed_forward_norm, f"{named}.feed_forward_norm", x, "feed_forward_normed",
                          keep, lambda normed: self.inside_feed_forward(block.feed_forward, named, normed, keep))
        keep(x, "output")
        return x

    def residual(self, block, norm, name, x, normed_step, keep, sublayer):
        """x plus `sublayer` of it, normalised before (its input kept as `normed_step`) or after (post-norm)."""
        post = block.config.norm_position == "post"
        normed = x if post else keep(self.norm(norm, x, name), normed_step, unbatched=False)
        x = self.node("Add", [x, sublayer(normed)])
        return self.norm(norm, x, name) if post else x

    def inside_attention(self, layer, named, x, keep, context=None, step=""):
        """Attention written out, step by step, each kept as <step><name>: causal self-attention, an encoder's over
        the whole of x, or cross-attention over `context` (1, S, C): (1, T, C) -> (1, T, C)."""
        config = self.config
        heads, kv, size = config.n_head, config.kv_heads, config.head_size
        if layer.causal:
            query, key, value = self.projected(layer, named, x)
        else:
            query = self.node("Transpose", [self.node("Reshape", [
                self.linear(layer.query_projection, x, f"{named}.{step}query"), self.constant([1, -1, heads, size])])],
                perm=[0, 2, 1, 3])  # (1, H, T, D)
            key_value = self.node("Reshape", [self.linear(layer.key_value_projection, x if context is None else context,
                                                          f"{named}.{step}key_value"),
                                              self.constant([1, -1, 2 * kv, size])])  # (1, S, 2K, D)
            key, value = (self.node("Transpose", [part], perm=[0, 2, 1, 3])
                          for part in self.node("Split", [key_value], axis=2, outputs=2, num_outputs=2))
        for part, name in ((query, "query"), (key, "key"), (value, "value")):
            keep(part, step + name)  # (H|K, T, D)
        if config.qk_norm:  # over each head's D numbers, as the layer norms them
            query = keep(self.norm(layer.query_norm, query, f"{named}.{step}query_norm"), step + "query_normed",
                         unbatched=False)
            key = keep(self.norm(layer.key_norm, key, f"{named}.{step}key_norm"), step + "key_normed", unbatched=False)
        if self.rotation is not None and layer.rotary:
            query, key = (self.node("RotaryEmbedding", [part, *self.rotation], interleaved=0) for part in (query, key))
            keep(query, step + "query_rotated")
            keep(key, step + "key_rotated")
        groups = heads // kv
        if groups > 1:  # query head h reads key/value head h // G
            key, value = (self.node("Reshape", [self.node("Tile", [self.node("Unsqueeze", [part, self.constant([2])]),
                                                                    self.constant([1, 1, groups, 1, 1])]),
                                                self.constant([1, heads, -1, size])]) for part in (key, value))
        products = keep(self.node("MatMul", [query, self.node("Transpose", [key], perm=[0, 1, 3, 2])]),
                        step + "products", unbatched=False)  # (1, H, T, S): q.k
        scores = keep(self.node("Div", [products, self.constant(np.float32(np.sqrt(size)))]), step + "scores",
                      unbatched=False)
        if layer.causal:  # an encoder and cross-attention see every token of one whole source
            lowest = self.constant(np.float32(np.finfo(np.float32).min))
            scores = self.node("Where", [self.visible, scores, lowest])
        weights = keep(self.node("Softmax", [scores], axis=-1), step + "attention", unbatched=False)
        attended = keep(self.node("MatMul", [weights, value]), step + "heads", unbatched=False)  # (1, H, T, D)
        joined = keep(self.node("Reshape", [self.node("Transpose", [attended], perm=[0, 2, 1, 3]),
                                            self.constant([1, -1, heads * size])]), step + "joined", unbatched=False)
        return keep(self.linear(layer.output_projection, joined, f"{named}.{step}output"),
                    step + "output" if step else "attention_output", unbatched=False)

    def inside_feed_forward(self, layer, named, x, keep):
        name = f"{named}.feed_forward"
        expanded = self.linear(layer.expand, x, f"{name}.expand")
        if layer.mlp == "swiglu":
            gate, up = self.node("Split", [expanded], axis=-1, outputs=2, num_outputs=2)
            keep(gate, "gate")
            keep(up, "up")
            hidden = self.node("Mul", [self.node("Mul", [gate, self.node("Sigmoid", [gate])]), up])
        else:
            keep(expanded, "expanded")
            if layer.mlp == "relu2":
                rectified = self.node("Relu", [expanded])
                hidden = self.node("Mul", [rectified, rectified])
            else:
                hidden = self.node("Gelu", [expanded], approximate="tanh")
        keep(hidden, "hidden")
        return keep(self.linear(layer.contract, hidden, f"{name}.contract"), "feed_forward_output", unbatched=False)

    def keep(self, tensor, name, batched=True, unbatched=True, kind=None):
        """Make `tensor` an output called `name`, its batch of one left out where it is `batched`. Returns, where
        `unbatched`, what was output (the tensor without its batch); else the tensor itself, to compute on."""
        kept = self.node("Squeeze", [tensor, self.constant([0])]) if batched else tensor
        self.nodes.append(self.helper.make_node("Identity", [kept], [name], name=name))
        self.outputs.append(self.helper.make_tensor_value_info(name, kind or self.proto.FLOAT, None))
        return kept if unbatched else tensor
