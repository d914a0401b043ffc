"""{{ cookiecutter.device }} tensors shared between processes with torch.multiprocessing ({{ cookiecutter.package }}/ipc.py),
with the spawn and forkserver start methods: a child writes a parent's tensor in place, a parent
keeps a child's tensor after the child exits, the sender's allocator keeps a block while a receiver
holds it, Hogwild training on shared parameters, a DataLoader whose workers return device
tensors. Each scenario runs in a process of its own (tests/distributed/ipc_workers.py), started
with the session and run beside other tests.
The scenarios start a dozen processes (seconds each with spawn), so they are in the opt-in
multi-process suite (`pytest -m distributed`, `backendgen test --distributed`); the error of a
driver without `ipc` is checked in the quick suite (tests/test_process.py).
"""

import json

import pytest

from tests.conftest import CAPABILITIES, DEVICE, fresh_process

METHODS = ["spawn", "forkserver"]
SCENARIOS = {  # each run by a process of its own
    (scenario, method): fresh_process(f"from tests.distributed.ipc_workers import main; main({scenario!r}, {method!r})")
    for scenario in ("sharing", "hogwild", "dataloader")
    for method in METHODS
}

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif("ipc" not in CAPABILITIES, reason=f"the {DEVICE} driver lacks the 'ipc' capability (driver.h)"),
]


def seen(scenario: str, method: str) -> dict:
    run = SCENARIOS[scenario, method].result()
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("method", METHODS)
def test_a_child_writes_the_parents_tensor_in_place(method):
    s = seen("sharing", method)
    # the child got the view with the fill queued before the send (the sender waits for the device)
    assert s["child"] == {"received": [7.0] * 4, "device": f"{DEVICE}:0"}
    assert s["written"] and s["child_exit"] == 0
    # and its writes are the parent's memory: the view's elements changed, the rest did not
    assert s["parent_after"] == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0]


@pytest.mark.parametrize("method", METHODS)
def test_the_parent_keeps_a_childs_tensor_after_the_child_exits(method):
    s = seen("sharing", method)
    assert s["maker_exit"] == 0
    assert s["kept"] == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert s["kept_device"] == f"{DEVICE}:0"
    assert s["kept_plus_one"] == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]


@pytest.mark.parametrize("method", METHODS)
def test_the_sender_keeps_a_block_a_receiver_holds_then_frees_it(method):
    s = seen("sharing", method)
    # the sender dropped its tensor and allocated four of the same size: none took the held block
    assert s["held_intact"] is True
    assert s["allocated_while_held"] == (1 << 18) * 4
    # once the receiver let go, ipc_collect gives it back to the allocator
    assert s["released"] == "released"
    assert s["still_held"] == 0
    assert s["allocated_after"] == 0
    assert s["holder_exit"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_hogwild_training_updates_the_shared_parameters(method):
    s = seen("hogwild", method)
    assert s["finished"] == [0, 1] and s["exits"] == [0, 0]
    assert s["device"] == f"{DEVICE}:0"
    # the parent never trained: its parameters changed because the children's steps wrote them
    assert s["weight_changed"]
    assert s["loss_after"] < 0.5 * s["loss_before"]


@pytest.mark.parametrize("method", METHODS)
def test_dataloader_workers_return_device_tensors(method):
    s = seen("dataloader", method)
    assert s["devices"] == [f"{DEVICE}:0"]
    assert s["values"] == [[[float(i * i)] * 3 for i in (b, b + 1)] for b in (0, 2, 4)]
