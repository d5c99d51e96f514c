"""The ``classification`` task: clients train a torch model on their own examples.

A scenario's data becomes a :class:`FederatedDataset`: every client's training examples, its cohort,
and the test set with one weight vector per cohort (the cohort's test distribution). The
synthetic dataset generates each cohort's clients and test examples from the cohort's own
distribution; real datasets are loaded, optionally skewed, and partitioned
(:mod:`fairclip.scenarios.data`).
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fairclip.plugins import resolve
from fairclip.scenarios.config import ClassificationSpec, TrainingSpec
from fairclip.scenarios.data import cohort_client_counts
from fairclip.scenarios.data.federated_dataset import FederatedDataset
from fairclip.scenarios.data.generated_clients import GeneratedClients, generates_clients
from fairclip.scenarios.data.real_data import outside_epsilon, real_federated_data
from fairclip.scenarios.data.synthetic import sample_cohort
from fairclip.scenarios.models import (
    MODELS,
    batch_statistics_layers,
    build_model,
    has_dropout,
    model_to_vector,
    resolve_device,
)
from fairclip.scenarios.tasks.evaluation import evaluate, evaluate_reconstruction, predict
from fairclip.scenarios.tasks.fairlens import FairLens
from fairclip.scenarios.tasks.fairness import group_fairness, partition
from fairclip.scenarios.tasks.ghost import OneStepGradients, one_step_gradients
from fairclip.scenarios.tasks.training import (
    LocalTraining,
    local_update,
    one_step_updates,
    prepare_training,
    reconstruction_errors,
)
from fairclip.strategies import Policy
from fairclip.strategies.aggregation import cohort_sums
from fairclip.strategies.evaluation import contribution as evaluation_contribution
from fairclip.strategies.randomness import Stream, rng


def synthetic_data(spec: ClassificationSpec, num_clients: int, seed: int) -> FederatedDataset:
    """Each client of cohort k holds ``examples_per_client`` draws of cohort k's distribution."""
    generator = rng(seed, Stream.DATA)
    cohorts = list(spec.cohorts.values())
    sizes = cohort_client_counts([c.share for c in cohorts], num_clients)
    client_cohorts = np.repeat(np.arange(len(cohorts)), sizes)
    train_parts, test_parts = [], []
    for cohort, size in zip(cohorts, sizes, strict=True):
        train_parts.append(
            sample_cohort(cohort.synthetic, spec.features, size * spec.examples_per_client, generator)
        )
        test_parts.append(
            sample_cohort(cohort.synthetic, spec.features, spec.test_examples_per_cohort, generator)
        )
    per_client = spec.examples_per_client
    client_indices = [np.arange(i * per_client, (i + 1) * per_client) for i in range(num_clients)]
    test_owner = np.repeat(np.arange(len(cohorts)), spec.test_examples_per_cohort)
    return FederatedDataset(
        train_x=np.concatenate([x for x, _ in train_parts]),
        train_y=np.concatenate([y for _, y in train_parts]),
        client_indices=client_indices,
        client_cohorts=client_cohorts,
        test_x=np.concatenate([x for x, _ in test_parts]),
        test_y=np.concatenate([y for _, y in test_parts]),
        cohort_weights={name: (test_owner == k).astype(np.float64) for k, name in enumerate(spec.cohorts)},
        num_classes=2,
    )


def federated_data(
    spec: ClassificationSpec, num_clients: int, seed: int, data_dir: Path | None
) -> FederatedDataset:
    """The data of a classification scenario."""
    if spec.dataset == "synthetic":
        return synthetic_data(spec, num_clients, seed)

    return real_federated_data(spec, num_clients, seed, data_dir)


def model_factory(reference: str) -> str | Callable[[tuple[int, ...], int], nn.Module]:
    """A built-in model's name as it is, or the factory a plug-in reference names
    (:mod:`fairclip.plugins`)."""
    if reference in MODELS:
        return reference

    factory = resolve("model", reference)
    if not callable(factory):
        raise ValueError(f"model {reference!r} is {factory!r}, not a callable (input_shape, num_classes)")
    return factory


def checked_model(
    model: object, input_shape: tuple[int, ...], num_classes: int, reconstruction: bool = False
) -> nn.Module:
    """What a model factory returned, if it is a torch module with parameters, without layers
    that batch or running statistics of the clients' data pass through
    (:func:`fairclip.scenarios.models.batch_statistics_layers`), that takes examples of
    ``input_shape`` and gives ``num_classes`` outputs each (an output of ``input_shape`` where
    the model is trained to reconstruct its input, ``reconstruction``): one forward pass of two
    zero examples, without gradients, tells before any training (a width that does not match
    failed deep in torch)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise ValueError("the model factory returned a module without parameters")
    refused = batch_statistics_layers(model)
    if refused:
        name, layer = refused[0]
        raise ValueError(
            f"the model's layer {name!r} is a {type(layer).__name__}: it normalises with batch or "
            "running statistics of the clients' data, which DP does not cover; use GroupNorm or LayerNorm"
        )
    was_training = model.training
    try:
        with torch.no_grad():
            outputs = model.eval()(torch.zeros((2, *input_shape)))
    except Exception as error:  # whatever the user's forward raises
        text = " ".join(str(error).split())
        raise ValueError(
            f"the model fails on examples of shape {input_shape} ({type(error).__name__}: {text}): "
            "does its input layer match the data's features?"
        ) from None
    finally:
        model.train(was_training)
    shape = tuple(outputs.shape[1:]) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
    if reconstruction:
        if shape != tuple(input_shape):
            raise ValueError(
                f"training.objective = reconstruction needs a model whose output has its input's shape "
                f"{tuple(input_shape)} (an autoencoder); this one gives {shape}"
            )
        return model
    if not isinstance(outputs, torch.Tensor) or tuple(outputs.shape) != (2, num_classes):
        raise ValueError(
            f"the model gives {shape} outputs per example, but the data have {num_classes} classes: "
            f"its last layer must give {num_classes} (one logit per class)"
        )
    return model


CPU_ONE_STEP_ROWS = 32
"""``training.one_step_rows`` where it is unset and the task trains on the CPU. Larger calls were
not faster there (tanh CNN, one thread, 256 examples: 0.15-0.19 s in calls of 32 or 64, 0.20-0.23 s
in calls of 128 or 256; ``esipova-cnn``, 30 rounds of 256: 2.73 s at 32, 2.70 at 64, 3.04 at 128),
and small groups let the Ray executor balance its actors."""

GPU_ONE_STEP_ROWS = 1024
"""``training.one_step_rows`` where it is unset and the task trains on a GPU. Each call has a
fixed cost on the host, so a GPU wants many rows a call: on an H100 (2026-11-26) the tanh CNN's
one-step path ran 5,900 examples/s at 32 rows and 27,100 at 256, and on an H200 (2026-11-28)
``zhao-cnn``'s :func:`fairclip.scenarios.tasks.ghost.one_step_gradients` took 7.7 ms for 256 rows,
9.7 ms for 1,024 and 43 ms for 6,000 (33,000, 105,000 and 139,000 examples/s). Its memory grows
with the rows (a convolution's per-example weight gradients are formed, 12 bytes per weight and
row: about 460 MB for ``zhao-cnn`` at 1,024 rows); set the key lower for a model with large
convolutions."""


def rows_per_one_step_call(device: torch.device) -> int:
    """The default examples per one-step call on ``device`` (:data:`CPU_ONE_STEP_ROWS`,
    :data:`GPU_ONE_STEP_ROWS`)."""
    return CPU_ONE_STEP_ROWS if torch.device(device).type == "cpu" else GPU_ONE_STEP_ROWS


_GLOBAL_GENERATOR = threading.Lock()
"""Held while a training call of a model with dropout has torch's process-wide generator seeded
for it (:meth:`ClassificationTask._dropout_masks`)."""


class ClassificationTask:
    """Local SGD on each client's examples; evaluation per cohort on the test set."""

    outside_epsilon: tuple[str, ...] = ()
    """The steps of the data's preprocessing that use a statistic of the rows, outside the run's
    ε (:func:`fairclip.scenarios.data.real_data.outside_epsilon`); none for a user's own dataset, whose
    preprocessing is the user's."""

    def __init__(
        self,
        spec: ClassificationSpec,
        training: TrainingSpec,
        num_clients: int,
        seed: int,
        data_dir: Path | None = None,
    ):

        data = (
            GeneratedClients(spec, num_clients, seed)
            if generates_clients(spec, num_clients)
            else federated_data(spec, num_clients, seed, data_dir)
        )
        self._hold(data, list(spec.cohorts), training, seed, model_factory(spec.model))
        self.outside_epsilon = tuple(outside_epsilon(spec))

    @classmethod
    def from_dataset(
        cls,
        data: FederatedDataset,
        training: TrainingSpec,
        seed: int,
        model: str | Callable[[tuple[int, ...], int], nn.Module],
    ) -> ClassificationTask:
        """The task of a user's dataset and model (a built-in model name, or a factory called
        with the input shape and the number of classes)."""
        task = cls.__new__(cls)
        task._hold(data, data.cohort_names, training, seed, model)
        return task

    def _hold(
        self,
        data: FederatedDataset | GeneratedClients,
        cohort_names: list[str],
        training: TrainingSpec,
        seed: int,
        model: str | Callable[[tuple[int, ...], int], nn.Module],
    ) -> None:
        """Keep ``data`` as tensors and build the model (a name of :func:`build_model`, or a
        factory of (input shape, number of classes)) with the scenario's seed."""
        # Per-client steps on small models: torch's intra-op threads cost far more than they
        # save (measured 1.1 ms vs 58 ms per client on 2 cores), and one thread keeps results
        # identical across processes. Parallelism comes from Ray, one process per core.
        torch.set_num_threads(1)
        prepare_training()
        self.seed = seed
        self.cohort_names = cohort_names
        self.client_cohorts = data.client_cohorts
        self.client_indices = data.client_indices if isinstance(data, FederatedDataset) else None
        self.num_classes = data.num_classes
        self.device = resolve_device(training.device)
        """Where local training and evaluation run (``training.device``); data and models live there."""
        self.generated = data if isinstance(data, GeneratedClients) else None
        """The population whose examples are generated when sampled, or ``None`` (held data)."""
        if self.generated is None:
            self.train_x = torch.from_numpy(data.train_x).to(self.device)
            self.train_y = torch.from_numpy(data.train_y).to(self.device)
            input_shape = tuple(data.train_x.shape[1:])
        else:
            input_shape = (self.generated.features,)
        self.test_x = torch.from_numpy(data.test_x).to(self.device)
        self.test_y = torch.from_numpy(data.test_y).to(self.device)
        self.cohort_weights = data.cohort_weights
        weights = training.class_weights
        if weights is not None and len(weights) != data.num_classes:
            raise ValueError(
                f"training.class_weights has {len(weights)} weights for {data.num_classes} classes"
            )
        self.reconstruction = training.objective == "reconstruction"
        """Each example's loss is its reconstruction error (an autoencoder), not its label's
        cross-entropy (``training.objective``)."""
        self.training = LocalTraining(
            training.local_epochs,
            training.batch_size,
            training.client_lr,
            None if weights is None else tuple(float(w) for w in weights),
            self.reconstruction,
        )
        torch.manual_seed(int(rng(seed, Stream.DATA, 1).integers(2**62)))
        if isinstance(model, str):
            built = build_model(model, input_shape, data.num_classes)
        else:
            built = model(input_shape, data.num_classes)
        # a built-in model is checked too: an autoencoder must reconstruct, a classifier must not
        self.model = checked_model(built, input_shape, data.num_classes, self.reconstruction)
        self.model = self.model.to(self.device)  # initialised on the CPU: the same θ_0 on any device
        self._initial = model_to_vector(self.model)
        self.evaluation_model = copy.deepcopy(self.model)
        """Evaluation's own copy: :func:`predict` may change its memory format."""
        self._dropout = has_dropout(self.model)
        """Whether training draws dropout masks (seeded per call: :meth:`_dropout_masks`)."""
        self.one_step = training.local_epochs == 1 and (
            self.generated.examples_per_client == 1
            if self.generated is not None
            else all(len(ix) == 1 for ix in self.client_indices)
        )
        """Every client holds one example and takes one step: updates are per-sample gradients."""
        self.per_example = training.per_example
        """``training.per_example``: whether one-step clients may be clipped from their norms."""
        self.one_step_rows = training.one_step_rows or rows_per_one_step_call(self.device)
        """``training.one_step_rows``, or the device's default: examples per one-step call."""

    objective: FairLens | None = None
    """The batch regulariser of ``training.objective = "fairlens"`` (:meth:`use_objective`), or
    ``None`` for the plain cross-entropy."""

    def use_objective(self, objective: FairLens) -> None:
        """Train on FairLens's regularised loss (:mod:`fairclip.scenarios.tasks.fairlens`): each one-step
        client's update becomes Δ_i = −η_l (∇ℓ_i + r) with the round's batch term r, computed by
        :meth:`begin_round`. Needs one-example, one-step clients and two classes
        (``ValueError`` otherwise)."""
        if not self.one_step:
            raise ValueError("training.objective = fairlens needs clients of one example that take one step")
        if self.num_classes != 2:
            raise ValueError(f"training.objective = fairlens needs two classes (got {self.num_classes})")
        self.objective = objective
        self._round_terms = {}

    def begin_round(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> None:
        """Before round ``round_number``'s clients train: the objective's batch term r over all
        of them (nothing for the plain cross-entropy). Kept for that round only, shared with the
        :meth:`worker` views."""
        if self.objective is None:
            return
        features, labels = self._examples(client_ids) if len(client_ids) else self._no_examples()
        groups = torch.as_tensor(self.client_cohorts[np.asarray(client_ids, dtype=np.int64)])
        term = self.objective.shift(self.model, model, features, labels, groups.to(features.device))
        self._round_terms.clear()
        self._round_terms[round_number] = term

    def _round_term(self, round_number: int) -> np.ndarray:
        """The batch term r of ``round_number`` (:meth:`begin_round` must have run for it)."""
        term = self._round_terms.get(round_number)
        if term is None:
            raise RuntimeError(
                f"round {round_number}: the FairLens batch term was not computed (begin_round was not "
                "called with the round's clients; only the in-process executor does)"
            )
        return term

    def _no_examples(self) -> tuple[torch.Tensor, torch.Tensor]:
        """An empty batch of this task's examples."""
        return self.train_x[:0], self.train_y[:0]

    @property
    def rows_per_call(self) -> int:
        return self.one_step_rows if self.one_step else 1

    def initial_model(self) -> np.ndarray:
        return self._initial.copy()

    def use_local_examples(self, client: int, features: np.ndarray, labels: np.ndarray) -> None:
        """Let ``client`` train on its own examples (a deployed node's data file) from now on;
        where examples are held out for the clients' evaluation (:meth:`hold_out`), ⌊share·n⌋ of
        these are, a seeded choice of their own (stream ``EVALUATION_DATA``, keyed by the client)."""
        features = np.asarray(features, dtype=np.float32)
        labels = np.asarray(labels)
        if self.generated is not None:
            raise ValueError("a generated population's clients cannot take local examples")
        expected = tuple(self.train_x.shape[1:])
        if features.ndim < 1 or tuple(features.shape[1:]) != expected:
            raise ValueError(f"local examples have shape {features.shape}, expected (n, *{expected})")
        if labels.shape != (features.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"local labels must be {features.shape[0]} integers (got {labels.shape})")
        if features.shape[0] == 0 or labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(f"local labels must lie in 0..{self.num_classes - 1} and not be empty")
        start = self.train_x.shape[0]
        self.train_x = torch.cat([self.train_x, torch.from_numpy(features).to(self.device)])
        self.train_y = torch.cat([self.train_y, torch.from_numpy(labels.astype(np.int64)).to(self.device)])
        rows = np.arange(start, start + features.shape[0])
        if self.holdout_indices is not None:
            count = int(self.holdout_share * len(rows))
            order = rng(self.seed, Stream.EVALUATION_DATA, int(client)).permutation(len(rows))
            self.holdout_indices[client] = rows[order[:count]]
            rows = rows[np.sort(order[count:])]
        self.client_indices[client] = rows
        self.one_step = self.one_step and len(rows) == 1

    holdout_share: float = 0.0
    """The share of each client's examples :meth:`hold_out` held out."""
    holdout_indices: dict[int, np.ndarray] | None = None
    """Each client's held-out examples (rows of ``train_x``), in a seeded order, for its
    evaluation of the model (:meth:`hold_out`); ``None`` where none are held out."""

    def hold_out(self, share: float, seed: int) -> None:
        """Hold ⌊share·n⌋ of each client's n examples out of its training, for its evaluation of
        the released model (``[evaluation] clients``): a seeded choice (stream
        ``EVALUATION_DATA``), kept in that seeded order so that the first m are a seeded subset.
        The client trains on the rest, in their original order. ``ValueError`` for a population
        whose examples are generated when sampled."""
        if self.generated is not None or self.client_indices is None:
            raise ValueError("evaluation.clients needs clients whose examples are held in memory")
        generator = rng(self.seed, Stream.EVALUATION_DATA)
        held: dict[int, np.ndarray] = {}
        training: list[np.ndarray] = []  # a new list: the dataset's own is not changed
        for client in range(len(self.client_cohorts)):
            rows = np.asarray(self.client_indices[client])
            count = int(share * len(rows))
            order = generator.permutation(len(rows))
            held[client] = rows[order[:count]]
            training.append(rows[np.sort(order[count:])])
        if not any(len(rows) for rows in held.values()):
            largest = max((len(rows) for rows in training), default=0)
            raise ValueError(
                f"evaluation.holdout = {share:g} holds out no example of any client (the largest holds "
                f"{largest}; a client holds out floor(holdout x its examples))"
            )
        self.client_indices = training
        self.holdout_indices = held
        self.holdout_share = float(share)

    def evaluation_contributions(
        self, model: np.ndarray, client_ids: np.ndarray, max_examples: int, loss_bound: float
    ) -> np.ndarray:
        """Each client's evaluation vector of ``model`` (one row of 3K per client,
        :func:`fairclip.strategies.evaluation.contribution`): its correct predictions, examples
        and clipped loss sum over the first ``max_examples`` of its held-out examples (the loss
        is the server's evaluation loss: the cross-entropy, times the class weight where the
        training criterion weighs classes). A reconstruction has no correct predictions to count
        (``ValueError``; the configuration refuses ``evaluation.clients`` with it)."""
        if self.reconstruction:
            raise ValueError(
                "evaluation.clients counts correct predictions, which a reconstruction has none of"
            )
        num_cohorts = len(self.cohort_names)
        if self.holdout_indices is None:
            raise RuntimeError("no examples are held out for the clients' evaluation (hold_out)")
        client_ids = np.asarray(client_ids, dtype=np.int64)
        rows = [np.asarray(self.holdout_indices[int(c)])[:max_examples] for c in client_ids]
        vectors = np.zeros((len(client_ids), 3 * num_cohorts))
        if not rows or not sum(len(r) for r in rows):
            return vectors
        index = torch.from_numpy(np.concatenate(rows)).to(self.device)
        features, labels = self.train_x[index], self.train_y[index]
        logits = predict(self.evaluation_model, model, features)
        losses = nn.functional.cross_entropy(logits, labels, reduction="none").double().cpu().numpy()
        if self.training.class_weights is not None:
            losses *= np.asarray(self.training.class_weights, dtype=np.float64)[labels.cpu().numpy()]
        correct = (logits.argmax(dim=1) == labels).cpu().numpy()
        start = 0
        for row, (client, client_rows) in enumerate(zip(client_ids, rows, strict=True)):
            end = start + len(client_rows)
            vectors[row] = evaluation_contribution(
                int(self.client_cohorts[client]),
                num_cohorts,
                correct[start:end],
                losses[start:end],
                max_examples,
                loss_bound,
            )
            start = end
        return vectors

    def keep_clients(self, owned: np.ndarray) -> None:
        """Keep the training examples of the clients ``owned`` (a boolean mask over the N
        clients) and drop every other client's: a Ray actor holds only the clients it trains.
        Training a dropped client afterwards raises ``KeyError``. A generated population holds
        no examples to drop."""
        if self.generated is not None:
            return
        kept = np.flatnonzero(owned)
        rows = [np.asarray(self.client_indices[c]) for c in kept]
        holdout = self.holdout_indices
        evaluation_rows = [np.asarray(holdout[int(c)]) for c in kept] if holdout is not None else []
        parts = [*rows, *evaluation_rows]
        order = torch.from_numpy(np.concatenate(parts) if parts else np.empty(0, dtype=np.int64))
        self.train_x = self.train_x[order.to(self.device)]
        self.train_y = self.train_y[order.to(self.device)]
        held: dict[int, np.ndarray] = {}
        start = 0
        for client, client_rows in zip(kept, rows, strict=True):
            held[int(client)] = np.arange(start, start + len(client_rows))
            start += len(client_rows)
        self.client_indices = _HeldClients(held)
        if holdout is not None:
            held_out: dict[int, np.ndarray] = {}
            for client, client_rows in zip(kept, evaluation_rows, strict=True):
                held_out[int(client)] = np.arange(start, start + len(client_rows))
                start += len(client_rows)
            self.holdout_indices = _HeldClients(held_out)

    @contextlib.contextmanager
    def _dropout_masks(self, round_number: int, first_client: int) -> Iterator[None]:
        """Seed torch's generator for a training call of a model with dropout (``eicu-mlp``) from
        the run's seed, the round and the call's first client, and restore it afterwards: the
        calls (the executors' fixed groups, :func:`fairclip.strategies.aggregation.group_blocks`)
        and so the masks are the same on every executor, with any number of workers, and after a
        resume. Dropout draws nothing from the private data, so the clipped contributions keep
        their bound. torch's generator is one per process, so worker threads
        (:class:`fairclip.sims.executors.local.LocalExecutor`) take turns in these calls; a model
        without dropout draws nothing and runs them side by side."""
        if not self._dropout:
            yield
            return
        devices = []  # the CUDA device whose generator is forked too (fork_rng takes indices)
        if self.device.type == "cuda":
            devices = [torch.cuda.current_device() if self.device.index is None else self.device.index]
        with _GLOBAL_GENERATOR, torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.manual_seed(int(rng(self.seed, Stream.DROPOUT, round_number, first_client).integers(2**62)))
            yield

    def local_updates(self, model: np.ndarray, client_ids: np.ndarray, round_number: int) -> np.ndarray:
        if self.one_step:
            # The sample-level special case (docs/design.md, section 2): no shuffling to draw, so no
            # per-client generator; all sampled clients' gradients at once.
            if len(client_ids) == 0:
                return np.empty((0, model.shape[0]))
            with self._dropout_masks(round_number, int(client_ids[0])):
                updates = one_step_updates(
                    self.model,
                    model,
                    *self._examples(client_ids),
                    self.training.lr,
                    class_weights=self.training.class_weights,
                    reconstruction=self.reconstruction,
                )
            if self.objective is not None:  # Δ_i = −η_l (∇ℓ_i + r)
                updates -= self.training.lr * self._round_term(round_number)[None, :]
            return updates
        updates = np.empty((len(client_ids), model.shape[0]))
        for row, client in enumerate(client_ids):
            features, labels = self._examples(np.array([client]))
            generator = torch.Generator().manual_seed(
                int(rng(self.seed, Stream.CLIENT, round_number, client).integers(2**62))
            )
            with self._dropout_masks(round_number, int(client)):
                updates[row] = local_update(self.model, model, features, labels, self.training, generator)
        return updates

    def forms_updates(self, policy: Policy) -> bool:
        """Whether a call for ``policy`` forms its clients' update rows (``local_updates``), or
        clips one-step clients of a row-scaling policy from their per-example norms without
        forming them (:meth:`per_example_gradients`)."""
        if self.objective is not None:  # rows ∇ℓ_i + r are no scalings of ∇ℓ_i
            return True
        return not (self.one_step and self.per_example == "auto" and policy.row_scaling)

    def per_example_gradients(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int, policy: Policy
    ) -> OneStepGradients | None:
        """The norms and factor-weighted sums of ``local_updates(model, client_ids, ...)`` without
        forming the updates: one-step clients of a row-scaling policy on a model of ``Linear``,
        ``Conv2d``, ``ConvTranspose2d`` and ``GroupNorm`` layers
        (:mod:`fairclip.scenarios.tasks.ghost`). ``None`` where that does not apply (the executor
        then materialises the updates)."""
        return (
            None if self.forms_updates(policy) else self._norm_only_gradients(model, client_ids, round_number)
        )

    def _norm_only_gradients(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int
    ) -> OneStepGradients | None:
        """:meth:`per_example_gradients` whatever the policy: ``None`` where the updates must be
        formed (not one-step clients, ``per_example`` not ``auto``, an objective's term, a layer
        the norm-only path does not take) or there are no clients."""
        if self.objective is not None or not (self.one_step and self.per_example == "auto"):
            return None
        if not len(client_ids):
            return None
        with self._dropout_masks(round_number, int(client_ids[0])):
            return one_step_gradients(
                self.model,
                model,
                *self._examples(client_ids),
                self.training.lr,
                self.training.class_weights,
                self.reconstruction,
            )

    def _examples(self, client_ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The training examples and labels of ``client_ids``, in their order."""
        if self.generated is not None:
            features, labels = self.generated.examples(client_ids)
            return torch.from_numpy(features).to(self.device), torch.from_numpy(labels).to(self.device)
        indices = np.concatenate([self.client_indices[c] for c in client_ids])
        rows = torch.from_numpy(indices).to(self.device)
        return self.train_x[rows], self.train_y[rows]

    def worker(self) -> ClassificationTask:
        """This task with its own copy of the model (local training writes θ into the model)."""
        view = copy.copy(self)
        view.model = copy.deepcopy(self.model)
        return view

    def evaluate(self, model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        if self.reconstruction:
            return evaluate_reconstruction(
                self.evaluation_model, model, self.test_x, self.test_y, self.cohort_weights, self.num_classes
            )
        return evaluate(
            self.evaluation_model,
            model,
            self.test_x,
            self.test_y,
            self.cohort_weights,
            self.num_classes,
            class_weights=self.training.class_weights,
        )

    def group_metrics(self, model: np.ndarray) -> tuple[dict[str, float], dict[str, dict[str, float]]] | None:
        """Fairlearn's group metrics of ``model`` on the test set (:mod:`fairclip.scenarios.tasks.fairness`):
        binary tasks whose cohorts partition the test rows; ``None`` for any other (and for a
        reconstruction, which predicts no class)."""
        rows = partition(self.cohort_weights)
        if self.num_classes != 2 or rows is None or self.reconstruction:
            return None
        predictions = predict(self.evaluation_model, model, self.test_x).argmax(dim=1).cpu().numpy()
        return group_fairness(self.test_y.cpu().numpy(), predictions, rows, list(self.cohort_weights))

    def train_losses(self, model: np.ndarray, limit: int | None = None) -> dict[str, float]:
        """Each cohort's mean training loss of ``model`` (the cross-entropy, or the reconstruction
        error of an autoencoder: :meth:`_example_losses`) over its clients' training examples
        (``training.train_loss``): a simulation-only diagnostic of private data. With ``limit``
        (``training.train_loss_limit``), over a seeded subset of at most that many of each
        cohort's examples (the same subset for every policy of a seed)."""
        if self.generated is not None or self.client_indices is None:
            raise ValueError("training.train_loss needs the clients' examples held in memory")
        cohort_rows = {}
        for index, name in enumerate(self.cohort_names):
            clients = np.flatnonzero(self.client_cohorts == index)
            rows = [np.asarray(self.client_indices[c]) for c in clients]
            rows = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
            if limit is not None and rows.size > limit:
                rows = np.sort(rng(self.seed, Stream.DATA, 5, index).permutation(rows)[:limit])
            cohort_rows[name] = rows
        needed = np.unique(np.concatenate([np.empty(0, dtype=np.int64), *cohort_rows.values()]))
        rows_tensor = torch.from_numpy(needed).to(self.train_x.device)
        losses = self._example_losses(model, self.train_x[rows_tensor], self.train_y[rows_tensor])
        return {
            name: float(losses[np.searchsorted(needed, rows)].mean()) if rows.size else float("nan")
            for name, rows in cohort_rows.items()
        }

    def cohort_batch_losses(self, model: np.ndarray, client_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each cohort's summed loss of ``model`` (:meth:`_example_losses`) over the training examples of the
        sampled clients ``client_ids`` that belong to it, and how many examples that is
        (``training.train_loss = "last-epoch"`` and ``"last-epoch-examples"``,
        :mod:`fairclip.server.last_epoch`): a simulation-only diagnostic of private data. Reads
        the evaluation model only; no randomness is drawn."""
        if self.generated is not None or self.client_indices is None:
            raise ValueError("training.train_loss needs the clients' examples held in memory")
        sums, counts = np.zeros(len(self.cohort_names)), np.zeros(len(self.cohort_names))
        ids = np.asarray(client_ids, dtype=np.int64)
        if not len(ids):
            return sums, counts
        losses = self._example_losses(model, *self._examples(ids))
        sizes = [len(self.client_indices[client]) for client in ids]
        cohorts = np.repeat(self.client_cohorts[ids], sizes)
        np.add.at(sums, cohorts, losses)
        np.add.at(counts, cohorts, 1.0)
        return sums, counts

    def cohort_update_sums(
        self, model: np.ndarray, client_ids: np.ndarray, round_number: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each cohort's sum of the finite updates Δ_i that the sampled clients ``client_ids`` train
        from ``model`` in round ``round_number`` (K × d), and each cohort's sampled clients (K):
        :meth:`local_updates`, a function of θ_t, the client and the round, formed here in calls
        of :attr:`rows_per_call` clients (``training.train_loss``'s "average gradient norm",
        :mod:`fairclip.server.last_epoch`). A simulation-only diagnostic of private data; it
        changes no step (dropout masks are seeded per call, so a model with dropout on the
        one-step path draws them per call of this diagnostic, not of the round's training)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        num_cohorts = len(self.cohort_names)
        counts = np.bincount(self.client_cohorts[ids], minlength=num_cohorts).astype(np.float64)
        sums = np.zeros((num_cohorts, model.shape[0]))
        step = max(1, self.rows_per_call)
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            cohorts = self.client_cohorts[chunk]
            gradients = self._norm_only_gradients(model, chunk, round_number)
            if gradients is not None:  # each cohort's sum of its rows, which are never formed
                groups = np.where(np.isfinite(gradients.norms), cohorts, -1)
                sums += gradients.grouped_sums(groups, np.ones((1, len(chunk))), num_cohorts)[0]
                continue
            updates = self.local_updates(model, chunk, round_number)
            groups = np.where(np.isfinite(updates).all(axis=1), cohorts, -1)
            sums += cohort_sums(updates, groups, num_cohorts)
        return sums, counts

    def _example_losses(self, model: np.ndarray, features: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
        """Each example's loss under ``model`` (float64), with the evaluation model: its
        cross-entropy (without class weights), or its reconstruction error for an autoencoder."""
        outputs = predict(self.evaluation_model, model, features)
        if self.reconstruction:
            return reconstruction_errors(outputs, features).double().cpu().numpy()
        return nn.functional.cross_entropy(outputs, labels, reduction="none").double().cpu().numpy()

    def summary(self, model: np.ndarray) -> dict[str, Any]:
        """``preprocessing.outside_epsilon``, the preprocessing steps outside the run's ε, where
        there are any (Adult scaled by the training rows' statistics, say); nothing otherwise."""
        if not self.outside_epsilon:
            return {}
        return {"preprocessing": {"outside_epsilon": list(self.outside_epsilon)}}


class _HeldClients(dict):
    """``client_indices`` after :meth:`ClassificationTask.keep_clients`: the rows of the clients
    held; any other client is a ``KeyError`` that says so."""

    def __missing__(self, client: int) -> np.ndarray:
        raise KeyError(f"client {client} is not held by this worker (keep_clients dropped its data)")
