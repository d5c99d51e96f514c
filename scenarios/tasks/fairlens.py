"""FairLens: DP-SGD on a loss regularised against clipping's and noise's excessive risk gaps.

Tran, Dinh, Fioretto, "Differentially Private Empirical Risk Minimization under the Fairness
Lens", NeurIPS 2021, as seed 003 (Esipova et al., ICLR 2023, appendix B.5, Algorithm 4) ran it:
two protected groups a and b, and on each Poisson batch B (per-sample gradients g_i = ∇_θ ℓ_i,
clipped ḡ_i = g_i · min(1, C_0 / ||g_i||), f(x) the model's probability of class 1)::

    g_B = (1/|B|) Σ_{i∈B} g_i          ḡ_B = (1/|B|) Σ_{i∈B} ḡ_i
    g_{B_k} = (1/|B_k|) Σ_{i∈B_k} g_i   f_k = (1/|B_k|) Σ_{i∈B_k} f(x_i)      k ∈ {a, b}

    R_1 = |⟨g_{B_a} − g_{B_b}, ḡ_B − g_B⟩|             (the gap of clipping's excessive risks)
    R_2 = ½ (f_a (1 − f_a) + f_b (1 − f_b))             (a stand-in for the groups' Laplacians)
    L_i = ℓ_i + γ_1 R_1 + γ_2 R_2

and then DP-SGD on L: g'_i = ∇_θ L_i, clipped at C_0, summed, noised with σ C_0. Seed 003 uses
γ_1 = γ_2 = 1 "as in Tran et al." (appendix B.2: λ_1 = λ_2 = 1).

R_1 and R_2 are functions of θ through every example of the batch, so

    g'_i = g_i + r,    r = γ_1 ∇_θ R_1 + γ_2 ∇_θ R_2,

the same r for every example (the literal gradient of L_i; ∇_θ R_1 is second order, through the
per-sample gradients and their clipping). :func:`regularizer_gradient` computes r exactly with
``torch.func`` (``grad`` of a function of ``vmap(grad(ℓ))``). Choices where Algorithm 4 is
silent: f is the softmax probability of class 1 of the model's output (the loss's own
probability; the algorithm's f maps to [0, 1]); the batch means divide by the batch's actual
sizes, as the algorithm writes |B| and |B_k|; a batch without one of the groups has R_1 = 0
and only the present group's term in R_2. Seed 003's public code (``layer6ai-labs/fair-dp``)
names the method (``--method fairness-lens``, ``gradient_regularizer`` and ``boundary_regularizer``
both 1) but holds no FairLens trainer; the paper's Algorithm 4 is followed.

Not private at the ε DP-SGD's accounting gives: every example's g'_i depends on the whole
batch through r, so adding or removing one example changes every clipped contribution, and the
sum's sensitivity is not C_0 (up to (2|B| + 1)·C_0). Runs of this objective claim no ε
(:class:`fairclip.server.run.Run`), and since a client would need the other clients'
gradients and predictions, it exists only in simulations of one-example, one-step clients in
one process (``training.objective = "fairlens"``; the Ray executor and the Flower apps refuse it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fairclip.scenarios.models import image_layout, load_vector

NORM_FLOOR = 1e-30
"""Squared norms are floored here before the square root, so a zero gradient (whose clipping
factor is 1 whatever its derivative) does not give the square root's infinite derivative."""


@dataclass(frozen=True)
class FairLens:
    """The FairLens objective of a run: weights γ_1, γ_2 and the clipping bound C_0 of ḡ_B."""

    gradient_weight: float
    """γ_1, the weight of R_1 (the authors' ``gradient_regularizer``)."""
    boundary_weight: float
    """γ_2, the weight of R_2 (the authors' ``boundary_regularizer``)."""
    bound: float
    """C_0, the bound that clips ḡ_i (the ``constant`` policy's ``initial_bound``)."""

    def __post_init__(self) -> None:
        for label, value in (
            ("gradient weight", self.gradient_weight),
            ("boundary weight", self.boundary_weight),
        ):
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"FairLens {label} must be a finite number >= 0 (got {value})")
        if not (np.isfinite(self.bound) and self.bound > 0):
            raise ValueError(f"FairLens bound C_0 must be a finite number > 0 (got {self.bound})")

    def shift(
        self,
        model: nn.Module,
        global_vector: np.ndarray,
        features: torch.Tensor,
        labels: torch.Tensor,
        groups: torch.Tensor,
    ) -> np.ndarray:
        """r = γ_1 ∇_θ R_1 + γ_2 ∇_θ R_2 of one batch, as a float64 vector in the order of
        :func:`fairclip.scenarios.models.model_to_vector` (:func:`regularizer_gradient`)."""
        return regularizer_gradient(model, global_vector, features, labels, groups, self)


def linear_layers(model: nn.Module) -> list[nn.Linear] | None:
    """The model's ``Linear`` layers where every parameter belongs to one (MLPs, logistic
    regressions: the fast path of :func:`regularizer_gradient`), else ``None``."""
    layers = []
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if own and not isinstance(module, nn.Linear):
            return None
        if own:
            layers.append(module)
    return layers


def _linear_regularizers(
    model: nn.Module,
    layers: list[nn.Linear],
    features: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    bound: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R_1, R_2) at the model's parameters, differentiable in them, for a model of ``Linear``
    layers on (n, in) inputs: a layer's per-example gradients are b_i a_iᵀ and b_i (its input
    a_i and output gradient b_i = ∂ℓ_i/∂z_i, taken with ``create_graph``), so every batch and
    group mean and every norm of R_1 is a product of those factors (as in
    :mod:`fairclip.scenarios.tasks.ghost`), without forming a per-example gradient."""
    inputs: dict[nn.Linear, torch.Tensor] = {}
    outputs: dict[nn.Linear, torch.Tensor] = {}

    def keep(layer, args, output):
        if layer in outputs:
            raise ValueError("FairLens: a Linear layer is called twice in one forward pass")
        if args[0].dim() != 2:
            raise ValueError("FairLens: a Linear layer's input is not (examples, features)")
        inputs[layer], outputs[layer] = args[0], output

    hooks = [layer.register_forward_hook(keep) for layer in layers]
    try:
        logits = model(features)
    finally:
        for hook in hooks:
            hook.remove()
    if set(outputs) != set(layers):
        raise ValueError("FairLens: a Linear layer of the model is not used in its forward pass")
    loss = nn.functional.cross_entropy(logits, labels, reduction="sum")
    output_grads = torch.autograd.grad(loss, [outputs[layer] for layer in layers], create_graph=True)
    count = labels.shape[0]
    squares = logits.new_zeros(count)
    for layer, b in zip(layers, output_grads, strict=True):
        scale = inputs[layer].square().sum(dim=1) + (1.0 if layer.bias is not None else 0.0)
        squares = squares + b.square().sum(dim=1) * scale
    norms = squares.clamp_min(NORM_FLOOR).sqrt()
    factors = bound / torch.maximum(norms, torch.full_like(norms, bound))  # min(1, C_0 / ||g_i||)
    members = [groups == k for k in (0, 1)]
    if all(bool(m.any()) for m in members):
        # u = g_{B_a} − g_{B_b} = Σ α_i g_i and v = ḡ_B − g_B = Σ β_i g_i
        alpha = (
            members[0].to(logits.dtype) / members[0].sum() - members[1].to(logits.dtype) / members[1].sum()
        )
        beta = (factors - 1.0) / count
        product = logits.new_zeros(())
        for layer, b in zip(layers, output_grads, strict=True):
            a = inputs[layer]
            u_layer, v_layer = (b * alpha[:, None]).T @ a, (b * beta[:, None]).T @ a
            product = product + (u_layer * v_layer).sum()
            if layer.bias is not None:
                product = product + torch.dot(b.T @ alpha, b.T @ beta)
        r1 = torch.abs(product)
    else:
        r1 = logits.new_zeros(())
    return r1, _boundary_term(logits, members)


def _boundary_term(logits: torch.Tensor, members: list[torch.Tensor]) -> torch.Tensor:
    """R_2 = ½ Σ_k f_k (1 − f_k) over the groups present in the batch."""
    positive = torch.softmax(logits, dim=1)[:, 1]
    r2 = logits.new_zeros(())
    for m in members:
        if bool(m.any()):
            mean = positive[m].mean()
            r2 = r2 + 0.5 * mean * (1 - mean)
    return r2


def _functional(model: nn.Module, global_vector: np.ndarray, features: torch.Tensor):
    """(parameter names, detached parameters, buffers, features in the model's layout) at θ_t."""
    load_vector(model, global_vector)
    features = image_layout(model, features)
    model.train()
    names = [name for name, _ in model.named_parameters()]
    params = {name: parameter.detach() for name, parameter in model.named_parameters()}
    buffers = {name: buffer.detach() for name, buffer in model.named_buffers()}
    return names, params, buffers, features


def _regularizers(model, names, buffers, features, labels, groups, bound):
    """The function θ ↦ (R_1, R_2) of one batch (module docstring), for ``torch.func``."""
    from torch.func import functional_call, grad, vmap

    count = labels.shape[0]
    members = [groups == k for k in (0, 1)]

    def example_loss(parameters, x, y):
        logits = functional_call(model, (parameters, buffers), (x.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, y.unsqueeze(0))

    def regularizers(parameters):
        per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))(parameters, features, labels)
        flat = torch.cat([per_example[name].reshape(count, -1) for name in names], dim=1)
        norms = flat.square().sum(dim=1).clamp_min(NORM_FLOOR).sqrt()
        factors = bound / torch.maximum(norms, torch.full_like(norms, bound))  # min(1, C_0 / ||g_i||)
        g_batch = flat.mean(dim=0)
        clipped_batch = (factors[:, None] * flat).mean(dim=0)
        if all(bool(m.any()) for m in members):
            gap = flat[members[0]].mean(dim=0) - flat[members[1]].mean(dim=0)
            r1 = torch.abs(torch.dot(gap, clipped_batch - g_batch))
        else:
            r1 = flat.new_zeros(())
        logits = functional_call(model, (parameters, buffers), (features,))
        return r1, _boundary_term(logits, members)

    return regularizers


def regularizer_values(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    bound: float,
) -> tuple[float, float]:
    """(R_1, R_2) of one batch at θ_t = ``global_vector`` (module docstring); ``groups`` holds
    each example's group, 0 (a) or 1 (b)."""
    r1, r2 = _regularizers_at(model, global_vector, features, labels, groups, bound)[0]
    return float(r1), float(r2)


def regularizer_gradient(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    objective: FairLens,
) -> np.ndarray:
    """r = γ_1 ∇_θ R_1 + γ_2 ∇_θ R_2 of one batch at θ_t = ``global_vector``, float64 (module
    docstring). An empty batch gives r = 0.

    A model of ``Linear`` layers (:func:`linear_layers`) takes the factored path (Adult's MLP,
    256 examples: about 0.05 s on one CPU thread); any other model the generic one, ``grad`` of
    ``vmap(grad(ℓ))`` (about 18 s for the same batch, the reason seed 003 ran FairLens on its
    tabular data only). Both are exact; ``tests/test_fairlens.py`` checks them against each other
    and against finite differences."""
    if labels.shape[0] == 0:
        return np.zeros(global_vector.shape[0])
    (r1, r2), parameters = _regularizers_at(
        model, global_vector, features, labels, groups, objective.bound, differentiable=True
    )
    total = objective.gradient_weight * r1 + objective.boundary_weight * r2
    gradient = torch.autograd.grad(total, parameters, allow_unused=True)
    flat = torch.cat(
        [
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(gradient, parameters, strict=True)
        ]
    )
    return flat.detach().double().cpu().numpy()


def _regularizers_at(
    model: nn.Module,
    global_vector: np.ndarray,
    features: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    bound: float,
    differentiable: bool = False,
    generic: bool = False,
) -> tuple[tuple[torch.Tensor, torch.Tensor], list[torch.Tensor]]:
    """((R_1, R_2), the parameters they are functions of, in the model's order) at θ_t; on the
    factored path for a model of ``Linear`` layers unless ``generic``."""
    layers = None if generic else linear_layers(model)
    if layers is not None:
        load_vector(model, global_vector)
        model.train()
        parameters = list(model.parameters())
        with torch.enable_grad():
            values = _linear_regularizers(model, layers, features, labels, groups, bound)
        if not differentiable:
            values = (values[0].detach(), values[1].detach())
        return values, parameters
    names, params, buffers, features = _functional(model, global_vector, features)
    regularizers = _regularizers(model, names, buffers, features, labels, groups, bound)
    if not differentiable:
        with torch.no_grad():
            return regularizers(params), [params[name] for name in names]
    leaves = {name: value.clone().requires_grad_(True) for name, value in params.items()}
    return regularizers(leaves), [leaves[name] for name in names]
