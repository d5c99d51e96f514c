"""The models fairclip trains, and the flat parameter vectors that policies clip.

* ``logistic``: one linear layer (multinomial logistic regression; binary tasks use 2 logits).
* ``binary-logistic``: binary logistic regression as seed 000 trains it, one linear output z and
  a sigmoid (binary cross-entropy): the logits are (0, z), whose softmax cross-entropy is the
  binary cross-entropy of σ(z) (two classes only; half the parameters of a 2-logit ``logistic``).
* ``mlp``: two hidden layers of 256 units with ReLU.
* ``mlp-tanh``: the same with tanh, as seed 003 (Esipova et al. 2023) trains Adult (its appendix
  and its authors' code, ``layer6ai-labs/fair-dp``).
* ``binary-mlp``: ``mlp`` with one output z and a sigmoid, as seed 001 (SoftAdaClip) trains
  Adult: logits (0, z), as ``binary-logistic`` (two classes only).
* ``eicu-mlp``: seed 001's eICU network (appendix A.2), which its "complex" Adult model
  replicates (A.3): dense 128, GroupNorm, ReLU, dense 64, GroupNorm, ReLU, dense 32, ReLU,
  dropout 0.3, dense to the classes (softmax cross-entropy). The paper gives no number of
  groups; ``GroupNorm(32, C)`` is what Opacus' ``ModuleValidator.fix`` puts in place of a batch
  normalisation of C = 128 or 64 channels (gcd(32, C)). Its dropout masks are drawn per
  training call from the run's seed, the round and the call's first client
  (:class:`fairclip.scenarios.tasks.classification.ClassificationTask`), so a run is the same on
  every executor and after a resume; evaluation runs without dropout.
* ``sigmoid-logistic``: seed 003's "logistic regression" as its authors' code runs it: one linear
  layer to the classes, a sigmoid on each output, and those sigmoids fed to cross-entropy as
  logits (so per-example gradients stay small: Dutch, seed 003).
* ``cnn``: the two-layer CNN of Papernot et al. 2021 / Opacus' MNIST example: conv 16@8×8
  stride 2, max-pool, conv 32@4×4 stride 2, max-pool, dense 32, dense 10, tanh activations.
  (Earlier notes called it seed 000's appendix-A.5 CNN; that one is ``zhao-cnn``.)
* ``tanh-cnn``: the small CNN of seed 003 (Esipova et al.): two 3×3 convolutions of 32 and 16
  channels with tanh, each followed by 2×2 max-pooling, then a dense layer to the classes.
* ``esipova-cnn``: seed 003's MNIST CNN as its authors' code (``layer6ai-labs/fair-dp``) runs
  it: conv 32@3×3, tanh, conv 16@3×3, tanh, *no pooling*, flatten, dense to the classes
  (97,114 parameters on 1×28×28 and 10 classes).
* ``zhao-cnn``: seed 000's CNN (appendix A.5): two convolutions of 64 filters 3×3, each followed
  by max-pooling 3 with stride 2, then dense 500, dense 500 and the output, ReLU (the appendix
  gives no padding; none here: 805,578 parameters on 1×28×28 and 10 classes).
* ``xu-cnn``: seed 004's MNIST CNN (Xu et al. 2021, DPSGD-F): conv 20@5×5, max-pool 2, conv
  50@5×5, max-pool 2, dense 500, dense 10, ReLU (the LeNet of Bagdasaryan et al. 2019, whose
  experiments seed 004 follows; 431,080 parameters on 1×28×28 and 10 classes).
* ``xu-cnn-normalized``: ``xu-cnn`` on inputs standardised by MNIST's published mean 0.1307 and
  standard deviation 0.3081, fixed constants (``transforms.Normalize((0.1307,), (0.3081,))`` in the
  MNIST loader of Bagdasaryan et al.'s code, ``ebagdasa/differential-privacy-vs-fairness``,
  ``image_helper.py``, whose setting seed 004 runs): the same parameters, no statistic of the
  rows or of a batch.
* ``galli-cnn``: seed 002's MNIST CNN (Galli et al. 2024, OSO, appendix Table 5): conv 16@8×8
  with padding 3, max-pool 2 with stride 1, conv 32@4×4, dense 32, dense 10, ReLU after every
  layer *including the output* (Table 5 gives the last Linear a ReLU, as its other models' last
  layers have their own non-linearity), no strides (551,322 parameters on 1×28×28 and 10
  classes, Table 1: 28 -> 27 -> 26 -> 23, so 32·23·23 = 16,928 inputs to the dense layer; the
  strided, twice-pooled ``cnn`` of Papernot et al. has 26,010).
* ``galli-autoencoder``: seed 002's Fashion MNIST autoencoder (appendix Table 6), trained to
  reconstruct its input (``training.objective = "reconstruction"``): convolutions of 8, 16, 32
  and 64 channels, then transposed convolutions of 32, 16, 8 and the input's channels, all 3×3
  with stride 1, LeakyReLU (slope 0.01, torch's default; the table names no slope) after each
  but the last, which has a sigmoid, so outputs lie in [0, 1] as the pixels do. The table gives
  no padding: none, so 28×28 shrinks to 20×20 and grows back (48,705 parameters on 1×28×28,
  Table 1's count, which padding would not change).
* ``zhao-resnet18``: seed 000's ResNet-18 (section 4.1, appendix A.5): timm's ``resnet18`` with
  every batch normalisation replaced by ``GroupNorm(32, C)`` as Opacus' ``ModuleValidator.fix``
  replaces it (:mod:`fairclip.scenarios.resnet`; 11,175,370 parameters on 1×28×28 and 10 classes).

A client's update Δ = θ_i − θ_t is the difference of two flat vectors made by
:func:`model_to_vector`, in the order of ``model.parameters()``.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

from fairclip.scenarios.model_names import AUTOENCODERS, IMAGE_MODELS, MODELS
from fairclip.scenarios.resnet import ResNet18GroupNorm


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A freshly initialised model (initialise under ``torch.manual_seed`` for reproducibility)."""
    features = int(np.prod(input_shape))
    if name == "logistic":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes))
    if name == "binary-logistic":
        if num_classes != 2:
            raise ValueError(f"model 'binary-logistic' needs 2 classes (got {num_classes})")
        return nn.Sequential(nn.Flatten(), nn.Linear(features, 1), ZeroLogit())
    if name == "sigmoid-logistic":
        return nn.Sequential(nn.Flatten(), nn.Linear(features, num_classes), nn.Sigmoid())
    if name == "eicu-mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, 128),
            nn.GroupNorm(32, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.GroupNorm(32, 64),
            nn.ReLU(),
            nn.Linear(64, 32),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(32, num_classes),
        )
    if name in ("mlp", "mlp-tanh", "binary-mlp"):
        activation = nn.Tanh if name == "mlp-tanh" else nn.ReLU
        if name == "binary-mlp" and num_classes != 2:
            raise ValueError(f"model 'binary-mlp' needs 2 classes (got {num_classes})")
        head = [nn.Linear(256, 1), ZeroLogit()] if name == "binary-mlp" else [nn.Linear(256, num_classes)]
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, 256),
            activation(),
            nn.Linear(256, 256),
            activation(),
            *head,
        )
    if name in IMAGE_MODELS:
        if len(input_shape) != 3:
            raise ValueError(
                f"model {name!r} needs image inputs (channels, height, width), got {input_shape}"
            )
        channels = input_shape[0]
        if name == "zhao-resnet18":
            return ResNet18GroupNorm(channels, num_classes)
        if name in AUTOENCODERS:
            return galli_autoencoder(channels)
        if name == "cnn":
            layers = nn.Sequential(
                nn.Conv2d(channels, 16, 8, stride=2, padding=3),
                nn.Tanh(),
                nn.MaxPool2d(2, 1),
                nn.Conv2d(16, 32, 4, stride=2),
                nn.Tanh(),
                nn.MaxPool2d(2, 1),
                nn.Flatten(),
            )
            head = [nn.LazyLinear(32), nn.Tanh(), nn.Linear(32, num_classes)]
        elif name == "esipova-cnn":
            layers = nn.Sequential(
                nn.Conv2d(channels, 32, 3), nn.Tanh(), nn.Conv2d(32, 16, 3), nn.Tanh(), nn.Flatten()
            )
            head = [nn.LazyLinear(num_classes)]
        elif name == "zhao-cnn":
            layers = nn.Sequential(
                nn.Conv2d(channels, 64, 3),
                nn.ReLU(),
                nn.MaxPool2d(3, 2),
                nn.Conv2d(64, 64, 3),
                nn.ReLU(),
                nn.MaxPool2d(3, 2),
                nn.Flatten(),
            )
            head = [
                nn.LazyLinear(500),
                nn.ReLU(),
                nn.Linear(500, 500),
                nn.ReLU(),
                nn.Linear(500, num_classes),
            ]
        elif name in ("xu-cnn", "xu-cnn-normalized"):
            standardize = [Standardize(MNIST_MEAN, MNIST_STD)] if name == "xu-cnn-normalized" else []
            layers = nn.Sequential(
                *standardize,
                nn.Conv2d(channels, 20, 5),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(20, 50, 5),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
            )
            head = [nn.LazyLinear(500), nn.ReLU(), nn.Linear(500, num_classes)]
        elif name == "galli-cnn":
            layers = nn.Sequential(
                nn.Conv2d(channels, 16, 8, padding=3),
                nn.ReLU(),
                nn.MaxPool2d(2, 1),
                nn.Conv2d(16, 32, 4),
                nn.ReLU(),
                nn.Flatten(),
            )
            head = [nn.LazyLinear(32), nn.ReLU(), nn.Linear(32, num_classes), nn.ReLU()]
        else:
            layers = nn.Sequential(
                nn.Conv2d(channels, 32, 3),
                nn.Tanh(),
                nn.MaxPool2d(2),
                nn.Conv2d(32, 16, 3),
                nn.Tanh(),
                nn.MaxPool2d(2),
                nn.Flatten(),
            )
            head = [nn.LazyLinear(num_classes)]
        model = nn.Sequential(*layers, *head)
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))  # materialise the lazy layer
        return model
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def galli_autoencoder(channels: int) -> nn.Sequential:
    """Seed 002's convolutional autoencoder (appendix Table 6; see the module docstring)."""
    widths = [channels, 8, 16, 32, 64, 32, 16, 8, channels]
    layers: list[nn.Module] = []
    for index, (inputs, outputs) in enumerate(itertools.pairwise(widths)):
        convolution = nn.Conv2d if index < 4 else nn.ConvTranspose2d
        layers += [convolution(inputs, outputs, 3), nn.Sigmoid() if index == 7 else nn.LeakyReLU()]
    return nn.Sequential(*layers)


MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
"""MNIST's published pixel mean and standard deviation (torchvision's examples, Bagdasaryan et
al.'s loader): public constants, not statistics of a run's rows."""


class Standardize(nn.Module):
    """x -> (x − mean) / std with fixed constants: no parameters, no statistic of the batch, so
    every example is transformed on its own."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean = float(mean)
        self.std = float(std)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return (inputs - self.mean) / self.std


class ZeroLogit(nn.Module):
    """(N, 1) scores z -> (N, 2) logits (0, z): softmax gives (1 − σ(z), σ(z))."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(scores), scores], dim=1)


def has_dropout(model: nn.Module) -> bool:
    """Whether ``model`` draws random numbers in training (a dropout layer with p > 0)."""
    return any(
        isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0 for module in model.modules()
    )


def batch_statistics_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The layers of ``model`` (name, module) that no client-level DP guarantee covers: batch
    normalisation (every ``BatchNorm*``, ``SyncBatchNorm`` and their lazy forms) normalises each
    example with the statistics of its whole batch, and batch or instance normalisation with
    ``track_running_stats`` keeps running statistics of the examples it sees in buffers that are
    neither clipped nor noised. Where one batch holds many clients' examples (the one-step path,
    :func:`fairclip.scenarios.tasks.ghost.one_step_gradients`) a client's clipped update would then depend
    on the other clients' data, and its sensitivity would no longer be the bound the noise is
    calibrated to. Opacus refuses the same layers (``opacus.validators.ModuleValidator``);
    ``GroupNorm`` and ``LayerNorm`` normalise each example on its own and are fine."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        or (isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats)
    ]


def model_to_vector(model: nn.Module) -> np.ndarray:
    """The model's parameters as one float64 vector (in logical order, whatever their memory
    format or device)."""
    flat = torch.cat([parameter.detach().reshape(-1) for parameter in model.parameters()])
    return flat.double().cpu().numpy()


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """The torch device of ``training.device``: ``auto`` is a GPU when torch sees one, else the
    CPU; ``cuda`` without a GPU is a ``ValueError`` naming the problem.

    A GPU turns TF32 off for this process (cuDNN convolutions use it by default): TF32 rounds
    float32 products to 10-bit mantissas, so on an H200 the CNNs' per-example gradients from the
    one-step path and from materialised gradients differed by up to 1 % (``tests/test_devices.py``).
    That is precision, not privacy: each path clips the rows it sums by those rows' own norms."""
    if name not in DEVICES:
        raise ValueError(f"training.device must be one of {', '.join(DEVICES)} (got {name!r})")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("training.device is cuda, but torch sees no CUDA device (use auto or cpu)")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return torch.device(name)


def image_layout(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """For image batches (N, C, H, W): move ``model`` to the channels-last memory format and return
    ``features`` in it; other inputs pass through. CPU convolutions and max-pooling run faster
    there (one thread: W1's CNN, 64 images in batches of 32, 31.5 -> 19.6 ms per client; the
    10,000 MNIST test images through the tanh CNN, 3.2 -> 1.6 s); values agree to float rounding.
    :func:`load_vector` puts the parameters back in the default format."""
    if features.dim() != 4:
        return features
    model.to(memory_format=torch.channels_last)
    return features.contiguous(memory_format=torch.channels_last)


def load_vector(model: nn.Module, vector: np.ndarray) -> None:
    """Overwrite the model's parameters with ``vector`` (inverse of :func:`model_to_vector`)."""
    reference = next(model.parameters())
    # a copy: the vector may be read-only (Ray)
    flat = torch.tensor(vector, dtype=reference.dtype, device=reference.device)
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
