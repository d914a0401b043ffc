"""The {{ cookiecutter.device }} collective backend for torch.distributed: THE seam a team's collective library plugs into.

Importing the package registers it (`register()` below) as the c10d backend "{{ cookiecutter.device }}ccl" for
{{ cookiecutter.device }} tensors, so `dist.init_process_group()` with no backend named uses it, as it uses NCCL
for CUDA tensors; `backend="{{ cookiecutter.device }}ccl"` names it, and DDP, FSDP and every `torch.distributed`
collective then run on {{ cookiecutter.device }} tensors. CPU tensors in the same process group go to gloo.

How it is built: `DeviceProcessGroup` receives every collective of a process group — device
tensors, options, a `Work` to return — and hands each one, as one call, to `Transport`. The
transport launches the collective and returns a handle; `Work.wait()` waits for the handle, then
makes the caller's current device stream wait for the communication stream (an event recorded on
one, waited on by the other), as NCCL's work does for CUDA streams.

The emulated transport here is real multi-process communication over an existing library:
gloo (TCP; loopback on one machine) on CPU tensors that *alias* the device tensors' memory — the
emulated device's memory is host memory, so gloo reads and writes device memory in place
(`torch.ops.{{ cookiecutter.package }}.host_view`, csrc/distributed/host_memory.cpp). Only tensors gloo cannot
take as they are (non-contiguous ones) are staged through a contiguous device copy.

What a hardware team replaces: the class `Transport` — one method per collective; call your
collective library there (on device pointers, enqueued on `comm_stream(device)`) and return its
handle, then drop `host_memory.cpp` and the `ready.synchronize()` in `_launch_after_current_stream`.
`DeviceProcessGroup`, the `Work`, the stream ordering and the registration stay.
"""

from __future__ import annotations

import datetime
import threading

import torch

DEVICE = "{{ cookiecutter.device }}"
BACKEND = "{{ cookiecutter.device }}ccl"  # the c10d backend's name: init_process_group(backend="{{ cookiecutter.device }}ccl")


def is_available() -> bool:
    return torch.distributed.is_available()


if is_available():
    import torch.distributed as dist

    _Base = dist.ProcessGroup
    _WorkBase = dist.Work
else:  # a torch built without distributed: nothing to register, nothing below is used
    dist = None
    _Base = _WorkBase = object


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type == DEVICE


class Transport:
    """The collectives of one process group on {{ cookiecutter.device }} tensors — replace this class's bodies.

    Every method takes device tensors (all on this rank's device, contiguous), launches the
    collective and returns a handle shaped like `torch.distributed.Work` (`wait`, `is_completed`,
    `is_success`, `exception`, `get_future`); none waits for completion itself. `opts` are
    `torch.distributed` option objects (reduce op, root rank, timeout). ReduceOp.AVG never reaches
    it: it gets SUM, and the process group divides. The emulation hands gloo host views of the
    tensors (zero-copy) and returns gloo's own work.
    """

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        # A gloo group of its own, beside the one serving CPU tensors, so device and CPU
        # collectives never share a sequence of messages.
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("transport", store), rank, size, timeout)

    @staticmethod
    def host(tensors):
        return [torch.ops.{{ cookiecutter.package }}.host_view(t) for t in tensors]

    def allreduce(self, tensors, opts):
        return self.gloo.allreduce(self.host(tensors), opts)

    def broadcast(self, tensors, opts):
        return self.gloo.broadcast(self.host(tensors), opts)

    def reduce(self, tensors, opts):
        return self.gloo.reduce(self.host(tensors), opts)

    def allgather(self, output_lists, inputs, opts):
        return self.gloo.allgather([self.host(o) for o in output_lists], self.host(inputs), opts)

    def allgather_into_tensor(self, output, input, opts):
        return self.gloo._allgather_base(self.host([output])[0], self.host([input])[0], opts)

    def reduce_scatter(self, outputs, input_lists, opts):
        return self.gloo.reduce_scatter(self.host(outputs), [self.host(i) for i in input_lists], opts)

    def reduce_scatter_tensor(self, output, input, opts):
        return self.gloo._reduce_scatter_base(self.host([output])[0], self.host([input])[0], opts)

    def all_to_all(self, outputs, inputs, opts):
        # gloo's alltoall takes equal sizes only: send the pieces as one flat buffer with splits
        # (uneven sizes allowed) and copy the received pieces out when it completes.
        send = torch.cat([t.reshape(-1) for t in inputs])
        recv = torch.empty(sum(t.numel() for t in outputs), dtype=send.dtype, device=send.device)
        handle = self.all_to_all_single(recv, send, [t.numel() for t in outputs], [t.numel() for t in inputs], opts)

        def unpack():
            for out, piece in zip(outputs, recv.split([t.numel() for t in outputs])):
                out.copy_(piece.view(out.shape))

        return _Then(handle, unpack)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        return self.gloo.alltoall_base(self.host([output])[0], self.host([input])[0], output_splits, input_splits, opts)

    def gather(self, output_lists, inputs, opts):
        return self.gloo.gather([self.host(o) for o in output_lists], self.host(inputs), opts)

    def scatter(self, outputs, input_lists, opts):
        return self.gloo.scatter(self.host(outputs), [self.host(i) for i in input_lists], opts)

    def send(self, tensors, dst: int, tag: int):
        return self.gloo.send(self.host(tensors), dst, tag)

    def recv(self, tensors, src: int, tag: int):
        return self.gloo.recv(self.host(tensors), src, tag)

    def barrier(self, opts):
        return self.gloo.barrier(opts)


class _Then:
    """A transport handle that runs `after` once the collective completed (and before anyone sees it)."""

    def __init__(self, handle, after):
        self._handle, self._after, self._done = handle, after, False
        self._lock = threading.Lock()

    def _run_after(self):
        with self._lock:
            if not self._done:
                self._after()
                self._done = True

    def wait(self, timeout=None):
        self._handle.wait() if timeout is None else self._handle.wait(timeout)
        self._run_after()
        return True

    def is_completed(self):
        return self._handle.is_completed()

    def is_success(self):
        return self._handle.is_success()

    def exception(self):
        return self._handle.exception()

    def get_future(self):
        def done(fut):
            value = fut.value()
            self._run_after()
            return value

        return self._handle.get_future().then(done)


class Work(_WorkBase):
    """A collective in flight. `wait()` returns once it finished and orders the caller's current
    device stream after it; `get_future()` completes with the result tensors (DDP uses it)."""

    def __init__(self, handle, device, result, finish=None):
        super().__init__()
        self._handle = handle
        self._device = device  # a torch.device of type {{ cookiecutter.device }}, or None for CPU-only work
        self._result = result  # what the future completes with
        self._finish = finish  # runs once after completion: copies out of staging buffers, AVG's division
        self._lock = threading.Lock()
        self._finished = False

    def _complete(self):
        with self._lock:
            if self._finished:
                return
            if self._finish is not None:
                self._finish()
            self._finished = True

    def wait(self, timeout=None):
        if timeout is None or timeout == datetime.timedelta(0):
            self._handle.wait()
        else:
            self._handle.wait(timeout)
        self._complete()
        if self._device is not None:
            # The collective ran on the communication stream; the caller's stream may not use
            # the result before it is done there.
            done = torch.Event(device=self._device)
            done.record(comm_stream(self._device))
            torch.accelerator.current_stream(self._device).wait_event(done)
        return True

    def is_completed(self):
        # after wait() returned it is, whatever the handle says (gloo's reduce_scatter never says so)
        return self._finished or self._handle.is_completed()

    def is_success(self):
        return self._handle.is_success()

    def exception(self):
        return self._handle.exception()

    def result(self):
        return self._result

    def synchronize(self):
        self.wait()

    def get_future(self):
        def done(fut):
            fut.value()  # raises the collective's error, if any
            self._complete()
            return self._result

        return self._handle.get_future().then(done)


_comm_streams: dict = {}


def comm_stream(device: torch.device) -> torch.Stream:
    """The stream collectives on `device` run on (one per device and process)."""
    if device not in _comm_streams:
        _comm_streams[device] = torch.Stream(device=device)
    return _comm_streams[device]


def _launch_after_current_stream(device: torch.device) -> None:
    """The collective may start only after the work queued on the caller's stream that produces
    its inputs: the communication stream waits for an event recorded there."""
    ready = torch.Event(device=device)
    ready.record(torch.accelerator.current_stream(device))
    comm_stream(device).wait_event(ready)
    # The emulated transport runs on host threads, outside any stream: wait for the inputs here.
    # A transport that enqueues on comm_stream drops this line.
    ready.synchronize()


class DeviceProcessGroup(_Base):
    """A process group whose collectives on {{ cookiecutter.device }} tensors go through `Transport`, and on CPU tensors through gloo."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._cpu = dist.ProcessGroupGloo(dist.PrefixStore("cpu", store), rank, size, timeout)
        self._transport = Transport(store, rank, size, timeout)
        self._group_name = self._group_desc = ""

    def getBackendName(self):
        return BACKEND

    # A c10d ProcessGroup keeps its name and description in its C++ backends; this one has none.
    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    # -- routing -------------------------------------------------------------------------------

    def _run(self, tensors, op_name, args, outputs, opts=None):
        """Run collective `op_name` on `tensors` (every tensor argument, outputs included): through
        gloo if they are CPU tensors, else through the transport with the tensors as the
        transport takes them. `args` builds the call's arguments from the (staged) tensors."""
        flat = [t for t in tensors if t is not None]
        devices = {t.device for t in flat}
        if not flat or devices == {torch.device("cpu")}:
            return Work(getattr(self._cpu, _GLOO_NAMES.get(op_name, op_name))(*args(lambda t: t)), None, outputs)
        if len(devices) != 1 or not all(_on_device(t) for t in flat):
            raise ValueError(f"{BACKEND} {op_name}: every tensor must be on one {DEVICE} device, got {sorted(map(str, devices))}")
        device = flat[0].device
        # Staging: the transport takes contiguous tensors. A non-contiguous one is swapped for a
        # contiguous copy, copied back into the caller's tensor when the collective completes.
        staged, copy_back = {}, []

        def stage(t):
            if t is None or t.is_contiguous():
                return t
            if id(t) not in staged:
                staged[id(t)] = t.contiguous()
                copy_back.append((t, staged[id(t)]))
            return staged[id(t)]

        call_args = args(stage)
        avg = opts is not None and getattr(opts, "reduceOp", None) == dist.ReduceOp.AVG
        if avg:  # the transport sums; the average divides afterwards
            call_args = tuple(_with_sum(a) if a is opts else a for a in call_args)
        with torch.accelerator.device_index(device.index):
            _launch_after_current_stream(device)
            handle = getattr(self._transport, op_name)(*call_args)

        def finish():
            if avg:
                for t in _reduced_outputs(op_name, call_args, self.rank(), opts):
                    t.div_(self.size())
            for original, copy in copy_back:
                original.copy_(copy)

        return Work(handle, device, outputs, finish if (avg or copy_back) else None)

    # -- the c10d ProcessGroup interface (called by torch.distributed and by DDP's C++) -------

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._run(tensors, "allreduce", lambda s: ([s(t) for t in tensors], opts), tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        out = dist.AllreduceOptions()
        if opts is not None:
            out.reduceOp = opts.reduceOp
        return self.allreduce(tensors, out)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._run(tensors, "broadcast", lambda s: ([s(t) for t in tensors], opts), tensors)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._run(tensors, "reduce", lambda s: ([s(t) for t in tensors], opts), tensors, opts)

    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        every = [t for o in output_lists for t in o] + list(inputs)
        return self._run(
            every, "allgather", lambda s: ([[s(t) for t in o] for o in output_lists], [s(t) for t in inputs], opts),
            output_lists,
        )

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._run([output, input], "allgather_into_tensor", lambda s: (s(output), s(input), opts), [output])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _AllWork(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        every = list(outputs) + [t for i in input_lists for t in i]
        return self._run(
            every, "reduce_scatter", lambda s: ([s(t) for t in outputs], [[s(t) for t in i] for i in input_lists], opts),
            outputs, opts,
        )

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._run([output, input], "reduce_scatter_tensor", lambda s: (s(output), s(input), opts), [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _AllWork(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._run(
            list(outputs) + list(inputs), "all_to_all", lambda s: ([s(t) for t in outputs], [s(t) for t in inputs], opts),
            outputs,
        )

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._run(
            [output, input], "all_to_all_single",
            lambda s: (s(output), s(input), list(output_splits), list(input_splits), opts), [output],
        )

    alltoall_base = all_to_all_single

    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        every = [t for o in output_lists for t in o] + list(inputs)
        return self._run(
            every, "gather", lambda s: ([[s(t) for t in o] for o in output_lists], [s(t) for t in inputs], opts),
            output_lists,
        )

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        every = list(outputs) + [t for i in input_lists for t in i]
        return self._run(
            every, "scatter", lambda s: ([s(t) for t in outputs], [[s(t) for t in i] for i in input_lists], opts),
            outputs,
        )

    def send(self, tensors, dst, tag=0):
        return self._run(tensors, "send", lambda s: ([s(t) for t in tensors], dst, tag), tensors)

    def recv(self, tensors, src, tag=0):
        return self._run(tensors, "recv", lambda s: ([s(t) for t in tensors], src, tag), tensors)

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        device = torch.device(DEVICE, torch.accelerator.current_device_index())
        with torch.accelerator.device_index(device.index):
            _launch_after_current_stream(device)
            return Work(self._transport.barrier(opts), device, [])


# gloo's names for the transport's operations, for CPU tensors
_GLOO_NAMES = {
    "allgather_into_tensor": "_allgather_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "all_to_all": "alltoall",
    "all_to_all_single": "alltoall_base",
}


def _with_sum(opts):
    copy = type(opts)()
    for name in ("rootRank", "rootTensor", "timeout"):
        if hasattr(opts, name):
            setattr(copy, name, getattr(opts, name))
    copy.reduceOp = dist.ReduceOp.SUM
    return copy


def _reduced_outputs(op_name, call_args, rank, opts):
    """The tensors that hold a reduction's result on this rank (for ReduceOp.AVG's division)."""
    if op_name == "allreduce":
        return call_args[0]
    if op_name == "reduce":
        return call_args[0] if rank == opts.rootRank else []
    if op_name == "reduce_scatter":
        return call_args[0]
    if op_name == "reduce_scatter_tensor":
        return [call_args[0]]
    return []


class _AllWork(_WorkBase):
    """Several collectives as one Work (the coalesced calls)."""

    def __init__(self, works, result):
        super().__init__()
        self._works, self._result = works, result

    def wait(self, timeout=None):
        for w in self._works:
            w.wait()
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def result(self):
        return self._result

    def get_future(self):
        futures = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futures).then(lambda _: self._result)


def _create(opts, backend_options=None):
    return DeviceProcessGroup(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def register() -> None:
    """Make "{{ cookiecutter.device }}ccl" the c10d backend of {{ cookiecutter.device }} tensors (called when the package loads)."""
    if not is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[DEVICE])
