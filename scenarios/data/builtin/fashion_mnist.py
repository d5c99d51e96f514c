"""Fashion-MNIST (``fashion-mnist``): the gzip IDX files are read as MNIST's are
(:func:`fairclip.scenarios.data.datasets.read_idx`): ``(n, 1, 28, 28)`` float32 pixel/255 in
[0, 1], the original train (60,000) and test (10,000) splits, 10 classes."""

from __future__ import annotations

import os

from fairclip.scenarios.data.datasets import Dataset, load_idx_dataset
from fairclip.scenarios.data.files import mirrored
from fairclip.scenarios.dataset_registry import DatasetSpec, register

FILES = {
    "fashion-mnist/t10k-images-idx3-ubyte.gz": (
        "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"
    ),
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": (
        "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"
    ),
    "fashion-mnist/train-images-idx3-ubyte.gz": (
        "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"
    ),
    "fashion-mnist/train-labels-idx1-ubyte.gz": (
        "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"
    ),
}
"""SHA-256 of each file, by path under the data directory."""
MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)


def load_fashion_mnist(data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """Fashion-MNIST: 60,000 train and 10,000 test images ``(n, 1, 28, 28)`` in [0, 1], 10 classes."""
    return load_idx_dataset(data_dir, "fashion-mnist", "fashion-mnist")


SPEC = register(
    DatasetSpec(
        name="fashion-mnist",
        summary="Fashion-MNIST clothing images: 60,000 training and 10,000 test images, 10 classes",
        files=FILES,
        sources={relative: mirrored(relative, MIRRORS) for relative in FILES},
        load=lambda data_dir, seed: load_fashion_mnist(data_dir),
    )
)
