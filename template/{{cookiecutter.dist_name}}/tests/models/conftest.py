"""The model suite's expected failures: what PyTorch itself cannot do for any PrivateUse1 backend
(not this backend's to fix), by test name, with the reason. Each is a strict expected failure: a
torch that lifts the limitation makes the test pass, and the run says so."""

import pytest

NOT_FOR_PRIVATEUSE1: dict[str, str] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = NOT_FOR_PRIVATEUSE1.get(item.name) or NOT_FOR_PRIVATEUSE1.get(item.originalname)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
