"""my_data.py: a federated data set of two cohorts and a small MLP, for fairclip."""

import numpy as np
import torch

import fairclip


def load(num_clients, seed, examples_per_client=10, minority_share=0.25):
    rng = np.random.default_rng(seed)
    owner = np.repeat(np.arange(num_clients), examples_per_client)
    cohort = np.where(np.arange(num_clients) < (1 - minority_share) * num_clients, "majority", "minority")
    x = rng.normal(size=(len(owner), 5)).astype(np.float32)
    y = (x[:, 0] + 2 * (cohort[owner] == "minority") * x[:, 1] > 0).astype(int)
    test_cohort = np.repeat(["majority", "minority"], 200)
    test_x = rng.normal(size=(400, 5)).astype(np.float32)
    test_y = (test_x[:, 0] + 2 * (test_cohort == "minority") * test_x[:, 1] > 0).astype(int)
    return fairclip.FederatedDataset.from_arrays(
        x, y, clients=owner, cohorts=cohort, test_x=test_x, test_y=test_y, test_cohorts=test_cohort
    )


def small_mlp(input_shape, num_classes):
    width = int(np.prod(input_shape))
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(width, 16), torch.nn.ReLU(), torch.nn.Linear(16, num_classes)
    )
