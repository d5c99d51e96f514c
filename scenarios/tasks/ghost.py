"""One-step clients' clipped sums without materialising their per-example gradients.

A client with one example that takes one SGD step has Δ_i = −η_l ∇ℓ_i(θ_t). Every row-scaling
policy (:attr:`fairclip.strategies.Policy.row_scaling`) sends c_i·Δ_i (and perhaps r_i·Δ_i), with
factors that depend on ||Δ_i|| alone, so a batch needs only

1. the per-example norms ||∇ℓ_i||, and
2. weighted sums Σ_i w_i ∇ℓ_i for the factor vectors w of each summation block.

Both come from each layer's inputs a_i and output gradients b_i = ∂ℓ_i/∂z_i, taken in one
forward pass and one backward pass to the layers' outputs (no parameter gradients):

* ``Linear`` on (n, in) inputs: ∇_W ℓ_i = b_i a_iᵀ, so ||∇_W ℓ_i|| = ||a_i||·||b_i|| (the "ghost
  norm" of Li et al. 2022, "Large Language Models Can Be Strong Differentially Private
  Learners"), and Σ w_i b_i a_iᵀ = Bᵀ diag(w) A is one matrix product ("book-keeping", Bu et al.
  2023, "Differentially Private Optimization on Large Model at Small Cost").
* ``Conv2d`` (and ``Linear`` on sequences): the per-example gradient of the layer alone,
  G_i = B_i U_iᵀ with U_i the unfolded input (what Opacus' conv grad sampler forms), here the
  weight gradient of one convolution with one group per example; a convolution's weight is
  small, so G is too, and the sums are w·G.
* ``ConvTranspose2d``: y = conv_transpose(x, W) is the adjoint of the convolution z = conv(u, W)
  with the same weight, stride, padding and dilation, so <b_i, conv_transpose(a_i, W)> =
  <conv(b_i, W), a_i> and ∇_W ℓ_i is that convolution's weight gradient with b_i as its input and
  a_i as its output gradient: G_i = A_i U(B_i)ᵀ, the same computation with the roles swapped
  (seed 002's autoencoder).
* ``GroupNorm`` with its affine weight γ and bias β: y = x̂·γ + β per channel, where x̂ is the
  input normalised over each group of each example alone, so ∇_γ ℓ_i = Σ_positions x̂_i ⊙ b_i
  and ∇_β ℓ_i = Σ_positions b_i, per channel (what Opacus' group-norm grad sampler forms).

The gradients are defined by these float32 factors; their norms and every sum are computed
in float64, so the norm each factor was decided from is the norm of the row it multiplies (to
float64 rounding, far inside :data:`fairclip.strategies.clipping.SAFETY`). Δ_i here is
−η_l ∇ℓ_i exactly; the materialised path's θ_i − θ_t carries θ_i's float32 rounding, so the
two agree to that rounding.

A model with any other parameterised layer (or a layer called twice in one forward pass, one it
skips, one whose output the loss ignores, or one frozen from the input on) is not handled here:
:func:`one_step_gradients` returns ``None`` and the caller materialises the gradients with
``torch.func`` (:func:`fairclip.scenarios.tasks.training.one_step_updates`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fairclip.scenarios.models import batch_statistics_layers, image_layout, load_vector
from fairclip.scenarios.tasks.training import example_losses


@dataclass
class _OuterProduct:
    """A ``Linear`` layer on (n, in) inputs: ∇_W ℓ_i = b_i a_iᵀ, ∇_bias ℓ_i = b_i (float64)."""

    inputs: torch.Tensor
    output_grads: torch.Tensor
    bias: bool

    @property
    def size(self) -> int:
        """The layer's parameters."""
        outputs = self.output_grads.shape[1]
        return outputs * self.inputs.shape[1] + (outputs if self.bias else 0)

    def squared_norms(self) -> torch.Tensor:
        b2 = self.output_grads.square().sum(1)
        squares = self.inputs.square().sum(1) * b2
        return squares + b2 if self.bias else squares

    def write_weighted_sums(
        self, rows: slice | torch.Tensor, weights: torch.Tensor, out: torch.Tensor
    ) -> None:
        """Σ_i w_ji ∇ℓ_i over ``rows`` (a slice or row indices) for each row j of ``weights``,
        into ``out``'s row j (its columns of this layer: W row-major, then the bias)."""
        a, b = self.inputs[rows], self.output_grads[rows]
        outputs, inputs = b.shape[1], a.shape[1]
        for w, row in zip(weights, out, strict=True):
            weighted = b * w[:, None]
            torch.mm(weighted.T, a, out=row[: outputs * inputs].view(outputs, inputs))
            if self.bias:
                torch.sum(weighted, 0, out=row[outputs * inputs :])

    def padded_sums(self, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every block's weighted sums at once: ``index`` (B, s) holds each block's rows, padded
        with ``n`` (a zero row), ``weights`` (B, m, s) their weights; (B, m, size) float64."""
        a = _padded(self.inputs, index)
        weighted = weights[..., None] * _padded(self.output_grads, index)[:, None]  # (B, m, s, O)
        sums = torch.matmul(weighted.transpose(-1, -2), a[:, None])  # (B, m, O, I)
        parts = [sums.reshape(*sums.shape[:2], -1)]
        if self.bias:
            parts.append(weighted.sum(2))
        return torch.cat(parts, dim=2)


@dataclass
class _PerExample:
    """A layer whose per-example gradients are formed (small: a convolution's kernel)."""

    weight_grads: torch.Tensor
    bias_grads: torch.Tensor | None

    def squared_norms(self) -> torch.Tensor:
        squares = self.weight_grads.square().sum(1)
        return squares if self.bias_grads is None else squares + self.bias_grads.square().sum(1)

    def write_weighted_sums(
        self, rows: slice | torch.Tensor, weights: torch.Tensor, out: torch.Tensor
    ) -> None:
        """:meth:`_OuterProduct.write_weighted_sums` for formed per-example gradients."""
        grads = self.weight_grads[rows]
        if self.bias_grads is not None:
            grads = torch.cat([grads, self.bias_grads[rows]], dim=1)
        out.copy_(weights @ grads)

    @property
    def size(self) -> int:
        """The layer's parameters."""
        return self.weight_grads.shape[1] + (0 if self.bias_grads is None else self.bias_grads.shape[1])

    def padded_sums(self, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """:meth:`_OuterProduct.padded_sums` for formed per-example gradients."""
        grads = self.weight_grads
        if self.bias_grads is not None:
            grads = torch.cat([grads, self.bias_grads], dim=1)
        return torch.matmul(weights, _padded(grads, index))


def _padded(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows`` (n, k) gathered by ``index`` (B, s), where ``n`` stands for a row of zeros."""
    return torch.cat([rows, rows.new_zeros(1, rows.shape[1])])[index]


BATCHED_SUMS_LIMIT = 2**25
"""Most float64 numbers (blocks × weight rows × parameters) one batched product may hold on a GPU
(:meth:`OneStepGradients.block_weighted_sums`): 256 MiB, what a group's materialised updates
may hold (:data:`fairclip.strategies.aggregation.GROUP_BYTES`). A group whose sums hold more is
formed in consecutive chunks of blocks that each hold at most this many (``zhao-cnn``'s 64
blocks of 805,578 parameters: two chunks, 41 and 23 blocks), one block by itself where a single
block is larger. The choice depends only on the device, the blocks, the weights and the model,
never on the executor: batched and block by block sums differ in rounding, so a GPU run must
make the same choice in this process and in Ray actors (``on_device`` or not) to stay identical.

Measured (W2's data, one worker, examples/s, block by block against batched): with every
block's sums copied to the host (H100, 2026-11-26, 20 rounds) ``tanh-cnn`` 6,200 against 27,100
and ``zhao-cnn`` 770 against 530; with the sums added on the device (``on_device``, H200,
2026-11-26, 10 rounds) ``esipova-cnn`` 8,450 against 19,517 and ``zhao-cnn`` 2,527 against
3,687. The in-process executor, which adds them on the device, is what a GPU run uses. Chunks
(2026-12-04, H200, W2's one worker, paired in one process with the strided unfold of
:func:`_unfolded`): ``zhao-cnn`` 2,871-3,387 examples/s block by block, 5,851-6,614 in two
chunks."""


@dataclass
class OneStepGradients:
    """Per-example norms and weighted sums of the one-step updates Δ_i = −η_l ∇ℓ_i of a batch."""

    norms: np.ndarray
    """||Δ_i|| (float64); not finite where the example's gradient is not."""
    layers: list[_OuterProduct | _PerExample]
    lr: float
    dim: int

    def weighted_sums(self, rows: slice | torch.Tensor, weights: np.ndarray) -> np.ndarray:
        """:meth:`device_weighted_sums` copied to the host: (m, d) float64 numpy."""
        return self.device_weighted_sums(rows, weights).cpu().numpy()

    def grouped_sums(self, groups: np.ndarray, weights: np.ndarray, num_groups: int) -> np.ndarray:
        """Σ_{i in group g} w_ji Δ_i for each group g < ``num_groups`` and each row j of
        ``weights`` (m, n): (m, G, d) float64 numpy, where ``groups`` gives each of the n rows'
        group (-1: none; a row whose gradient is not finite must be in none). Each group's
        products read its own rows only, so the G groups cost one pass over the rows, not the
        G passes of :meth:`weighted_sums` with one 0/1 weight row per group (the cohort sums of
        ``training.cohort_directions``: 2 rows of weights for K cohorts instead of 2 K)."""
        weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        sums = np.zeros((weights.shape[0], num_groups, self.dim))
        for group in range(num_groups):
            index = np.flatnonzero(groups == group)
            if index.size:
                rows = torch.from_numpy(index).to(self._device())
                sums[:, group] = self.weighted_sums(rows, weights[:, index])
        return sums

    def device_weighted_sums(self, rows: slice | torch.Tensor, weights: np.ndarray) -> torch.Tensor:
        """Σ_{i in rows} w_ji Δ_i for each row j of ``weights`` (m, len(rows)): (m, d) float64,
        a tensor where the gradients are; ``rows``, a slice or a tensor of row indices. A row
        whose gradient is not finite must have weight 0 in every sum (it adds nothing)."""
        weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
        device = self._device()
        if weights.shape[0] == 0:
            return torch.empty((0, self.dim), dtype=torch.float64, device=device)
        torch_weights = torch.from_numpy(weights * -self.lr).to(device)
        sums = torch.empty((weights.shape[0], self.dim), dtype=torch.float64, device=device)
        start = 0
        for layer in self.layers:  # each layer writes its columns (no per-layer vectors joined)
            layer.write_weighted_sums(rows, torch_weights, sums[:, start : start + layer.size])
            start += layer.size
        if start != self.dim:  # columns no layer wrote would hold whatever the memory held
            raise RuntimeError(f"the layers' sums fill {start} of the model's {self.dim} parameters")
        return sums

    def block_weighted_sums(
        self,
        blocks: list[slice],
        weights: list[np.ndarray],
        batched: bool | None = None,
        on_device: bool = False,
    ) -> list[np.ndarray] | list[torch.Tensor]:
        """``[weighted_sums(rows, w) for rows, w in zip(blocks, weights)]``, where every ``w`` has
        the same number of rows m. Both ways give the same sums to float64 rounding; ``batched``
        forces one (None: :data:`BATCHED_SUMS_LIMIT` decides on a GPU, the CPU goes block by
        block, so its results never change).

        Batched, all blocks' sums come from one padded product per layer and one copy to the
        host; block by block, each small product and each copy waits on the device.
        ``on_device``: each block's sums stay where the gradients are, as a float64 tensor (the
        same numbers; no copy to the host, which a GPU otherwise waits on for every block:
        :func:`fairclip.sims.executors.local.add_in_order_on_device`)."""
        weight_rows = max((w.shape[0] for w in weights), default=0)
        per_chunk = BATCHED_SUMS_LIMIT // max(1, weight_rows * self.dim)  # blocks one product may hold
        if batched is None:
            batched = self._device().type != "cpu" and per_chunk >= 2
        if not batched or not blocks or len({w.shape[0] for w in weights}) > 1 or weight_rows == 0:
            one_block = self.device_weighted_sums if on_device else self.weighted_sums
            return [one_block(rows, w) for rows, w in zip(blocks, weights, strict=True)]
        per_chunk = max(per_chunk, 1)
        return [
            block_sums
            for start in range(0, len(blocks), per_chunk)
            for block_sums in self._padded_sums(
                blocks[start : start + per_chunk], weights[start : start + per_chunk], on_device
            )
        ]

    def _padded_sums(
        self, blocks: list[slice], weights: list[np.ndarray], on_device: bool
    ) -> list[np.ndarray] | list[torch.Tensor]:
        """The weighted sums of ``blocks`` from one padded product per layer
        (:meth:`block_weighted_sums`, batched)."""
        count = self.norms.shape[0]
        longest = max(rows.stop - rows.start for rows in blocks)
        index = np.full((len(blocks), longest), count, dtype=np.int64)
        padded_weights = np.zeros((len(blocks), weights[0].shape[0], longest))
        for j, (rows, w) in enumerate(zip(blocks, weights, strict=True)):
            size = rows.stop - rows.start
            index[j, :size] = np.arange(rows.start, rows.stop)
            padded_weights[j, :, :size] = np.asarray(w, dtype=np.float64) * -self.lr
        device = self._device()
        torch_index = torch.from_numpy(index).to(device)
        torch_weights = torch.from_numpy(padded_weights).to(device)
        sums = torch.cat([layer.padded_sums(torch_index, torch_weights) for layer in self.layers], dim=2)
        return list(sums) if on_device else list(sums.cpu().numpy())

    def _device(self) -> torch.device:
        layer = self.layers[0]
        return (layer.inputs if isinstance(layer, _OuterProduct) else layer.weight_grads).device


class _UnsupportedError(Exception):
    """The model has a layer this module cannot take per-example norms of."""


def ghost_layers(model: nn.Module) -> list[nn.Module] | None:
    """The model's parameterised layers, in the order of ``model.parameters()``, where every one
    is a ``Linear``, an ordinary ``Conv2d`` or ``ConvTranspose2d`` (one group, zero padding given
    as numbers) or a ``GroupNorm`` that owns its weight and bias; ``None`` otherwise, and ``None``
    where a layer mixes the examples of a batch
    (:func:`fairclip.scenarios.models.batch_statistics_layers`): this path puts many clients'
    examples in one batch, so such a layer would make each client's norm and clipped update depend
    on the others' data (simulations refuse such models from the start,
    :func:`fairclip.scenarios.tasks.classification.checked_model`). Group normalisation takes its
    statistics from each example alone and is handled."""
    if batch_statistics_layers(model):
        return None
    layers = []
    for module in model.modules():
        if not list(module.parameters(recurse=False)):
            continue
        if type(module) in (nn.Conv2d, nn.ConvTranspose2d):
            if module.groups != 1 or module.padding_mode != "zeros" or isinstance(module.padding, str):
                return None
        elif type(module) not in (nn.Linear, nn.GroupNorm):
            return None
        layers.append(module)
    owned = [p for layer in layers for p in (layer.weight, layer.bias) if p is not None]
    if [id(p) for p in owned] != [id(p) for p in model.parameters()]:
        return None
    return layers


POOLING = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d)
"""Where a model has one of these layers its images run channels-last here (as in local
training, :func:`fairclip.scenarios.models.image_layout`: CPU pooling is much faster there), else in
the default layout, where each convolution's inputs and output gradients need no copy to form
its per-example gradients (:func:`_conv_weight_grads`). One thread, 32 examples, one call
(2026-11-26, beside a background run): ``esipova-cnn`` (no pooling) 18.2-18.4 ms in the default
layout against 20.5-20.9 channels-last; with pooling channels-last wins: ``tanh-cnn`` 12.6-13.7
against 18.9-19.6, ``zhao-cnn`` 37.7-38.7 against 41.1-45.1, ``xu-cnn`` 15.4-15.5 against
17.0-19.1, ``galli-cnn`` 32.8-34.6 against 36.0-36.5. Both layouts give the same values to float
rounding."""


def one_step_gradients(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    lr: float,
    class_weights: tuple[float, ...] | None = None,
    reconstruction: bool = False,
) -> OneStepGradients | None:
    """The norms and weighted sums of the one-step updates of the examples (``features``,
    ``labels``) from θ_t = ``global_vector`` under each example's loss (the cross-entropy times
    ``class_weights`` of its class, or its reconstruction error where ``reconstruction``:
    :func:`fairclip.scenarios.tasks.training.example_losses`), or ``None`` where the model has a
    layer this path does not handle (then materialise the gradients instead)."""
    layers = ghost_layers(model)
    if not layers:
        return None
    load_vector(model, global_vector)
    if any(isinstance(module, POOLING) for module in model.modules()):
        features = image_layout(model, features)
    model.train()
    inputs: dict[nn.Module, torch.Tensor] = {}
    outputs: dict[nn.Module, torch.Tensor] = {}

    def keep(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if module in outputs:
            raise _UnsupportedError(f"{type(module).__name__} called twice in one forward pass")
        inputs[module] = args[0].detach()
        outputs[module] = output

    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.enable_grad():
            logits = model(features)
            losses = example_losses(logits, features, labels, class_weights, reconstruction)
            if any(layer not in outputs or not outputs[layer].requires_grad for layer in layers):
                return None  # a layer the forward pass skips, or frozen all the way down
            output_grads = torch.autograd.grad(
                losses.sum(), [outputs[layer] for layer in layers], allow_unused=True
            )
    except _UnsupportedError:
        return None
    finally:
        for handle in handles:
            handle.remove()
    if any(grad is None for grad in output_grads):
        return None  # a layer whose output the loss does not use
    pieces = [
        _piece(layer, inputs[layer], grad.detach()) for layer, grad in zip(layers, output_grads, strict=True)
    ]
    squares = sum(piece.squared_norms() for piece in pieces)
    norms = lr * np.sqrt(squares.cpu().numpy())
    finite = torch.from_numpy(np.isfinite(norms)).to(features.device)
    if not bool(finite.all()):
        pieces = [_zero_rows(piece, finite) for piece in pieces]
    return OneStepGradients(norms=norms, layers=pieces, lr=lr, dim=global_vector.shape[0])


def _piece(layer: nn.Module, inputs: torch.Tensor, output_grads: torch.Tensor) -> _OuterProduct | _PerExample:
    """The float64 factors of one layer's per-example gradients."""
    count = inputs.shape[0]
    has_bias = layer.bias is not None
    if isinstance(layer, nn.GroupNorm):
        return _group_norm_piece(layer, inputs, output_grads)
    if isinstance(layer, nn.Linear) and inputs.dim() == 2:
        return _OuterProduct(inputs.double(), output_grads.double(), has_bias)
    if isinstance(layer, nn.Linear):  # a sequence: one gradient term per position
        b = output_grads.reshape(count, -1, output_grads.shape[-1]).transpose(1, 2)
        weight_grads = torch.bmm(b, inputs.reshape(count, -1, inputs.shape[-1]))
    else:
        if isinstance(layer, nn.ConvTranspose2d):  # the adjoint convolution's, roles swapped
            weight_grads = _conv_weight_grads(layer, output_grads, inputs)
        else:
            weight_grads = _conv_weight_grads(layer, inputs, output_grads)
        b = output_grads.reshape(count, output_grads.shape[1], -1)
    # b: (n, outputs, positions); the bias gradient sums the positions
    bias_grads = b.sum(2).double() if has_bias else None
    return _PerExample(weight_grads.reshape(count, -1).double(), bias_grads)


def _group_norm_piece(layer: nn.GroupNorm, inputs: torch.Tensor, output_grads: torch.Tensor) -> _PerExample:
    """Per-example gradients of a group normalisation's affine weight and bias (n, C) from its
    inputs and output gradients (n, C, ...): each example is normalised over its own groups
    (no other example enters x̂_i), so ∇_γ ℓ_i = Σ x̂_i ⊙ b_i and ∇_β ℓ_i = Σ b_i over the
    positions of each channel."""
    count, channels = inputs.shape[:2]
    normalised = nn.functional.group_norm(inputs, layer.num_groups, eps=layer.eps)
    weight_grads = (normalised * output_grads).reshape(count, channels, -1).sum(2)
    bias_grads = output_grads.reshape(count, channels, -1).sum(2)
    return _PerExample(weight_grads.double(), bias_grads.double())


UNFOLD_POSITIONS = 16
"""Output positions up to which :func:`_conv_weight_grads` forms the unfolded inputs and one
batched product instead of a grouped convolution's weight gradient. One thread, batches of 8
and 32, on a loaded machine (2026-12-02; grouped against batched, ms per call):
``zhao-resnet18``'s 64→128 3×3 stride 2 on 7×7 (16 positions) 8.6 against 1.3 and 10.2 against
3.5; 128→128 on 4×4 60 against 7.8 (32 rows); 256→256 on 2×2 250 against 15; 512→512 on 1×1
263 against 117 (8 rows) and 7,000 against 340 (32 rows). With more positions the grouped
convolution is as fast or faster: 64→64 on 7×7 (49 positions) even; ``zhao-cnn``'s 64→64 on
12×12 (100) 9.3 against 12.5; ``esipova-cnn``'s 32→16 on 26×26 4.7 against 16.8 (32 rows). No
other built-in model has a convolution with 16 positions or fewer. On a GPU the unfolded inputs
are formed wherever they take at most :data:`UNFOLD_BYTES`."""

UNFOLD_BYTES = 2**30
"""Most bytes of unfolded inputs (examples × C_in·k_h·k_w × output positions) that
:func:`_conv_weight_grads` forms on a GPU, where a grouped convolution with one group per
example is slow; more, and it takes the grouped convolution, whose memory is the gradients' own.
``zhao-cnn``'s second convolution at 256 rows: 71 MiB. On an H200 (2026-12-04, 256 rows, ms per
call, grouped against the strided unfold and one batched product): every convolution of the
built-in CNNs was faster unfolded, 0.14-0.40 against 0.07-0.15 on one input channel, 0.77-2.6
against 0.11-0.30 for the second convolutions of ``tanh-cnn``, ``esipova-cnn``, ``zhao-cnn``,
``xu-cnn`` and ``galli-cnn``, 1.8-6.7 against 0.08-1.1 on ``zhao-resnet18``'s."""


def _conv_weight_grads(
    layer: nn.Conv2d | nn.ConvTranspose2d, inputs: torch.Tensor, output_grads: torch.Tensor
) -> torch.Tensor:
    """Per-example weight gradients (n, C_out, C_in·k_h·k_w) of a convolution from its inputs
    (n, C_in, H, W) and output gradients (n, C_out, H', W'): G_i = B_i U_iᵀ with U_i the unfolded
    input, formed as the weight gradient of one convolution with n groups (example i's input
    channels and output gradients are group i), so the backend's convolution kernel computes
    them and U_i is never formed.

    A transposed convolution's per-example weight gradients (n, C_in, C_out·k_h·k_w) are this
    with its output gradients as ``inputs`` and its inputs as ``output_grads`` (:func:`_piece`).

    One thread, batches of 32 (2026-11-26): ``esipova-cnn``'s 32→16 channels on 26×26, 3×3,
    2.5-2.8 ms against 6.7 ms one kernel offset at a time (bmm on strided slices); ``galli-cnn``'s
    16→32 on 26×26, 4×4: 3.0 against 10.9 ms; ``xu-cnn``'s 20→50, 5×5: 3.0 against 4.1 ms;
    ``zhao-cnn``'s 64→64 on 12×12 about even (6.4-7.2 against 6.2-6.7 ms); one input channel
    (unfold and bmm before): 0.7-0.9 against 0.7-1.1 ms.

    Where the output has at most :data:`UNFOLD_POSITIONS` positions, U_i is formed (``unfold``)
    and G_i = B_i U_iᵀ is one batched product instead: the grouped convolution is slow on wide,
    small maps (``zhao-resnet18``'s later stages on 28×28 images)."""
    count, channels, height, width = inputs.shape
    out_channels, out_height, out_width = output_grads.shape[1:]
    kernel_height, kernel_width = layer.kernel_size
    unfolded_bytes = (
        count * channels * kernel_height * kernel_width * out_height * out_width * inputs.element_size()
    )
    if out_height * out_width <= UNFOLD_POSITIONS or (
        inputs.device.type != "cpu" and unfolded_bytes <= UNFOLD_BYTES
    ):
        unfolded = _unfolded(layer, inputs)
        return torch.bmm(output_grads.reshape(count, out_channels, -1), unfolded.transpose(1, 2))
    grads = nn.grad.conv2d_weight(
        inputs.reshape(1, count * channels, height, width),
        (count * out_channels, channels, kernel_height, kernel_width),
        output_grads.reshape(1, count * out_channels, out_height, out_width),
        stride=layer.stride,
        padding=layer.padding,
        dilation=layer.dilation,
        groups=count,
    )
    return grads.reshape(count, out_channels, channels * kernel_height * kernel_width)


def _unfolded(layer: nn.Conv2d, inputs: torch.Tensor) -> torch.Tensor:
    """U: the unfolded inputs (n, C_in·k_h·k_w, output positions), ``nn.functional.unfold``'s
    values and order. On a GPU without dilation: one copy of a strided view of the padded inputs
    (CUDA's ``unfold`` launches a kernel per example: 260 a call for ``zhao-cnn`` at 256 rows,
    about 1.8 ms whatever the layer, H200, 2026-12-04). Both are copies of the same numbers."""
    if inputs.device.type == "cpu" or tuple(layer.dilation) != (1, 1):
        return nn.functional.unfold(
            inputs, layer.kernel_size, dilation=layer.dilation, padding=layer.padding, stride=layer.stride
        )
    return strided_unfold(layer, inputs)


def strided_unfold(layer: nn.Conv2d, inputs: torch.Tensor) -> torch.Tensor:
    """``nn.functional.unfold`` of an undilated convolution's inputs as one copy of a strided
    view of the padded inputs (:func:`_unfolded`)."""
    (pad_height, pad_width), (kernel_height, kernel_width) = layer.padding, layer.kernel_size
    padded = nn.functional.pad(inputs, (pad_width, pad_width, pad_height, pad_height))
    patches = padded.unfold(2, kernel_height, layer.stride[0]).unfold(3, kernel_width, layer.stride[1])
    count, channels, out_height, out_width = patches.shape[:4]  # (n, C, H', W', k_h, k_w)
    return patches.permute(0, 1, 4, 5, 2, 3).reshape(
        count, channels * kernel_height * kernel_width, out_height * out_width
    )


def _zero_rows(piece: _OuterProduct | _PerExample, finite: torch.Tensor) -> _OuterProduct | _PerExample:
    """``piece`` with the rows of non-finite gradients set to 0, so that a weight of 0 removes
    them from every sum (0 · inf would be nan)."""
    mask = finite[:, None]
    if isinstance(piece, _OuterProduct):
        return _OuterProduct(
            torch.where(mask, piece.inputs, 0.0), torch.where(mask, piece.output_grads, 0.0), piece.bias
        )
    bias = None if piece.bias_grads is None else torch.where(mask, piece.bias_grads, 0.0)
    return _PerExample(torch.where(mask, piece.weight_grads, 0.0), bias)
