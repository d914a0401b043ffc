"""A small model trains on the device exactly as on the CPU."""

import copy

import pytest
import torch

from tests.conftest import DEVICE


def _train(model, device, steps=3):
    torch.manual_seed(0)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(16, 8).to(device)
    y = torch.randn(16, 4).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_forward_backward_step_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cpu_losses, cpu_params = _train(copy.deepcopy(model), "cpu")
    dev_losses, dev_params = _train(copy.deepcopy(model), DEVICE)
    torch.testing.assert_close(dev_losses, cpu_losses)
    for a, b in zip(dev_params, cpu_params):
        torch.testing.assert_close(a, b)


def test_small_cnn_forward_backward_step_matches_cpu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 2 * 4, 4)
    )

    def reshape_first(m):
        return torch.nn.Sequential(torch.nn.Unflatten(1, (8, 1, 1)), torch.nn.Upsample(size=(2, 4)), m)

    cpu_losses, cpu_params = _train(reshape_first(copy.deepcopy(model)), "cpu")
    dev_losses, dev_params = _train(reshape_first(copy.deepcopy(model)), DEVICE)
    torch.testing.assert_close(dev_losses, cpu_losses)
    for a, b in zip(dev_params, cpu_params):
        torch.testing.assert_close(a, b)


# Operators a first model's training step may still run on the CPU fallback in a fresh project,
# each with why. Empty: `backendgen new` makes every operator the model below calls native (the
# template's default_ops: matrix products, relu, batch norm, log_softmax/nll_loss, and the
# per-tensor updates the optimizers' foreach paths call). Add one here only with its reason.
FIRST_MODEL_MAY_FALL_BACK: dict[str, str] = {}


def _first_model_run(device, make_optimizer, steps=2):
    """A conv + batch norm + relu + linear classifier trained with log_softmax + nll_loss, then
    run in eval mode: (losses, eval output, parameters, batch norm's running statistics)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 5),
    ).to(device)
    opt = make_optimizer(model.parameters())
    x = torch.randn(8, 3, 6, 6).to(device)
    y = torch.randint(0, 5, (8,)).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.nll_loss(torch.nn.functional.log_softmax(model(x), dim=1), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        out = model(x)
    bn = model[1]
    return ([t.cpu() for t in losses], out.cpu(), [p.detach().cpu() for p in model.parameters()],
            [bn.running_mean.cpu(), bn.running_var.cpu()])


FIRST_MODEL_OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
}


@pytest.mark.parametrize("optimizer", list(FIRST_MODEL_OPTIMIZERS))
def test_a_first_model_trains_without_the_cpu_fallback(mod, optimizer):
    make = FIRST_MODEL_OPTIMIZERS[optimizer]
    mod.reset_fallback_counts()
    on_device = _first_model_run(DEVICE, make)
    mod.synchronize()
    fell_back = sorted(set(mod.fallback_counts()) - set(FIRST_MODEL_MAY_FALL_BACK))
    assert fell_back == [], f"ran on the CPU fallback (give them kernels: backendgen add-op ...): {fell_back}"
    for got, want in zip(on_device, _first_model_run("cpu", make), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
