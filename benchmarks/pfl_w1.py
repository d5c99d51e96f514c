"""W1 on Apple's pfl-research 0.6.0 (run by :func:`benchmarks.w1.run_pfl` through ``torchrun``,
one process per core, in a Python that has pfl installed; see ``benchmarks/setup_pfl.sh``).

Same data (:func:`benchmarks.imagetask.synthetic_images`), model (:func:`w1_cnn`), local
training (one epoch, batch 32, SGD) and cohort size (q·N per round, fixed) as fairclip's W1;
FedAvg with pfl's central Gaussian mechanism (clipping bound 1, noise 1 × bound, weight by user).
pfl has an adaptive-clipping mechanism too, but ``bounded`` (adaptive with a lower bound) has no
pfl counterpart, so the fixed-bound mechanism stands in: the DP work per update is the same
(clip one update, noise the sum once per round). Rank 0 writes ``--out``: seconds of
``algorithm.run`` (the rounds) and the number of client updates.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--per-client", type=int, default=64)
    parser.add_argument("--sample-rate", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(1)
    # What torch.optim imports on its first step (1.0-1.6 s), outside the clock, as fairclip's
    # tasks and the floor do (fairclip.scenarios.tasks.training.prepare_training).
    import torch._dynamo

    np.random.seed(0)
    torch.manual_seed(0)
    # pfl's model module first, before its other components (pfl's own advice).
    from pfl.model.pytorch import PyTorchModel  # isort: skip
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import Weighted
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

    from .images import synthetic_images, w1_cnn

    data = synthetic_images(args.clients, args.per_client, 1, seed=0)
    train_x = torch.from_numpy(data["train_x"])
    train_y = torch.from_numpy(data["train_y"])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # The channels-last memory format, as fairclip's local training uses for images.
            self.net = w1_cnn().to(memory_format=torch.channels_last)
            self.cross_entropy = torch.nn.CrossEntropyLoss()

        def forward(self, x):
            return self.net(x.contiguous(memory_format=torch.channels_last))

        def loss(self, x, y, eval=False):
            self.eval() if eval else self.train()
            return self.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=False):
            self.eval() if eval else self.train()
            logits = self(x)
            loss = torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct = (logits.argmax(1) == y).sum().item()
            return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}

    def make_dataset(user_id: int):
        rows = slice(user_id * args.per_client, (user_id + 1) * args.per_client)
        return Dataset(raw_data=[train_x[rows], train_y[rows]], user_id=user_id)

    user_ids = list(range(args.clients))
    federated = FederatedDataset(make_dataset, get_user_sampler("minimize_reuse", user_ids))
    network = Model()
    params = [p for p in network.parameters() if p.requires_grad]
    model = PyTorchModel(
        model=network,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(params, 1.0),
    )
    mechanism = CentrallyAppliedPrivacyMechanism(GaussianMechanism(1.0, 1.0))
    backend = SimulatedBackend(
        training_data=federated, val_data=None, postprocessors=[WeightByUser(), mechanism]
    )
    cohort = max(1, round(args.sample_rate * args.clients))
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=args.rounds,
        evaluation_frequency=10**9,
        train_cohort_size=cohort,
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(local_learning_rate=0.05, local_num_epochs=1, local_batch_size=32)
    eval_params = NNEvalHyperParams(local_batch_size=256)
    started = time.perf_counter()
    FederatedAveraging().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=eval_params,
        callbacks=[],
    )
    seconds = time.perf_counter() - started
    distributed = get_default_framework_module()
    rank = int(getattr(getattr(distributed, "distributed", None), "global_rank", 0) or 0)
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump(
                {
                    "seconds": seconds,
                    "client_updates": cohort * args.rounds,
                    "rounds": args.rounds,
                    "cohort_size": cohort,
                    "mechanism": "central Gaussian, fixed bound 1, noise 1",
                },
                handle,
            )


if __name__ == "__main__":
    main()
