"""Loss, optimizer, learning-rate schedule and the jitted train and eval steps.

One code path runs on 1 CPU, N local devices or several processes:

    mesh = make_mesh()                                        # axis "data" over jax.devices()
    graphdef, static_state, state = create_train_state(model_config, optimizer_config, mesh)
    train_step = make_train_step(graphdef, optimizer_config, mesh)
    eval_step = make_eval_step(graphdef, mesh, optimizer_config)
    for local_batch in batches:                               # this process's rows, numpy
        state, metrics = train_step(state, shard_batch(local_batch, mesh))

The model is split once (`nnx.split`); the steps are `jax.jit`-compiled pure functions of the
parameters that rebuild the module with `nnx.merge` inside the trace, so no Python graph
traversal happens per step. The batch is split over the mesh axis "data" and everything else
is replicated; the gradient all-reduce comes from XLA, because the loss is computed on the
global batch. Metrics stay on the device: read them at log intervals only.

Loss (per target token t with label y_t, log-probabilities lp = log_softmax(logits_t), vocabulary
size V, smoothing eps): the target distribution puts 1 - eps on y_t and eps / (V - 1) on each
other token (Szegedy et al. 2016 as used by the paper, tensor2tensor and fairseq), so

    loss_t = -(1 - eps) lp[y_t] - eps / (V - 1) * sum_{v != y_t} lp[v]
           = (1 - eps - eps / (V - 1)) * nll_t + eps / (V - 1) * (-sum_v lp[v])

with nll_t = -lp[y_t]. The constant entropy of the smoothed target is not subtracted, so with
eps > 0 the loss cannot reach 0. Both are summed over the non-pad target tokens of the whole
(global, accumulated) batch and divided by their number: every token weighs the same, whatever
row, micro-batch, device or process it came from.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from transformer.config import ModelConfig, OptimizerConfig
from transformer.layers import Packing
from transformer.model import Transformer

Array = jax.Array
Batch = dict[str, Array]
Metrics = dict[str, Array]

DATA_AXIS = "data"


# ----------------------------------------------------------------------------- optimizer


def learning_rate_schedule(optimizer_config: OptimizerConfig, d_model: int) -> optax.Schedule:
    """Learning rate as a function of optax's update count (0 for the first update).

    The paper numbers steps from 1, where count 0 would give lr 0 and waste the first update,
    so the formula is evaluated at s = count + 1.
    """
    warmup = float(optimizer_config.warmup_steps)
    if optimizer_config.schedule == "noam":
        scale = optimizer_config.lr_scale * d_model ** -0.5

        def noam(count):
            s = jnp.asarray(count, jnp.float32) + 1.0
            return scale * jnp.minimum(jax.lax.rsqrt(s), s * warmup ** -1.5)

        return noam

    peak = optimizer_config.peak_lr
    if optimizer_config.schedule == "linear":
        if optimizer_config.decay_steps is None:
            raise ValueError("the linear schedule needs OptimizerConfig.decay_steps, its last "
                             "update (train.py fits it to the run's limit)")
        decay = float(optimizer_config.decay_steps)

        def linear(count):
            # The line reaches zero one update after the last (decay): that update still learns.
            s = jnp.asarray(count, jnp.float32) + 1.0
            down = (decay + 1.0 - s) / (decay + 1.0 - warmup)
            return peak * jnp.maximum(jnp.minimum(s / warmup, down), 0.0)

        return linear

    def inverse_sqrt(count):
        s = jnp.asarray(count, jnp.float32) + 1.0
        return peak * jnp.minimum(s / warmup, jnp.sqrt(warmup / s))

    return inverse_sqrt


def _decay_mask(params: Any) -> Any:
    """True for matrices (kernels, embeddings): the parameters weight decay applies to."""
    return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(optimizer_config: OptimizerConfig, d_model: int) -> optax.GradientTransformation:
    """Adam (b1, b2, eps from the config) with the schedule; optional clipping and decay.

    The chain is optax.adamw's (scale_by_adam, add_decayed_weights, scale_by_learning_rate;
    with weight decay 0 the decay step passes the updates through unchanged, as optax.adam)
    behind clip_by_global_norm or identity. Its state has the same structure for every
    clip_norm and weight_decay, so a run resumes when either is changed.
    """
    schedule = learning_rate_schedule(optimizer_config, d_model)
    c = optimizer_config
    clip = optax.clip_by_global_norm(c.clip_norm) if c.clip_norm is not None else optax.identity()
    return optax.chain(
        clip,
        optax.scale_by_adam(b1=c.adam_b1, b2=c.adam_b2, eps=c.adam_eps),
        optax.add_decayed_weights(c.weight_decay, mask=_decay_mask),
        optax.scale_by_learning_rate(schedule),
    )


# ----------------------------------------------------------------------------- loss


def token_loss_sums(logits: Array, targets: Array, label_smoothing: float, pad_id: int = 0,
                    rdrop: float = 0.0) -> Metrics:
    """Sums over the non-pad target tokens of a batch; see the module docstring for the formula.

    logits [batch, tgt_len, vocab] (cast to float32), targets [batch, tgt_len] int.
    Returns float32 scalars `loss_sum` (label-smoothed), `nll_sum`, `correct` (tokens whose
    target has the highest logit; a tie counts as correct) and `tokens` (non-pad targets).
    With `rdrop` > 0 the rows are pairs of passes (`two_passes`) and the R-Drop term is added
    (`_with_rdrop`).

    No one-hot [batch, tgt_len, vocab] is built: with lp = logits - logsumexp(logits),
    nll = logsumexp - logits[y] and -sum_v lp[v] = V * logsumexp - sum_v logits[v].
    """
    vocab = logits.shape[-1]
    weights = (targets != pad_id).astype(jnp.float32)                # [batch, tgt_len]
    keep = weights > 0
    # Zeros at padding before anything is computed from the logits: whatever they hold there
    # (NaN, inf) then reaches neither the sums nor their gradient, where a select after the
    # loss would pass NaN on (0 * NaN). An element-wise select, which XLA fuses into the
    # reductions below.
    logits = jnp.where(keep[..., None], logits.astype(jnp.float32), 0.0)
    max_logit = jnp.max(logits, axis=-1)
    lse = max_logit + jnp.log(jnp.sum(jnp.exp(logits - max_logit[..., None]), axis=-1))
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = lse - target_logit                                         # [batch, tgt_len]
    if label_smoothing > 0:
        off = label_smoothing / (vocab - 1)
        smooth = vocab * lse - jnp.sum(logits, axis=-1)              # -sum_v lp[v]
        loss = (1.0 - label_smoothing - off) * nll + off * smooth
    else:
        loss = nll
    correct = (target_logit >= max_logit).astype(jnp.float32)

    def masked_sum(x):
        return jnp.sum(jnp.where(keep, x, 0.0))

    sums = {
        "loss_sum": masked_sum(loss),
        "nll_sum": masked_sum(nll),
        "correct": masked_sum(correct),
        "tokens": jnp.sum(weights),
    }
    if not rdrop:
        return sums
    return _with_rdrop(sums, logits - lse[..., None], keep, rdrop)


def two_passes(batch: Batch) -> Batch:
    """Every row twice, side by side: rows 2i and 2i + 1 are row i, for two dropout passes.

    Interleaved rather than stacked so that a batch split over devices by rows stays split
    the same way: each device doubles its own rows and no data moves.
    """
    return {name: jnp.repeat(x, 2, axis=0) for name, x in batch.items()}


def _with_rdrop(sums: Metrics, log_probs: Array, keep: Array, rdrop: float) -> Metrics:
    """R-Drop (Liang et al. 2021, Eq. 3) over rows paired by `two_passes`.

    With p1, p2 the two passes' distributions of a token, its KL term is the symmetric
    (KL(p1 || p2) + KL(p2 || p1)) / 2 = sum_v (p1 - p2)(lp1 - lp2) / 2, summed over the
    non-pad tokens as `kl_sum`. The paper's loss CE1 + CE2 + rdrop * KL is halved, so that
    `loss_sum` stays a sum over the batch's own tokens (one pass's worth): every sum of the
    two passes is halved and `loss_sum` adds rdrop / 2 * kl_sum.
    """
    rows, length, vocab = log_probs.shape
    pairs = log_probs.reshape(rows // 2, 2, length, vocab)            # [B, 2, T, V]
    difference = pairs[:, 0] - pairs[:, 1]                             # lp1 - lp2
    kl = 0.5 * jnp.sum((jnp.exp(pairs[:, 0]) - jnp.exp(pairs[:, 1])) * difference, axis=-1)
    kl_sum = jnp.sum(jnp.where(keep[::2], kl, 0.0))
    halved = {name: 0.5 * value for name, value in sums.items()}
    halved["loss_sum"] = halved["loss_sum"] + 0.5 * rdrop * kl_sum
    halved["kl_sum"] = kl_sum
    return halved


def chunked_loss_sums(graphdef: nnx.GraphDef, params: nnx.State, states: Array,
                      targets: Array, label_smoothing: float, pad_id: int, chunk: int,
                      rdrop: float = 0.0) -> Metrics:
    """`token_loss_sums` of the logits of decoder `states` [batch, tgt_len, d_model], made
    about `chunk` tokens at a time (every row, a span of positions), so that no [tokens,
    vocab] array of the whole batch exists.

    The logits are the largest arrays of a train step (4,096 tokens of an 8,000-piece
    vocabulary: 131 MB each, and autodiff keeps several), and XLA:CPU allocates all of a
    step's temporaries anew at every execution. Each chunk's gradient with respect to its
    logits is known in the forward pass (the loss is the last node: softmax minus the smoothed
    target, masked), so the forward pass also takes the output projection's backward for the
    chunk and keeps only the gradients of the states and of the projection's parameters; the
    backward pass scales them by the loss's cotangent. Same FLOPs as autodiff, no chunk
    computed twice; the rows stay the leading axis, so a batch split over devices stays split.
    Sums and gradients equal those of `token_loss_sums` up to float summation order. Only the
    cotangent of `loss_sum` flows back (the other sums are metrics).
    """
    batch, length, width = states.shape
    span = min(max(chunk // batch, 1), length)                # positions per chunk
    count = -(-length // span)
    padding = count * span - length
    states = jnp.pad(states, ((0, 0), (0, padding), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, padding)), constant_values=pad_id)
    xs = (jnp.moveaxis(states.reshape(batch, count, span, width), 1, 0),   # [count, B, span, d]
          jnp.moveaxis(targets.reshape(batch, count, span), 1, 0))         # [count, B, span]

    def logits_of(params, chunk_states):                # [B, span, d] -> f32 [B, span, vocab]
        return nnx.merge(graphdef, params).logits(chunk_states)

    def sums_of(logits, chunk_targets):
        return token_loss_sums(logits, chunk_targets, label_smoothing, pad_id, rdrop)

    def add(a, b):
        return jax.tree.map(jnp.add, a, b)

    names = ("loss_sum", "nll_sum", "correct", "tokens") + (("kl_sum",) if rdrop else ())
    zero_sums = {name: jnp.zeros((), jnp.float32) for name in names}

    @jax.custom_vjp
    def sums(params, xs):
        def body(total, x):
            return add(total, sums_of(logits_of(params, x[0]), x[1])), None
        return jax.lax.scan(body, zero_sums, xs)[0]

    def forward(params, xs):
        def body(carry, x):
            total, param_grads = carry
            chunk_states, chunk_targets = x
            logits, vjp = jax.vjp(logits_of, params, chunk_states)
            logit_grads = _loss_sum_logit_grads(logits, chunk_targets, label_smoothing, pad_id,
                                                rdrop)
            param_grad, state_grad = vjp(logit_grads)
            return (add(total, sums_of(logits, chunk_targets)),
                    add(param_grads, param_grad)), state_grad
        zeros = jax.tree.map(jnp.zeros_like, params)
        (total, param_grads), state_grads = jax.lax.scan(body, (zero_sums, zeros), xs)
        return total, (param_grads, state_grads, xs[1])

    def backward(saved, cotangent):
        param_grads, state_grads, chunk_targets = saved
        scale = cotangent["loss_sum"]
        return (jax.tree.map(lambda g: (g * scale).astype(g.dtype), param_grads),
                ((state_grads * scale).astype(state_grads.dtype),
                 np.zeros(chunk_targets.shape, jax.dtypes.float0)))

    sums.defvjp(forward, backward)
    return sums(params, xs)


# Tokens a chunk of the loss, where OptimizerConfig.loss_chunk is unset: on CPU, the CPU recipe's
# steps are 20% faster with it and allocate half the memory (docs/performance.md); no GPU or
# TPU has been measured with it yet.
DEFAULT_LOSS_CHUNK = {"cpu": 1024}


def loss_chunk_on(optimizer_config: OptimizerConfig, platform: str) -> int:
    """The tokens of a loss chunk on `platform` (0: the whole batch at once)."""
    if optimizer_config.loss_chunk is not None:
        return optimizer_config.loss_chunk
    return DEFAULT_LOSS_CHUNK.get(platform, 0)


def _loss_sum_logit_grads(logits: Array, targets: Array, label_smoothing: float, pad_id: int,
                          rdrop: float = 0.0) -> Array:
    """d loss_sum / d logits [rows, len, vocab] of `token_loss_sums`: softmax(logits) minus
    the smoothed target (1 - eps on the label, eps / (V - 1) elsewhere), zero at padding;
    with `rdrop`, half of that plus the R-Drop term's gradient (`_rdrop_logit_grads`)."""
    vocab = logits.shape[-1]
    off = label_smoothing / (vocab - 1) if label_smoothing > 0 else 0.0
    probabilities = jax.nn.softmax(logits, axis=-1)
    target = off + (1.0 - label_smoothing - off) * jax.nn.one_hot(targets, vocab,
                                                                  dtype=logits.dtype)
    grads = probabilities - target
    if rdrop:
        grads = 0.5 * grads + 0.5 * rdrop * _rdrop_logit_grads(jax.nn.log_softmax(logits))
    return jnp.where((targets != pad_id)[..., None], grads, 0.0)


def _rdrop_logit_grads(log_probs: Array) -> Array:
    """d kl_sum / d logits of `_with_rdrop` (before masking), rows paired by `two_passes`.

    With S = sum_v (p1 - p2)(lp1 - lp2) and d = lp1 - lp2: dS/dz1 = p1 (d - E_p1[d]) +
    (p1 - p2), and dS/dz2 = -p2 (d - E_p2[d]) - (p1 - p2); kl_sum holds S / 2.
    """
    rows, length, vocab = log_probs.shape
    pairs = log_probs.reshape(rows // 2, 2, length, vocab)
    first, second = jnp.exp(pairs[:, 0]), jnp.exp(pairs[:, 1])
    d = pairs[:, 0] - pairs[:, 1]

    def centred(p):
        return p * (d - jnp.sum(p * d, axis=-1, keepdims=True))

    grads = jnp.stack([centred(first) + (first - second),
                       -centred(second) - (first - second)], axis=1)   # [B, 2, T, V]
    return 0.5 * grads.reshape(rows, length, vocab)


# ----------------------------------------------------------------------------- state


@flax.struct.dataclass
class TrainState:
    """Everything a train step reads and replaces; a pytree, replicated over the mesh.

    step:      int32 scalar, number of updates made so far.
    params:    nnx.State of the model's nnx.Param variables (float32).
    opt_state: optax state for `params`.
    rng:       raw uint32[2] PRNG key (`jax.random.PRNGKey` layout, checkpointable as a plain
               array); the dropout key of update `step` is fold_in(rng, step).
    """

    step: Array
    params: nnx.State
    opt_state: optax.OptState
    rng: Array


def make_mesh(devices: list[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh with axis "data" over `devices` (default: every device of every process)."""
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(DATA_AXIS))


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, Array]:
    """This process's rows -> global arrays split over "data" along the batch axis.

    Every process passes the same number of rows, a multiple of its local device count; the
    global batch is the processes' rows in process order. Works unchanged for one process.
    """
    sharding = batch_sharding(mesh)
    local_devices = mesh.devices.size // jax.process_count()
    out = {}
    for name, rows in batch.items():
        rows = np.asarray(rows)
        if rows.shape[0] % local_devices:
            raise ValueError(f"shard_batch: batch[{name!r}] has {rows.shape[0]} rows, not a "
                             f"multiple of the {local_devices} local devices; pad the batch "
                             f"with all-pad rows (they carry zero weight).")
        out[name] = jax.make_array_from_process_local_data(sharding, rows)
    return out


def create_train_state(model_config: ModelConfig, optimizer_config: OptimizerConfig,
                       mesh: Mesh | None = None) -> tuple[nnx.GraphDef, nnx.State, TrainState]:
    """Initialise the model (seed `optimizer_config.seed`) and optimizer, replicated over `mesh`.

    Returns (graphdef, static_state, state). The model is split once as
    `nnx.split(model, nnx.Param, ...)`: graphdef is the static structure the steps merge the
    parameters into, static_state the non-parameter state, which is empty for this model
    (dropout randomness is explicit and positions are constants) and is checked to be so,
    because the steps rebuild the model from graphdef and params alone.

    The model is built op by op on this process's first device, not as one jitted program:
    op by op, XLA compiles one small program per distinct initializer shape, where the whole
    initialisation as one program cost seconds of compiling at every start
    (docs/performance.md, "Starting train.py"). Every process computes the same values from
    the same seed, so each places its own copy on its devices (`place_replicated`) without
    moving parameters between hosts.
    """
    mesh = make_mesh() if mesh is None else mesh
    optimizer = make_optimizer(optimizer_config, model_config.d_model)
    model = Transformer(model_config, rngs=nnx.Rngs(params=optimizer_config.seed))
    graphdef, params, static_state = nnx.split(model, nnx.Param, ...)
    if jax.tree_util.tree_leaves(static_state):
        raise ValueError("create_train_state: the model has non-Param state "
                         f"{static_state}; the train step only carries parameters. Make it "
                         "a constant or an explicit argument, or extend TrainState.")
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                       opt_state=optimizer.init(params),
                       rng=jax.random.PRNGKey(optimizer_config.seed))
    return graphdef, static_state, place_replicated(state, replicated(mesh))


def place_replicated(tree: Any, sharding: NamedSharding) -> Any:
    """`tree`'s arrays, identical on every process, as global arrays with `sharding`.

    One process: a copy between its devices. Several: each process fills its own devices
    from its host copy (`jax.device_put` would first check, leaf by leaf, that every process
    holds the same values, one collective per array).
    """
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def place(x: Array) -> Array:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(place, tree)


# ----------------------------------------------------------------------------- steps


def _forward_sums(graphdef: nnx.GraphDef, params: nnx.State, batch: Batch,
                  label_smoothing: float, rng: Array | None, loss_chunk: int = 0,
                  rdrop: float = 0.0) -> Metrics:
    """The batch's loss sums; with `loss_chunk`, its logits made that many tokens at a time
    (`chunked_loss_sums`); with `rdrop`, every row computed twice (R-Drop)."""
    model = nnx.merge(graphdef, params)
    if rdrop:
        batch = two_passes(batch)
    packing = Packing.of(batch)
    if not loss_chunk:
        logits = model(batch["src"], batch["tgt_in"], rng=rng,     # [batch, tgt_len, vocab]
                       packing=packing)
        return token_loss_sums(logits, batch["tgt_out"], label_smoothing, model.config.pad_id,
                               rdrop)
    states = model.decoder_states(batch["src"], batch["tgt_in"], rng=rng, packing=packing)
    return chunked_loss_sums(graphdef, params, states, batch["tgt_out"], label_smoothing,
                             model.config.pad_id, loss_chunk, rdrop)


def _micro_batches(batch: Batch, k: int) -> Batch:
    """[k * b, ...] -> [k, b, ...], micro-batch i = rows i, i + k, i + 2k, ...

    Interleaving (rather than contiguous blocks) keeps each micro-batch spread over all
    devices exactly as the full batch is, so no data moves between devices.
    """
    def split(x):
        rows = x.shape[0]
        if rows % k:
            raise ValueError(f"accum_steps={k} must divide the batch size, got {rows} rows.")
        return jnp.swapaxes(x.reshape(rows // k, k, *x.shape[1:]), 0, 1)

    return {name: split(x) for name, x in batch.items()}


def make_train_step(graphdef: nnx.GraphDef, optimizer_config: OptimizerConfig, mesh: Mesh
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """The jitted update `(state, batch) -> (state, metrics)`; `state` is donated.

    batch: global int32 arrays `src` [B, S], `tgt_in` [B, T], `tgt_out` [B, T] split over
    "data" (see `shard_batch`); with accum_steps = K, B holds K micro-batches whose token-summed
    gradients are added up before one division by the total non-pad token count, so K
    micro-batches equal one batch of B rows (exactly, up to float summation order, when dropout
    is off; dropout masks differ because each micro-batch draws its own key).

    Dropout key of the update: fold_in(state.rng, state.step). Metrics (scalars on the device,
    float32 but for is_finite): loss and nll per token, accuracy, tokens, grad_norm (before
    clipping), learning_rate (the one this update used) and is_finite (bool: loss and gradient
    norm finite; the update is applied regardless, so check it at log intervals and stop on
    False).
    """
    c = optimizer_config
    loss_chunk = loss_chunk_on(c, mesh.devices.flat[0].platform)

    def loss_and_sums(params, batch, rng, total_tokens):
        sums = _forward_sums(graphdef, params, batch, c.label_smoothing, rng, loss_chunk,
                             c.rdrop)
        return sums["loss_sum"] / total_tokens, sums

    grad_fn = jax.grad(loss_and_sums, has_aux=True)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        # The ModelConfig is static data of the graphdef; merging here costs trace time only.
        model_config = nnx.merge(graphdef, state.params).config
        optimizer = make_optimizer(c, model_config.d_model)
        schedule = learning_rate_schedule(c, model_config.d_model)
        rng = jax.random.fold_in(state.rng, state.step)
        # Known before the forward pass: divide each micro-batch's token-summed loss by the
        # global count so that the summed gradients are the per-token mean over the batch.
        tokens = jnp.sum(batch["tgt_out"] != model_config.pad_id).astype(jnp.float32)
        denominator = jnp.maximum(tokens, 1.0)
        grads, sums = _accumulated_gradients(grad_fn, state.params, batch, rng, denominator,
                                             c.accum_steps, mesh)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        loss = sums["loss_sum"] / denominator
        metrics = {
            "loss": loss,
            "nll": sums["nll_sum"] / denominator,
            "accuracy": sums["correct"] / denominator,
            "tokens": sums["tokens"],
            "grad_norm": grad_norm,
            "learning_rate": schedule(state.step),
            "is_finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm),
        }
        if c.rdrop:
            metrics["kl"] = sums["kl_sum"] / denominator
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return jax.jit(train_step,
                   in_shardings=(replicated(mesh), batch_sharding(mesh)),
                   out_shardings=(replicated(mesh), replicated(mesh)),
                   donate_argnums=0)


def _accumulated_gradients(grad_fn, params, batch: Batch, rng: Array, denominator: Array,
                           k: int, mesh: Mesh) -> tuple[Any, Metrics]:
    """(gradients, sums) of `grad_fn` over the batch's k micro-batches, added up; each
    micro-batch draws its own dropout key."""
    if k == 1:
        return grad_fn(params, batch, rng, denominator)
    micro = _micro_batches(batch, k)
    micro = jax.lax.with_sharding_constraint(micro, NamedSharding(mesh, P(None, DATA_AXIS)))

    def accumulate(carry, inputs):
        micro_batch, micro_rng = inputs
        grads, sums = grad_fn(params, micro_batch, micro_rng, denominator)
        return jax.tree_util.tree_map(jnp.add, carry, (grads, sums)), None

    first = jax.tree_util.tree_map(lambda x: x[0], micro)
    zeros = jax.tree_util.tree_map(jnp.zeros_like,
                                   jax.eval_shape(grad_fn, params, first, rng, denominator))
    (grads, sums), _ = jax.lax.scan(accumulate, zeros, (micro, jax.random.split(rng, k)))
    return grads, sums


def make_eval_step(graphdef: nnx.GraphDef, mesh: Mesh,
                   optimizer_config: OptimizerConfig | None = None
                   ) -> Callable[[nnx.State, Batch], Metrics]:
    """The jitted `(params, batch) -> sums` without dropout.

    Returns float32 scalars loss_sum (label-smoothed with optimizer_config.label_smoothing,
    default OptimizerConfig()'s 0.1; its logits made `loss_chunk` tokens at a time as the
    train step's), nll_sum, correct and tokens; add them up over the
    validation set and divide by the summed tokens at the end (perplexity =
    exp(nll_sum / tokens)).
    """
    optimizer_config = optimizer_config or OptimizerConfig()
    label_smoothing = optimizer_config.label_smoothing
    loss_chunk = loss_chunk_on(optimizer_config, mesh.devices.flat[0].platform)

    def eval_step(params: nnx.State, batch: Batch) -> Metrics:
        return _forward_sums(graphdef, params, batch, label_smoothing, None, loss_chunk)

    return jax.jit(eval_step, in_shardings=(replicated(mesh), batch_sharding(mesh)),
                   out_shardings=replicated(mesh))
