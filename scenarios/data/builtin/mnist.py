"""MNIST (``mnist``), and its class-skewed variant (``skewed-mnist``, :func:`load_dataset` only;
a scenario skews with ``skew_class``).

What is done, exactly
=====================

MNIST and Fashion-MNIST (:func:`load_mnist`, :func:`load_fashion_mnist`)
    The gzip IDX files are parsed with numpy: magic number 2051 (images, unsigned bytes, 3
    dimensions) or 2049 (labels, 1 dimension), big-endian dimensions, and a payload whose length
    must equal their product. Images become ``(n, 1, 28, 28)`` float32 pixel/255 in [0, 1]; no
    mean/std normalisation (a model may add it). The original train (60,000) and test (10,000)
    splits are kept; 10 classes.

Skewed MNIST (:func:`skew_class`, seeds 000/003/004)
    Each *training* example of class ``cls`` (8) is kept independently with probability ``keep``
    (0.09), drawn from ``numpy.random.default_rng(seed)``: of MNIST's 5,851 eights about 527 ± 22
    remain (the papers quote "about 500"). Every other class and the whole test set are untouched.

"""

from __future__ import annotations

import os

from fairclip.scenarios.data.datasets import Dataset, load_idx_dataset, skew_class
from fairclip.scenarios.data.files import mirrored
from fairclip.scenarios.dataset_registry import DatasetSpec, register

FILES = {
    "mnist/t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "mnist/t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "mnist/train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "mnist/train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
}
"""SHA-256 of each file, by path under the data directory."""
MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/")


def load_mnist(data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """MNIST: 60,000 train and 10,000 test images ``(n, 1, 28, 28)`` in [0, 1], 10 classes."""
    return load_idx_dataset(data_dir, "mnist", "mnist")


def _skewed(data_dir: str | os.PathLike[str] | None, seed: int) -> Dataset:
    """``skewed-mnist``: MNIST with 9 % of the training eights kept (:func:`skew_class`)."""
    return skew_class(load_mnist(data_dir), cls=8, keep=0.09, seed=seed)


SPEC = register(
    DatasetSpec(
        name="mnist",
        summary="MNIST handwritten digits: 60,000 training and 10,000 test images, 10 classes",
        files=FILES,
        sources={relative: mirrored(relative, MIRRORS) for relative in FILES},
        load=lambda data_dir, seed: load_mnist(data_dir),
        aliases={"skewed-mnist": _skewed},
    )
)
