"""The test classes of the conformance run (scripts/torch_conformance.py).

Imported by the worker process of one world size and again by every rank
its tests spawn (multiprocessing's spawn unpickles the test class by this
module's name), so everything here happens at import: the environment
(BACKEND, WORLD_SIZE, TEMP_DIR) must already be set, as torch's
test/distributed/test_distributed_spawn.py expects it.

* ``TestSmdcclWithSpawn``: torch's ``DistributedTest._DistTestBase`` with
  ``TestDistBackend``, spawned as test_distributed_spawn.py spawns it. smdccl
  is registered in ``DistTestCases.backend_feature`` for ``plugin``, ``ddp``
  and ``subgroup`` first (as torch's out-of-tree plugin tests, e.g. UCC's, do):
  distributed_test reads those sets in its decorators, at import. Also for
  ``gpu`` (smdccl takes CUDA tensors in every collective): the object
  collectives are gated on it; its GPU tests need two GPUs and skip here.
* ``TestSmdcclFunctional``: torch.distributed._functional_collectives over an
  smdccl group (results, async / wait semantics).
* ``TestSmdcclDTensor``: DTensor on a CPU DeviceMesh over the smdccl default
  group (distribute_tensor, redistribute between Shard, Replicate and
  Partial, a small sharded matmul).

Each of the last two runs many checks in one spawn of ranks and reports every
failing check at once (spawning costs seconds here).
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND = os.environ.get("BACKEND", "smdccl")
if BACKEND == "smdccl":
    import smdccl  # noqa: F401  registers the backend (also done lazily by its entry point)

from torch.testing._internal.common_distributed import (  # noqa: E402
    DistTestCases,
    MultiProcessTestCase,
)

for _feature in ("plugin", "ddp", "subgroup", "gpu"):
    if BACKEND not in ("gloo", "nccl"):
        DistTestCases.backend_feature[_feature].add(BACKEND)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


START_METHOD = os.environ.get("SMDCCL_CONFORMANCE_START", "spawn")


class _StartMethod:
    """Starts the ranks with spawn (torch's way) or from a forkserver.

    spawn: every rank is a new interpreter importing torch, distributed_test
    and smdccl, 5-30 s per test on this 2-core machine. forkserver: every rank
    is forked from a server process that imported this module once and did
    nothing else -- no parent state, threads or groups, as with spawn -- and
    gets the parent's environment of the moment (TEMP_DIR and INIT_METHOD
    change per test) before it runs the test as spawn would.
    """

    def _spawn_processes(self) -> None:
        if START_METHOD == "spawn":
            return super()._spawn_processes()
        ctx = torch.multiprocessing.get_context("forkserver")
        parent_env = dict(os.environ)
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = ctx.Process(target=type(self)._run_with_env, name=f"process {rank}",
                                  args=(parent_env, rank, self._current_test_name(), self.file_name,
                                        child_conn))
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    def run_test(self, test_name: str, parent_pipe) -> None:
        # The driver's own check (tests/test_torch_conformance.py): a failure
        # on one rank of a named test must come out as that test's failure.
        # The test runs first, so that its own failure would still show.
        if os.environ.get("SMDCCL_CONFORMANCE_INJECT_FAILURE") == test_name and self.rank == 1:
            body = getattr(self, test_name)

            def fail():
                body()
                raise AssertionError(f"failure injected into {test_name} on rank 1, after it passed")

            setattr(self, test_name, fail)
        super().run_test(test_name, parent_pipe)

    @classmethod
    def _run_with_env(cls, env, rank, test_name, file_name, pipe) -> None:
        os.environ.clear()
        os.environ.update(env)
        # read at import by distributed_test; spawn would import it afresh
        import torch.testing._internal.distributed.distributed_test as dt

        dt.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
        cls._run(rank, test_name, file_name, pipe)


class TestSmdcclWithSpawn(_StartMethod, TestDistBackend, DistributedTest._DistTestBase):
    """test_distributed_spawn.py's TestDistBackendWithSpawn, for this backend."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


# ---------------------------------------------------------------- our own cases


class _Checks:
    """Collects every failing check of a rank; one AssertionError at the end."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.count = 0

    def run(self, desc: str, fn) -> None:
        self.count += 1
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - every failing check is reported
            tb = traceback.format_exc(limit=-3)
            self.failures.append(f"{desc}: {type(exc).__name__}: {exc}\n{tb}")

    def finish(self, minimum: int) -> None:
        if self.failures:
            raise AssertionError(f"rank {self.rank}: {len(self.failures)} of {self.count} checks failed:\n"
                                 + "\n".join(self.failures))
        # a check list that silently lost its cases must not pass
        assert self.count >= minimum, f"only {self.count} checks ran (expected >= {minimum})"


def _eq(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert torch.equal(got, want), f"{what}: got {got.flatten()[:8].tolist()}, expected {want.flatten()[:8].tolist()}"


def _close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")


def _value(rank: int, shape, salt: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Rank-specific integer values (exact sums in float32)."""
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) % 17 + 10 * rank + salt).to(dtype).reshape(shape)


class _SmdcclSpawnCase(_StartMethod, MultiProcessTestCase):
    """One spawn of WORLD_SIZE ranks per test, joined through a FileStore."""

    @property
    def world_size(self) -> int:
        return int(os.environ["WORLD_SIZE"])

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def init_pg(self) -> None:
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group(BACKEND, store=store, rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=120))


class TestSmdcclFunctional(_SmdcclSpawnCase):
    """torch.distributed._functional_collectives over an smdccl group."""

    def test_functional_collectives(self):
        import torch.distributed._functional_collectives as funcol

        self.init_pg()
        rank, ws = dist.get_rank(), dist.get_world_size()
        world = dist.group.WORLD
        chk = _Checks(rank)
        every = [_value(r, (4, 3)) for r in range(ws)]
        x = every[rank]

        def all_reduce():
            for op, want in (("sum", sum(every)), ("avg", sum(every) / ws),
                             ("max", torch.stack(every).amax(0)), ("min", torch.stack(every).amin(0))):
                inp = x.clone()
                out = funcol.all_reduce(inp, op, world)
                (_close if op == "avg" else _eq)(funcol.wait_tensor(out), want, f"all_reduce {op}")
                _eq(inp, x, f"all_reduce {op} left its input alone")

        def all_reduce_ranks_list():
            out = funcol.all_reduce(x, "sum", list(range(ws)))
            _eq(funcol.wait_tensor(out), sum(every), "all_reduce over a list of ranks")

        def all_gather_tensor():
            _eq(funcol.wait_tensor(funcol.all_gather_tensor(x, 0, world)), torch.cat(every, 0), "gather_dim 0")
            _eq(funcol.wait_tensor(funcol.all_gather_tensor(x, 1, world)), torch.cat(every, 1), "gather_dim 1")

        def reduce_scatter_tensor():
            big = torch.cat([_value(rank, (2, 3), salt=b) for b in range(ws)], 0)
            want = sum(_value(r, (2, 3), salt=rank) for r in range(ws))
            _eq(funcol.wait_tensor(funcol.reduce_scatter_tensor(big, "sum", 0, world)), want, "scatter_dim 0")
            wide = torch.cat([_value(rank, (3, 2), salt=b) for b in range(ws)], 1)
            want = sum(_value(r, (3, 2), salt=rank) for r in range(ws))
            _eq(funcol.wait_tensor(funcol.reduce_scatter_tensor(wide, "sum", 1, world)), want, "scatter_dim 1")
            _close(funcol.wait_tensor(funcol.reduce_scatter_tensor(big, "avg", 0, world)),
                sum(_value(r, (2, 3), salt=rank) for r in range(ws)) / ws, "avg")

        def all_to_all_single():
            # rank s sends rank d (d + 1) rows of value 100 s + d
            send = torch.cat([torch.full((d + 1, 2), 100.0 * rank + d) for d in range(ws)])
            out_splits = [rank + 1] * ws
            in_splits = [d + 1 for d in range(ws)]
            got = funcol.wait_tensor(funcol.all_to_all_single(send, out_splits, in_splits, world))
            want = torch.cat([torch.full((rank + 1, 2), 100.0 * s + rank) for s in range(ws)])
            _eq(got, want, "uneven splits")
            even = torch.cat([torch.full((2,), 10.0 * rank + d) for d in range(ws)])
            got = funcol.wait_tensor(funcol.all_to_all_single(even, None, None, world))
            _eq(got, torch.cat([torch.full((2,), 10.0 * s + rank) for s in range(ws)]), "no splits")

        def broadcast():
            for src in range(ws):
                got = funcol.wait_tensor(funcol.broadcast(x.clone(), src, world))
                _eq(got, every[src], f"src {src}")

        def coalesced():
            outs = funcol.all_reduce_coalesced([x, x[:1] * 2], "sum", world)
            _eq(funcol.wait_tensor(outs[0]), sum(every), "all_reduce_coalesced[0]")
            _eq(funcol.wait_tensor(outs[1]), sum(every)[:1] * 2, "all_reduce_coalesced[1]")
            outs = funcol.all_gather_into_tensor_coalesced([x, x[:2]], world)
            _eq(funcol.wait_tensor(outs[0]), torch.cat(every), "all_gather_into_tensor_coalesced[0]")
            _eq(funcol.wait_tensor(outs[1]), torch.cat([e[:2] for e in every]),
                "all_gather_into_tensor_coalesced[1]")

        def dtypes():
            for dt in (torch.float64, torch.bfloat16, torch.int32, torch.int64):
                v = [_value(r, (5,), dtype=dt) for r in range(ws)]
                _eq(funcol.wait_tensor(funcol.all_reduce(v[rank], "sum", world)), sum(v).to(dt), f"{dt} sum")
                _eq(funcol.wait_tensor(funcol.all_gather_tensor(v[rank], 0, world)), torch.cat(v), f"{dt} gather")

        for name, fn in (("all_reduce", all_reduce), ("all_reduce over ranks", all_reduce_ranks_list),
                         ("all_gather_tensor", all_gather_tensor), ("reduce_scatter_tensor", reduce_scatter_tensor),
                         ("all_to_all_single", all_to_all_single), ("broadcast", broadcast),
                         ("coalesced", coalesced), ("dtypes", dtypes)):
            chk.run(name, fn)
        chk.finish(minimum=8)
        dist.destroy_process_group()

    def test_functional_async_wait(self):
        """Results are AsyncCollectiveTensors: usable before an explicit wait,
        many in flight at once, waited in any order, and the same as the eager ops."""
        import torch.distributed._functional_collectives as funcol

        self.init_pg()
        rank, ws = dist.get_rank(), dist.get_world_size()
        world = dist.group.WORLD
        chk = _Checks(rank)
        every = [_value(r, (8,)) for r in range(ws)]

        def lazy_wait():
            out = funcol.all_reduce(every[rank], "sum", world)
            assert isinstance(out, funcol.AsyncCollectiveTensor), type(out)
            # any torch op on it waits first
            _eq(out + 0, sum(every), "an op on the unwaited result")
            assert out.trigger_wait() is not None

        def many_in_flight():
            outs = [funcol.all_reduce(every[rank] * (k + 1), "sum", world) for k in range(16)]
            gathers = [funcol.all_gather_tensor(every[rank] + k, 0, world) for k in range(8)]
            for k in reversed(range(8)):  # waited in reverse issue order
                _eq(funcol.wait_tensor(gathers[k]), torch.cat([e + k for e in every]), f"gather {k}")
            for k in range(16):
                _eq(funcol.wait_tensor(outs[k]), sum(every) * (k + 1), f"all_reduce {k}")

        def wait_twice():
            out = funcol.all_reduce(every[rank], "max", world)
            a = funcol.wait_tensor(out)
            b = funcol.wait_tensor(out)
            _eq(a, torch.stack(every).amax(0), "first wait")
            _eq(b, a, "second wait")

        def mixed_with_eager():
            out = funcol.all_reduce(every[rank], "sum", world)
            t = every[rank].clone()
            dist.all_reduce(t)  # an eager collective between issue and wait
            _eq(funcol.wait_tensor(out), sum(every), "functional")
            _eq(t, sum(every), "eager")

        def wait_tensor_op():
            out = torch.ops._c10d_functional.all_reduce(every[rank], "sum", dist.group.WORLD.group_name)
            out = torch.ops._c10d_functional.wait_tensor(out)
            _eq(out, sum(every), "_c10d_functional.all_reduce + wait_tensor")

        def autograd():
            x = every[rank].clone().requires_grad_(True)
            y = funcol.all_gather_tensor_autograd(x, 0, world)
            y = funcol.wait_tensor(y)
            (y * torch.arange(y.numel(), dtype=y.dtype)).sum().backward()
            # d/dx_rank of sum_j w_j y_j: reduce_scatter of the weights, summed over ranks
            w = torch.arange(ws * 8, dtype=torch.float32)[rank * 8:(rank + 1) * 8] * ws
            _eq(x.grad, w, "all_gather_tensor_autograd backward")

        def subgroup():
            if ws < 2:
                return
            ranks = [0, 1]
            pg = dist.new_group(ranks)
            if rank in ranks:
                out = funcol.all_reduce(every[rank], "sum", pg)
                _eq(funcol.wait_tensor(out), every[0] + every[1], "subgroup all_reduce")

        for name, fn in (("lazy wait", lazy_wait), ("many in flight", many_in_flight),
                         ("wait twice", wait_twice), ("mixed with eager", mixed_with_eager),
                         ("wait_tensor op", wait_tensor_op), ("autograd", autograd),
                         ("subgroup", subgroup)):
            chk.run(name, fn)
        chk.finish(minimum=7)
        dist.destroy_process_group()


class TestSmdcclDTensor(_SmdcclSpawnCase):
    """DTensor on a CPU DeviceMesh whose group is the smdccl default group."""

    def test_dtensor_redistribute(self):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

        self.init_pg()
        rank, ws = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (ws,))
        chk = _Checks(rank)
        full = torch.arange(ws * 6 * 5, dtype=torch.float32).reshape(ws * 6, 5)

        def mesh_uses_backend():
            assert dist.get_backend(mesh.get_group()) == BACKEND, dist.get_backend(mesh.get_group())

        def distribute():
            d = distribute_tensor(full, mesh, [Shard(0)])
            _eq(d.to_local(), full.chunk(ws, 0)[rank], "Shard(0) local")
            _eq(d.full_tensor(), full, "full_tensor")
            r = distribute_tensor(full, mesh, [Replicate()])
            _eq(r.to_local(), full, "Replicate local")

        def shard_to_replicate():
            d = distribute_tensor(full, mesh, [Shard(1)])  # 5 columns: uneven shards
            _eq(d.redistribute(mesh, [Replicate()]).to_local(), full, "Shard(1) -> Replicate")

        def replicate_to_shard():
            r = distribute_tensor(full, mesh, [Replicate()])
            _eq(r.redistribute(mesh, [Shard(0)]).to_local(), full.chunk(ws, 0)[rank], "Replicate -> Shard(0)")

        def shard_to_shard():
            d = distribute_tensor(full, mesh, [Shard(0)])
            s1 = d.redistribute(mesh, [Shard(1)])
            _eq(s1.to_local(), full.chunk(ws, 1)[rank], "Shard(0) -> Shard(1)")
            _eq(s1.full_tensor(), full, "Shard(1) full_tensor")

        def partial_to_replicate():
            local = _value(rank, (4, 3))
            p = DTensor.from_local(local, mesh, [Partial()])
            _eq(p.redistribute(mesh, [Replicate()]).to_local(), sum(_value(r, (4, 3)) for r in range(ws)),
                "Partial(sum) -> Replicate")
            p = DTensor.from_local(local, mesh, [Partial("avg")])
            _close(p.redistribute(mesh, [Replicate()]).to_local(),
                   sum(_value(r, (4, 3)) for r in range(ws)) / ws, "Partial(avg) -> Replicate")

        def partial_to_shard():
            local = _value(rank, (ws * 2, 3))
            p = DTensor.from_local(local, mesh, [Partial()])
            s = p.redistribute(mesh, [Shard(0)])
            want = sum(_value(r, (ws * 2, 3)) for r in range(ws)).chunk(ws, 0)[rank]
            _eq(s.to_local(), want, "Partial -> Shard(0)")

        def grads():
            x = distribute_tensor(full.clone(), mesh, [Shard(0)]).requires_grad_(True)
            y = x.redistribute(mesh, [Replicate()])
            # each rank's gradient is one term of a sum (Partial): the backward of
            # the all-gather reduce-scatters it
            (y.to_local(grad_placements=[Partial()]) * 2).sum().backward()
            _eq(x.grad.full_tensor(), torch.full_like(full, 2.0 * ws), "backward through redistribute")

        for name, fn in (("mesh group is the backend", mesh_uses_backend), ("distribute", distribute),
                         ("Shard -> Replicate", shard_to_replicate), ("Replicate -> Shard", replicate_to_shard),
                         ("Shard -> Shard", shard_to_shard), ("Partial -> Replicate", partial_to_replicate),
                         ("Partial -> Shard", partial_to_shard),
                         ("gradients", grads)):
            chk.run(name, fn)
        chk.finish(minimum=8)
        dist.destroy_process_group()

    def test_dtensor_matmul(self):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        self.init_pg()
        rank, ws = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cpu", (ws,))
        chk = _Checks(rank)
        g = torch.Generator().manual_seed(0)
        a = torch.randn(ws * 4, 6, generator=g, dtype=torch.float64)
        b = torch.randn(6, ws * 3, generator=g, dtype=torch.float64)
        ref = a @ b

        def row_sharded():  # Shard(0) @ Replicate: no communication until the gather
            c = distribute_tensor(a, mesh, [Shard(0)]) @ distribute_tensor(b, mesh, [Replicate()])
            _close(c.full_tensor(), ref, "Shard(0) @ Replicate")

        def inner_sharded():  # Shard(1) @ Shard(0): a Partial sum, all-reduced
            c = distribute_tensor(a, mesh, [Shard(1)]) @ distribute_tensor(b, mesh, [Shard(0)])
            _close(c.redistribute(mesh, [Replicate()]).to_local(), ref, "Shard(1) @ Shard(0)")

        def col_sharded():  # Replicate @ Shard(1)
            c = distribute_tensor(a, mesh, [Replicate()]) @ distribute_tensor(b, mesh, [Shard(1)])
            _close(c.full_tensor(), ref, "Replicate @ Shard(1)")

        def linear_backward():
            w = torch.randn(6, 5, generator=g, dtype=torch.float64)
            x = distribute_tensor(a, mesh, [Shard(0)])
            wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_(True)
            (x @ wd).sum().backward()
            want = a.t() @ torch.ones(ws * 4, 5, dtype=torch.float64)
            _close(wd.grad.full_tensor(), want, "weight gradient")

        for name, fn in (("row sharded", row_sharded), ("inner sharded", inner_sharded),
                         ("column sharded", col_sharded), ("linear backward", linear_backward)):
            chk.run(name, fn)
        chk.finish(minimum=4)
        dist.destroy_process_group()


#: every class the driver runs, in order
CLASSES = [TestSmdcclWithSpawn, TestSmdcclFunctional, TestSmdcclDTensor]
