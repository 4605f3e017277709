"""PyTorch's own distributed test suite against the "neuron" backend.

Runs ``torch.testing._internal.distributed.distributed_test`` (shipped in the
torch wheel) the way PyTorch's test/distributed/test_distributed_spawn.py does
for Gloo: one TestCase class deriving from ``TestDistBackend`` and
``DistributedTest._DistTestBase``; every test starts WORLD_SIZE fresh
processes, which run ``dist.init_process_group(BACKEND,
init_method="file://...")`` and the test. ``TestDistBackend.setUp`` makes a
fresh TEMP_DIR (barrier files, init file) for each test.

START_METHOD picks how the ranks start: "fork" (the default) forks this
process as DataLoader forks its workers: it has imported torch, the
backend's package (torchneuron for neuron) and distributed_test and run no
op or process group, so a test costs its own work (the suite about half a
minute); "spawn" is what test_distributed_spawn.py does, each rank a new
interpreter that re-imports this file (``import torchneuron`` registers
the backend in every rank): about 4 s of imports per rank per test, all
285 tests including those that skip inside the ranks (the suite 12-21
minutes).

Run from the repository root (2 ranks on CPU; unittest arguments after the
script, e.g. ``-k test_all_reduce``, ``-v``)::

    BACKEND=neuron WORLD_SIZE=2 [START_METHOD=spawn] PYTHONPATH=build/python \\
        .venv/bin/python tests/python/conformance/torch_suite.py [-k PATTERN]

BACKEND=gloo runs the same suite against Gloo, for comparison.

Two harness changes leave what the tests check alone and save half the
suite's time, which was waiting: the runner waits on its ranks' exits
instead of looking every 0.1 s (MultiProcessTestCase._join_processes), and
the ranks' file barrier (distributed_test.Barrier.sync) looks every 5 ms
instead of every 0.1 s.

How tests gated on the backend's name run for neuron:

* ``DistTestCases.backend_feature`` sets: neuron joins every set gloo is in,
  and "plugin" (which require_backend_is_available reads as "available"),
  before distributed_test is imported, whose decorators read the sets when
  the class is defined. Sets "gpu" and "cuda" mostly gate tests that run on
  CPU for gloo; the tests that need GPUs skip anyway (skip_if_lt_x_gpu,
  skip_if_no_gpu: no CUDA here).
* ``DistTestCases.skip_collective`` sets: neuron is in none, so all run.
* The literal name "gloo" (``BACKEND != "gloo"``,
  ``require_backend_is_available({"gloo"})``, "mpi, nccl and gloo"):
  RUN_DESPITE_GLOO_GATE lists the tests whose body checks a capability any
  backend may have (coalesced all_reduce, Work.get_future, batched p2p,
  timeouts, monitored_barrier at 2 ranks, ...); they run, with their other
  decorators intact. The rest stay skipped: the CUDA tests, the
  monitored_barrier tests of 3 ranks or more (they expect Gloo's protocol,
  where only rank 0 collects and the others report its failure), and
  test_accumulate_gradients_no_sync* (their body builds its model only when
  BACKEND is mpi, gloo or nccl).
* PROFILING_SUPPORTED_BACKENDS and the like are left alone: tests check
  profiler events named "gloo:all_reduce" only for the backends listed.

EXPECTED_FAILURES marks known neuron failures (test name -> reason) as
unittest expected failures; a test in it that passes shows as an unexpected
success.
"""
import functools
import multiprocessing.connection
import os
import time
import unittest

import torch

# torch's common_utils reads a non-empty CI as "PyTorch's own CI": run_tests
# then writes JUnit XML through the xmlrunner module, which the project does
# not install. The suite runs the same in and out of CI.
os.environ.pop("CI", None)
os.environ.setdefault("BACKEND", "neuron")
os.environ.setdefault("WORLD_SIZE", "2")
BACKEND = os.environ["BACKEND"]
START_METHOD = os.environ.get("START_METHOD", "fork")
if START_METHOD not in ("fork", "spawn"):
    raise SystemExit(f"torch_suite.py: START_METHOD={START_METHOD!r}; use fork or spawn")

if BACKEND == "neuron":
    import torchneuron  # noqa: F401,E402  registers backend "neuron"

from torch.testing._internal.common_distributed import DistTestCases, get_timeout  # noqa: E402

if BACKEND == "neuron":
    # Before distributed_test is imported: its decorators read these sets
    # when the test class is defined.
    for feature in ("gpu", "cuda", "ddp", "subgroup"):
        if "gloo" in DistTestCases.backend_feature[feature]:
            DistTestCases.backend_feature[feature].add(BACKEND)
    DistTestCases.backend_feature["plugin"].add(BACKEND)  # "is available"

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# Known failures for BACKEND=neuron: {test name: reason}.
EXPECTED_FAILURES = {
    "test_ddp_logging_data_cpu": "DDP logs the backend of a plugin's process group as "
                                 "'custom' (c10d's BackendType), the test expects 'neuron'",
}

# Gated on the name "gloo" but testing a capability: {test name: the gate's
# skip reason, checked so that a changed gate is noticed}.
_NOT_GLOO = f"Test requires backend {BACKEND} to be one of {{'gloo'}}"
_GET_FUTURE = "get_future is only supported on mpi, nccl and gloo"
RUN_DESPITE_GLOO_GATE = {
    **{f"test_all_reduce_coalesced_{group}{op}": _NOT_GLOO
       for group in ("", "group_", "full_group_")
       for op in ("sum", "product", "min", "max")},
    "test_grads_same_across_ranks_with_no_sync": _NOT_GLOO,
    "test_scatter_object_list": _NOT_GLOO,
    "test_get_future": _GET_FUTURE,
    "test_batch_isend_irecv_gloo": "GLOO Batch Send Recv CPU",
    "test_batch_isend_irecv_gloo_tags": "GLOO Batch Send Recv CPU",
    "test_barrier_timeout_full_group": "Only gloo backend supports timeouts",
    "test_barrier_timeout_group": "Only gloo backend supports timeouts",
    "test_sparse_all_reduce_sum": "Only Gloo backend supports sparse all reduce",
    "test_monitored_barrier_gloo": _NOT_GLOO,
    "test_monitored_barrier_gloo_subgroup": _NOT_GLOO,
    "test_monitored_barrier_gloo_rank_0_timeout": _NOT_GLOO,
}


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START_METHOD == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    def _join_processes(self, fn):
        """Waits on the ranks' exits, then lets MultiProcessTestCase judge
        them: its own loop looks every 0.1 s, a tenth of a second per test
        on top of the test's work (285 tests)."""
        pending = list(self.processes)
        deadline = time.monotonic() + get_timeout(self.id())
        while pending and time.monotonic() < deadline:
            multiprocessing.connection.wait([p.sentinel for p in pending],
                                            deadline - time.monotonic())
            pending = [p for p in pending if p.exitcode is None]
            if any(p.exitcode == self.TEST_ERROR_EXIT_CODE for p in self.processes):
                break  # the others are its to end
        super()._join_processes(fn)


def _prompt_barrier(cls, wait_for=None, timeout=10):
    """distributed_test's file barrier, Barrier.sync, looking every 5 ms
    rather than every 100 ms (the tests' ranks meet at about 80 of them):
    this rank writes the barrier's number to TEMP_DIR/barrier/PID under the
    suite's file lock, then waits until `wait_for` ranks (the world's, by
    default) have written it or a later one; RuntimeError("barrier
    timeout") after `timeout` s. A harness change: what the tests check is
    untouched."""
    import torch.distributed as dist
    wait_for = dist.get_world_size() if wait_for is None else wait_for
    cls.barrier_id += 1
    directory = os.path.join(os.environ["TEMP_DIR"], "barrier")
    with distributed_test._lock():
        with open(os.path.join(directory, str(os.getpid())), "w") as f:
            f.write(str(cls.barrier_id))
    deadline = time.monotonic() + timeout
    while True:
        with distributed_test._lock():
            arrived = 0
            for name in os.listdir(directory):
                with open(os.path.join(directory, name)) as f:
                    arrived += int(f.read()) >= cls.barrier_id
        if arrived == wait_for:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("barrier timeout")
        time.sleep(0.005)


distributed_test.Barrier.sync = classmethod(_prompt_barrier)


def _rewrap(test, expect_failure=False):
    """Ungated: the test without its class-time skip (a flag on the function;
    the decorators that skip in the ranks stay). Else an expected failure."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return test(*args, **kwargs)
    if not expect_failure:
        wrapper.__unittest_skip__ = False
        return wrapper
    return unittest.expectedFailure(wrapper)


if BACKEND == "neuron":
    for _name, _reason in RUN_DESPITE_GLOO_GATE.items():
        _test = getattr(TestDistBackendWithSpawn, _name)
        if getattr(_test, "__unittest_skip_why__", None) != _reason:
            raise RuntimeError(f"{_name}: expected the gate {_reason!r}, found "
                               f"{getattr(_test, '__unittest_skip_why__', None)!r}")
        setattr(TestDistBackendWithSpawn, _name, _rewrap(_test))
    for _name in EXPECTED_FAILURES:
        setattr(TestDistBackendWithSpawn, _name,
                _rewrap(getattr(TestDistBackendWithSpawn, _name), expect_failure=True))

# Named like test_distributed_spawn.py's class, without its INIT_METHOD suffix:
# setUp sets INIT_METHOD for the ranks, which must find the class by this name.
TestDistBackendWithSpawn.__name__ = f"TestDistBackendWithSpawn{BACKEND.upper()}"
TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
del TestDistBackendWithSpawn  # one name, so unittest runs the class once

if __name__ == "__main__":
    run_tests()
