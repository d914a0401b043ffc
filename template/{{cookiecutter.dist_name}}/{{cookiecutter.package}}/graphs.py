"""Graph capture and replay on {{ cookiecutter.device }}: the torch.cuda names of CUDA graphs, over
PyTorch's device-generic `torch.accelerator.Graph` (which csrc/runtime/graphs.cpp implements).

`torch.accelerator.Graph` is the graph itself; `graph(g)` captures into it on a side stream, as
`torch.cuda.graph` does; `graph_pool_handle()` names a memory pool several graphs share;
`is_current_stream_capturing()` tells whether work launched now is recorded. A driver without the
`graphs` capability (driver.h) makes a capture raise, naming it. `torch.compile(mode=
"reduce-overhead")` does not use these graphs: Inductor's cudagraph trees are CUDA-only in torch
(docs/porting.md, "What the graphs calls must guarantee", says where). What a hardware team
replaces: nothing here.
"""

from __future__ import annotations

import itertools
import threading

import torch

from {{ cookiecutter.package }}._utils import device_index as _index

Graph = torch.accelerator.Graph

_pool_ids = itertools.count(1)
_pool_lock = threading.Lock()
_capture_streams: dict[int, torch.Stream] = {}


def graph_pool_handle() -> tuple[int, int]:
    """A memory pool id to pass as `pool=` to several graphs, so they share one pool (the
    graphs' own pools are (n, 0); these are (0, n), as torch.cuda.graph_pool_handle's)."""
    with _pool_lock:
        return (0, next(_pool_ids))


def is_current_stream_capturing(device=None) -> bool:
    """Whether the current stream of `device` records into a graph (work launched now is
    captured, not run)."""
    return torch.accelerator.current_stream(_index(device)).is_capturing()


class graph:
    """Captures the work of the block into `g` (a torch.accelerator.Graph) on `stream` — by
    default a side stream kept for captures, as torch.cuda.graph — with the memory pool `pool`
    and the capture error mode `capture_error_mode` ("global", "thread_local" or "relaxed")."""

    def __init__(self, g: torch.accelerator.Graph, pool=None, stream: torch.Stream | None = None,
                 capture_error_mode: str = "global"):
        self.g = g
        self.pool = pool
        self.capture_error_mode = capture_error_mode
        self.stream = stream
        self._previous: torch.Stream | None = None

    def __enter__(self):
        torch.accelerator.synchronize()
        torch.accelerator.empty_cache()
        device = torch.accelerator.current_device_index()
        stream = self.stream if self.stream is not None else _capture_stream(device)
        self._previous = torch.accelerator.current_stream(stream.device_index)
        torch.accelerator.set_stream(stream)
        self.g.graph_pool = self.pool
        self.g.capture_error_mode = self.capture_error_mode
        try:
            self.g.capture_begin()
        except BaseException:
            torch.accelerator.set_stream(self._previous)
            raise
        return self.g

    def __exit__(self, *exc_info):
        try:
            self.g.capture_end()
        finally:
            torch.accelerator.set_stream(self._previous)


def _capture_stream(device: int) -> torch.Stream:
    with _pool_lock:
        if device not in _capture_streams:
            _capture_streams[device] = torch.Stream(device=torch.device("{{ cookiecutter.device }}", device))
        return _capture_streams[device]
