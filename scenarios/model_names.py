"""The names of fairclip's built-in models (:func:`fairclip.scenarios.models.build_model`), in a
module without torch, so that a configuration is checked without importing it."""

MODELS = (
    "logistic",
    "binary-logistic",
    "sigmoid-logistic",
    "mlp",
    "mlp-tanh",
    "binary-mlp",
    "eicu-mlp",
    "cnn",
    "tanh-cnn",
    "esipova-cnn",
    "zhao-cnn",
    "xu-cnn",
    "xu-cnn-normalized",
    "galli-cnn",
    "galli-autoencoder",
    "zhao-resnet18",
)

IMAGE_MODELS = (
    "cnn",
    "tanh-cnn",
    "esipova-cnn",
    "zhao-cnn",
    "xu-cnn",
    "xu-cnn-normalized",
    "galli-cnn",
    "galli-autoencoder",
    "zhao-resnet18",
)
"""The built-in models that take images (channels, height, width)."""

AUTOENCODERS = ("galli-autoencoder",)
"""The built-in models whose output has their input's shape (``training.objective =
"reconstruction"``)."""
