"""The optimizer a run trains with (`make_optimizer`: AdamW or Muon, weight decay on matrices only) and its
learning-rate schedule; `FlatAdamW`, Keras's AdamW over one flat vector: the same update, as a few operations
whatever the number of variables."""

import keras
import numpy as np
from keras import ops

from gptlite.backend.runtime import running


class FlatAdamW(keras.optimizers.AdamW):
    """Keras's AdamW, with global-norm clipping and weight-decay exclusions, applied to all variables at once.

    Keras updates each variable with operations of its own. Under TensorFlow
    every operation of the traced training step holds memory of its own,
    whatever its tensors' size: LoRA on GPT-2 small has 96 adapter matrices
    of 768 x 8 or so, and their clip, decay and moment updates held ~140 MB
    more than one update of the concatenated numbers (2026-11-24, machine A,
    TensorFlow without XLA). Here the gradients are concatenated into one
    vector, clipped, and moved with two moment vectors; each variable is then
    assigned its slice. The concatenation copies every trainable number, so
    this suits few small variables (adapters), not a whole model's.

    Gradients of the same variables in the same order as the optimizer was
    built with are expected; only `global_clipnorm` clips. Not for a
    TensorFlow strategy with several replicas: the update bypasses Keras's
    cross-replica step.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.clipnorm or self.clipvalue or self.amsgrad or self.use_ema:
            raise ValueError("FlatAdamW clips by global_clipnorm only, without amsgrad or use_ema")

    def build(self, variables):
        if self.built:
            return
        # The optimizer's common state, without Adam's two moments per variable.
        super(keras.optimizers.Adam, self).build(variables)
        self._sizes = [int(np.prod(variable.shape)) for variable in variables]
        self._flat_momentum = self.add_variable((sum(self._sizes),), name="flat_momentum")
        self._flat_velocity = self.add_variable((sum(self._sizes),), name="flat_velocity")

    def _clip_gradients(self, grads):
        return grads  # in _backend_update_step, on the flat vector

    def _apply_weight_decay(self, variables):
        pass  # in _backend_update_step, on the flat vector

    def _backend_update_step(self, grads, variables, learning_rate):
        if [id(v) for v in variables] != [id(v) for v in self._trainable_variables]:
            raise ValueError("FlatAdamW needs a gradient for every variable it was built with, in order")
        dtype = self._flat_momentum.dtype
        gradient = ops.concatenate([ops.reshape(ops.cast(g, dtype), (-1,)) for g in grads])  # (N,)
        values = ops.concatenate([ops.reshape(v, (-1,)) for v in variables])  # (N,)
        if self.global_clipnorm:
            # Keras's clip_by_global_norm: scale by clip / norm where the norm is larger.
            norm = ops.sqrt(ops.sum(ops.square(gradient)))
            gradient = gradient * (self.global_clipnorm * ops.minimum(1.0 / norm, 1.0 / self.global_clipnorm))
        learning_rate = ops.cast(learning_rate, dtype)
        if self.weight_decay:
            # 1 where the variable decays, 0 where it is excluded.
            decays = np.concatenate([np.full(size, float(self._use_weight_decay(v)), dtype)
                                     for v, size in zip(variables, self._sizes)])
            values = values - values * ops.convert_to_tensor(decays) * (ops.cast(self.weight_decay, dtype)
                                                                        * learning_rate)
        step = ops.cast(self.iterations + 1, dtype)
        alpha = learning_rate * ops.sqrt(1 - ops.power(ops.cast(self.beta_2, dtype), step)) / (
            1 - ops.power(ops.cast(self.beta_1, dtype), step))
        momentum = self._flat_momentum + (gradient - self._flat_momentum) * (1 - self.beta_1)
        velocity = self._flat_velocity + (ops.square(gradient) - self._flat_velocity) * (1 - self.beta_2)
        self.assign(self._flat_momentum, momentum)
        self.assign(self._flat_velocity, velocity)
        values = values - momentum * alpha / (ops.sqrt(velocity) + self.epsilon)
        for variable, part in zip(variables, ops.split(values, np.cumsum(self._sizes)[:-1].tolist())):
            self.assign(variable, ops.reshape(part, variable.shape))


def learning_rate_schedule(config):
    """Linear warm-up to `lr`, then cosine decay to `min_lr` at `max_iters`, counted in optimizer steps."""
    schedule = keras.optimizers.schedules.CosineDecay(
        # Start above zero so the first step is not wasted.
        initial_learning_rate=config.lr / (config.warmup_iters + 1),
        warmup_target=config.lr,
        warmup_steps=config.warmup_iters,
        decay_steps=config.max_iters - config.warmup_iters,
        alpha=config.min_lr / config.lr,
    )
    return schedule if config.grad_accum == 1 else _PerOptimizerStep(schedule, config.grad_accum)


class _PerOptimizerStep(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule of optimizer steps, for an optimizer that accumulates gradients.

    Keras calls the schedule with the count of micro-batches; the step that
    applies the accumulated gradients of optimizer step s is micro-batch
    (s + 1) * micro_batches - 1, and must get the rate of step s.
    """

    def __init__(self, schedule, micro_batches):
        self.schedule = schedule
        self.micro_batches = micro_batches

    def __call__(self, micro_step):
        return self.schedule(keras.ops.floor_divide(micro_step, self.micro_batches))

    def get_config(self):
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule), "micro_batches": self.micro_batches}


def make_optimizer(model, config):
    """AdamW (or Muon, see `settings.OPTIMIZERS`) with clipping at global norm 1.0, decaying only weight matrices.

    Decaying biases, norms or embeddings pulls them towards zero for no gain in
    generalisation, so they are left out. With `grad_accum` above 1, Keras
    adds up that many micro-batches' gradients and applies their mean (clipped)
    once. `model` must be built.
    """
    common = dict(learning_rate=learning_rate_schedule(config), weight_decay=config.weight_decay,
                  global_clipnorm=1.0,
                  gradient_accumulation_steps=config.grad_accum if config.grad_accum > 1 else None)
    if config.optimizer == "muon":
        # Muon moves only 2-D variables, and leaves those whose path names an embedding (the token and position
        # tables, and an untied head: the embedding layer's reverse matrix) to AdamW. Its updates are scaled to
        # AdamW's size (rms_rate), so both take the run's learning rate and weight decay.
        optimizer = keras.optimizers.Muon(**common, adam_weight_decay=config.weight_decay, adam_beta_1=0.9,
                                          adam_beta_2=config.beta2, exclude_embeddings=True,
                                          ns_steps=config.newton_schulz_steps, momentum=config.muon_momentum)
    else:
        # LoRA trains a few small adapter matrices: one update over their
        # concatenation holds less memory than one per matrix (FlatAdamW).
        flat = config.lora_rank and not running().mirrors_variables()
        optimizer = (FlatAdamW if flat else keras.optimizers.AdamW)(**common, beta_1=0.9, beta_2=config.beta2)
    embedding_tables = [
        v for v in model.embedding.trainable_variables
        if v.name in ("embeddings", "position_embeddings")
    ]
    vectors = [v for v in model.trainable_variables if len(v.shape) < 2]
    optimizer.exclude_from_weight_decay(var_list=embedding_tables + vectors)
    return optimizer
