"""A small model trains on the device exactly as on the CPU."""

import copy

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
