"""Issue 19, point 4: ``training.device = auto|cpu|cuda``. This machine has no GPU: the CUDA
path is exercised by the test at the end wherever torch sees one, and skipped (with its reason
printed by ``-ra``) where it does not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fairclip
from fairclip.scenarios.models import resolve_device

HAS_CUDA = torch.cuda.is_available()
SMALL = {"federation.num_clients": 60, "training.rounds": 3, "policy.name": "bounded", "seed": 2}


def test_auto_picks_a_gpu_only_when_torch_sees_one():
    assert resolve_device("auto").type == ("cuda" if HAS_CUDA else "cpu")
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match=r"training\.device"):
        resolve_device("tpu")


@pytest.mark.skipif(HAS_CUDA, reason="auto is the GPU here; the GPU test compares the devices")
def test_auto_is_the_cpu_here_and_gives_the_cpu_run():
    auto = fairclip.simulate("demo", overrides={**SMALL, "training.device": "auto"})
    cpu = fairclip.simulate("demo", overrides={**SMALL, "training.device": "cpu"})
    np.testing.assert_array_equal(auto.model, cpu.model)
    assert auto.summary["config"]["training"]["device"] == "auto"
    # The summary says where it trained: the setting alone ("auto") does not.
    assert auto.summary["provenance"]["execution"]["device"] == "cpu"


@pytest.mark.skipif(HAS_CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_before_any_work(cli, tmp_path):
    out = tmp_path / "run"
    status, _, err = cli("run", "--scenario", "demo", "--set", "training.device=cuda", "--out", str(out))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "training.device: cuda, but torch sees no CUDA device" in err
    assert not out.exists()


def test_a_gpu_run_turns_tf32_off(monkeypatch):
    """TF32 would make the norms that clipping uses differ from the gradients summed (see
    ``resolve_device``): resolving a CUDA device turns it off for the process."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        assert resolve_device("auto").type == "cuda"
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_ray_asks_for_gpus_only_where_there_are_some(monkeypatch):
    ray = pytest.importorskip("ray", reason="Ray is not installed here (a bare GPU machine)")

    from fairclip.sims.executors.ray import gpu_share

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    assert gpu_share("auto", 4) == 0.0
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    assert gpu_share("cpu", 4) == 0.0
    assert gpu_share("auto", 4) == 0.5 and gpu_share("cuda", 8) == 0.25
    assert gpu_share("cuda", 1) == 1.0  # one GPU each at most


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the GPU path runs where torch sees one")
def test_clients_train_and_the_server_evaluates_on_the_gpu():
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.scenarios.tasks.classification import GPU_ONE_STEP_ROWS, rows_per_one_step_call

    settings = [f"{key}={value}" for key, value in SMALL.items()]
    task = build_task(load_config("demo", None, [*settings, "training.device=cuda"]))
    assert next(task.model.parameters()).is_cuda and task.train_x.is_cuda and task.test_x.is_cuda
    assert task.one_step_rows == rows_per_one_step_call(torch.device("cuda")) == GPU_ONE_STEP_ROWS
    updates = task.local_updates(task.initial_model(), np.arange(5), 1)
    assert updates.dtype == np.float64 and np.isfinite(updates).all()

    gpu = fairclip.simulate("demo", overrides={**SMALL, "training.device": "cuda"})
    cpu = fairclip.simulate("demo", overrides={**SMALL, "training.device": "cpu"})
    assert gpu.summary["provenance"]["execution"]["device"] == "cuda"
    assert cpu.summary["provenance"]["execution"]["device"] == "cpu"
    np.testing.assert_allclose(gpu.model, cpu.model, atol=1e-3)
    np.testing.assert_allclose(gpu.cohorts["accuracy"], cpu.cohorts["accuracy"], atol=0.02)


CUDNN_SUM_TOLERANCE = {True: 1e-3, False: 1e-4}
"""How far (times the largest |sum|) the one-step path's clipped sum may lie from the materialised
one on the GPU. cuDNN's float32 convolutions are not always as exact as float32 rounding: on an
H100 (2026-11-26), against float64, xu-cnn's per-example gradients (5×5 kernels) were off by
1.5e-4 of the largest on both paths alike with cuDNN (the paths' 16-example sums then differed by
2e-4 of theirs), 3e-7 without it; the 3×3 CNNs by under 7e-7 either way. That is precision, not
privacy: each path clips the rows it sums by those rows' own norms."""


@pytest.fixture(params=[True, False], ids=["cudnn", "no-cudnn"])
def cudnn(request):
    before = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = request.param
    yield request.param
    torch.backends.cudnn.enabled = before


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the GPU path runs where torch sees one")
@pytest.mark.parametrize(
    "model_name", ["logistic", "mlp-tanh", "esipova-cnn", "zhao-cnn", "xu-cnn", "galli-cnn"]
)
def test_norms_from_activations_on_the_gpu_equal_the_materialised_ones(model_name, cudnn):
    """The one-step path's per-example norms and clipped sums (``client.ghost``) on CUDA equal the
    materialised per-example gradients on CUDA, and the CPU's norms, to float32 rounding (to
    cuDNN's precision where it runs the convolutions, :data:`CUDNN_SUM_TOLERANCE`); the sums formed
    block by block and all at once (:meth:`OneStepGradients.block_weighted_sums`) agree."""
    from fairclip.client.contributions import contribute_blocks, contribute_scaled_blocks
    from fairclip.scenarios.models import build_model, model_to_vector
    from fairclip.scenarios.tasks.ghost import one_step_gradients
    from fairclip.scenarios.tasks.training import one_step_updates
    from fairclip.strategies.clipping import row_norms
    from fairclip.strategies.registry import build_policy

    resolve_device("cuda")  # as a run on the GPU does: TF32 off
    torch.manual_seed(0)
    shape = (1, 6, 6) if model_name in ("logistic", "mlp-tanh") else (1, 28, 28)
    model = build_model(model_name, shape, 10)
    theta = model_to_vector(model)
    features = torch.randn(16, *shape, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(16) % 10
    cpu = one_step_gradients(model, theta, features, labels, lr=0.5)
    model.to("cuda")
    gpu_features, gpu_labels = features.to("cuda"), labels.to("cuda")
    gradients = one_step_gradients(model, theta, gpu_features, gpu_labels, lr=0.5)
    updates = one_step_updates(model, theta, gpu_features, gpu_labels, lr=0.5)
    norms = row_norms(updates)
    np.testing.assert_allclose(gradients.norms, norms, rtol=1e-4)
    np.testing.assert_allclose(gradients.norms, cpu.norms, rtol=1e-4)
    policy = build_policy("constant", {"initial_bound": float(np.median(norms))}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(theta.shape[0]))
    cohorts = np.arange(16) % 2
    want = contribute_blocks(policy, params, updates, cohorts, 2, [16])[0]
    have = contribute_scaled_blocks(policy, params, gradients, cohorts, 2, [16])[0]
    scale = float(np.abs(want.contribution_sum).max())
    assert scale > 0
    tolerance = CUDNN_SUM_TOLERANCE[cudnn] * scale
    np.testing.assert_allclose(have.contribution_sum, want.contribution_sum, atol=tolerance)
    blocks, weights = (
        [slice(0, 5), slice(5, 5), slice(5, 16)],
        [np.ones((2, 5)), np.ones((2, 0)), np.ones((2, 11))],
    )
    at_once = gradients.block_weighted_sums(blocks, weights, batched=True)
    one_by_one = gradients.block_weighted_sums(blocks, weights, batched=False)
    for batched, looped in zip(at_once, one_by_one, strict=True):
        np.testing.assert_allclose(batched, looped, rtol=1e-10, atol=1e-12 * (1 + np.abs(looped).max()))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: the GPU path runs where torch sees one")
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("name", ["constant", "online"])
def test_block_sums_added_on_the_gpu_equal_the_host_total_bit_for_bit(name, batched):
    """The in-process executor leaves each block's contribution sum (and ``online``'s direction
    report, as large as the model) on the GPU and adds them there
    (:func:`fairclip.sims.executors.local.add_in_order_on_device`); the Ray executor copies every
    block to the host and adds them there. Both must give the same bits."""
    from fairclip.client.contributions import contribute_scaled_blocks
    from fairclip.scenarios.models import build_model, model_to_vector
    from fairclip.scenarios.tasks.ghost import one_step_gradients
    from fairclip.sims.executors.local import add_in_order_on_device
    from fairclip.strategies.aggregation import add_in_order
    from fairclip.strategies.registry import build_policy

    resolve_device("cuda")
    torch.manual_seed(0)
    model = build_model("zhao-cnn", (1, 28, 28), 10).to("cuda")
    theta = model_to_vector(model)
    count, sizes = 48, [9, 0, 17, 1, 21]
    features = torch.randn(count, 1, 28, 28, generator=torch.Generator().manual_seed(2)).to("cuda")
    gradients = one_step_gradients(model, theta, features, (torch.arange(count) % 10).to("cuda"), lr=0.5)
    blocks = [slice(0, 9), slice(9, 9), slice(9, 26), slice(26, 27), slice(27, 48)]
    weights = [np.random.default_rng(j).uniform(-1, 1, (2, b.stop - b.start)) for j, b in enumerate(blocks)]
    host = gradients.block_weighted_sums(blocks, weights, batched=batched)
    kept = gradients.block_weighted_sums(blocks, weights, batched=batched, on_device=True)
    for have, want in zip(kept, host, strict=True):
        assert have.device.type == "cuda"
        assert have.cpu().numpy().tobytes() == want.tobytes()
    policy = build_policy(name, {"initial_bound": float(np.median(gradients.norms))}, num_cohorts=2)
    params = policy.broadcast(policy.initial_state(theta.shape[0]))
    cohorts = np.arange(count) % 2
    want = add_in_order(contribute_scaled_blocks(policy, params, gradients, cohorts, 2, sizes))
    parts = contribute_scaled_blocks(policy, params, gradients, cohorts, 2, sizes, on_device=True)
    assert all(part.contribution_sum.device.type == "cuda" for part in parts)
    assert all(isinstance(part.report_sum, torch.Tensor) == (name == "online") for part in parts)
    total = add_in_order_on_device(parts)
    assert np.abs(want.contribution_sum).max() > 0
    assert total.contribution_sum.tobytes() == want.contribution_sum.tobytes()
    assert total.report_sum.tobytes() == want.report_sum.tobytes()


CPU_AND_GPU = pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not HAS_CUDA, reason="no CUDA device: the GPU path runs where torch sees one"
            ),
        ),
    ],
)
"""Runs on the CPU here and on the GPU where torch sees one."""


@CPU_AND_GPU
def test_a_run_with_its_block_sums_on_the_device_is_the_run_with_them_on_the_host(device):
    """Whole noisy one-step runs (the demo's CNN, one example per client): the in-process executor's
    block sums kept and added where the gradients are (on a GPU by default; forced here on the
    CPU too) give the run that copying every block to the host and adding there gives (what Ray
    actors do, and the executor where the sums would not fit the GPU's share), bit for bit."""
    import pandas as pd

    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.sims.executors.local import LocalExecutor
    from fairclip.sims.executors.loop import simulate

    settings = [
        "scenario.examples_per_client=1",
        "federation.num_clients=400",
        "federation.sample_rate=0.3",
        "training.rounds=3",
        "policy.name=bounded",
        "privacy.noise_multiplier=0.6",
        f"training.device={device}",
        "seed=4",
    ]
    config = load_config("demo", None, settings)
    runs = {}
    for where in ("device", "host"):
        task = build_task(config)
        assert task.one_step

        def executor(task, policy, where=where):
            executor = LocalExecutor(task, policy)
            assert (executor._device_bytes > 0) == (device == "cuda")  # the default: a GPU only
            executor._device_bytes = 2**62 if where == "device" else 0
            return executor

        runs[where] = simulate(config, task, executor)
    pd.testing.assert_frame_equal(
        pd.DataFrame(runs["device"].rows), pd.DataFrame(runs["host"].rows), check_exact=True
    )
    np.testing.assert_array_equal(runs["device"].model, runs["host"].model)


@CPU_AND_GPU
def test_dropout_masks_are_seeded_per_call_on_each_device(device):
    """eicu-mlp's dropout draws from the device's generator: each training call forks and seeds
    it (ClassificationTask._dropout_masks), so a run does not depend on the generator's state
    when it starts (without the seeding this run differs)."""
    from fairclip.scenarios.config import load_config
    from fairclip.scenarios.tasks import build_task
    from fairclip.sims.executors.loop import simulate

    settings = ["scenario.examples_per_client=1", "federation.num_clients=300", "federation.sample_rate=0.3"]
    settings += ["training.rounds=3", "scenario.model=eicu-mlp", "policy.name=adaptive"]
    config = load_config("demo", None, [*settings, f"training.device={device}"])
    first = simulate(config, build_task(config))
    task = build_task(config)
    torch.manual_seed(99)  # every device's generator elsewhere: the calls seed their own
    second = simulate(config, task)
    np.testing.assert_array_equal(first.model, second.model)
