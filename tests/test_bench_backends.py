"""The benchmark's NCCL path where NCCL cannot run: on CPU tensors, without a
GPU, and with more ranks than GPUs on a machine (NCCL refuses two ranks on one
GPU; smdccl and gloo do not); and ``--nccl-ranks-as-hosts`` (every rank its
own NCCL_HOSTID): the env each rank gets, the refusal without CUDA tensors,
the report's line. Runs without a GPU: the rules are pure. And the
``smdccl[SMDCCL_NAME=value]`` backends of ``--env-variants``: the names,
and a run where the variable reaches the group (a bad value fails it)."""

import json
import os
import subprocess
import sys

import pytest

from smdccl.bench.backends import (default_backends, family, nccl_unavailable, ranks_as_hosts_env,
                                   split_env, with_env_variants)


def test_nccl_needs_cuda_tensors():
    assert "use --device cuda" in nccl_unavailable("cpu", 2, 8)


def test_nccl_needs_a_gpu():
    assert "sees none" in nccl_unavailable("cuda", 1, 0)


def test_nccl_needs_a_gpu_per_rank():
    msg = nccl_unavailable("cuda", 4, 1)
    assert "4 ranks share 1 GPU(s)" in msg and "one GPU per rank" in msg


def test_nccl_runs_with_a_gpu_per_rank():
    assert nccl_unavailable("cuda", 2, 2) is None
    assert nccl_unavailable("cuda", 8, 8) is None


def test_default_backends_never_offer_nccl_on_cpu():
    assert default_backends("cpu", 2) == ["smdccl", "gloo"]


# --nccl-ranks-as-hosts: NCCL on one GPU shared by every rank, each rank a host


def test_ranks_as_hosts_lets_ranks_share_a_gpu_but_still_needs_one():
    assert nccl_unavailable("cuda", 4, 1, ranks_as_hosts=True) is None
    assert "sees none" in nccl_unavailable("cuda", 4, 0, ranks_as_hosts=True)
    assert "use --device cuda" in nccl_unavailable("cpu", 4, 1, ranks_as_hosts=True)
    assert "--nccl-ranks-as-hosts" in nccl_unavailable("cuda", 4, 1)  # the refusal names the way out


def test_ranks_as_hosts_offers_nccl_wherever_there_is_a_gpu():
    import torch

    assert ("nccl" in default_backends("cuda", 4, ranks_as_hosts=True)) == (torch.cuda.device_count() >= 1)
    assert "nccl" not in default_backends("cpu", 4, ranks_as_hosts=True)


def test_ranks_as_hosts_env_gives_every_rank_its_own_host():
    envs = [ranks_as_hosts_env(r, 4, 4, {}) for r in range(4)]
    assert len({e["NCCL_HOSTID"] for e in envs}) == 4
    assert all(e["NCCL_SOCKET_IFNAME"] == "lo" for e in envs)  # all ranks local: loopback
    assert all(e["NCCL_IB_DISABLE"] == "1" and e["NCCL_NET"] == "Socket" for e in envs)  # nothing around it
    assert all(e["SMDCCL_TOPOLOGY"] == "1,1,1,1" for e in envs)  # smdccl: every rank a node too


def test_ranks_as_hosts_env_keeps_what_the_user_set():
    env = ranks_as_hosts_env(1, 4, 4, {"NCCL_SOCKET_IFNAME": "veth0", "SMDCCL_TOPOLOGY": "2x2",
                                       "NCCL_IB_DISABLE": "0", "NCCL_NET": "IB"})
    assert env == {"NCCL_HOSTID": "smdccl-bench-rank1"}
    # ranks on several machines (the emulated cluster's namespaces): the
    # interface is the user's (or NCCL's) choice, the transport still sockets
    several = ranks_as_hosts_env(0, 8, 4, {})
    assert "NCCL_SOCKET_IFNAME" not in several
    assert several["NCCL_IB_DISABLE"] == "1" and several["NCCL_NET"] == "Socket"


def test_ranks_as_hosts_needs_cuda_tensors(capsys):
    from smdccl.bench.cli import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args(["--nccl-ranks-as-hosts"])
    assert exc.value.code == 2
    assert "--nccl-ranks-as-hosts needs --device cuda" in capsys.readouterr().err
    assert parse_args(["--nccl-ranks-as-hosts", "--device", "cuda"]).nccl_ranks_as_hosts


def test_report_says_ranks_were_hosts():
    from smdccl.bench import report

    info = {"command_line": "torchrun ...", "hostname": "h", "cpu_count": 2, "torch_version": "t",
            "world_size": 4, "device": "cuda", "warmup": 5, "iters": "auto", "passes": 3,
            "nccl_ranks_as_hosts": True,
            "ranks_as_hosts_env": {"NCCL_SOCKET_IFNAME": "lo", "SMDCCL_TOPOLOGY": "1,1,1,1"}}
    text = report.preamble(info)
    assert "# --nccl-ranks-as-hosts: every rank is a host of its own to NCCL" in text
    assert "NCCL_SOCKET_IFNAME=lo" in text and "SMDCCL_TOPOLOGY=1,1,1,1" in text
    assert "ranks-as-hosts" not in report.preamble(dict(info, nccl_ranks_as_hosts=False))


def test_close_groups_destroys_each_in_order():
    from smdccl.bench.backends import close_groups
    seen = []
    assert close_groups({"nccl": 1, "smdccl": 2}, seen.append, limit_s=5) == []
    assert seen == [1, 2]


def test_close_groups_gives_up_on_a_teardown_that_hangs():
    import threading
    import time

    from smdccl.bench.backends import close_groups
    release, seen = threading.Event(), []

    def destroy(group):
        seen.append(group)
        if group == "hangs":
            release.wait(30)

    t0 = time.monotonic()
    left = close_groups({"a": "ok", "b": "hangs", "c": "ok2"}, destroy, limit_s=0.5)
    assert left == ["b", "c"] and seen == ["ok", "hangs"], (left, seen)
    assert time.monotonic() - t0 < 5
    release.set()


# --env-variants: one smdccl group per value of a variable, measured in one run


def test_env_variants_multiply_smdccl_backends_only():
    names = with_env_variants(["smdccl", "smdccl+fp16@ring", "gloo"], "SMDCCL_SHM_COPY=plain,auto")
    assert names == ["smdccl[SMDCCL_SHM_COPY=plain]", "smdccl[SMDCCL_SHM_COPY=auto]",
                     "smdccl+fp16@ring[SMDCCL_SHM_COPY=plain]", "smdccl+fp16@ring[SMDCCL_SHM_COPY=auto]",
                     "gloo"]
    assert with_env_variants(["smdccl"], None) == ["smdccl"]


def test_family_is_the_backend_a_name_opens():
    # node_sizes() finds the smdccl groups by it, variants of a variable too.
    for name in ("smdccl", "smdccl+fp16", "smdccl@ring", "smdccl+int8@tree[SMDCCL_SHM_COPY=plain]",
                 "smdccl[SMDCCL_SHM_COPY=auto]"):
        assert family(name) == "smdccl", name
    assert family("gloo") == "gloo" and family("nccl") == "nccl"


def test_split_env_reads_one_smdccl_variable():
    assert split_env("smdccl+fp16@ring[SMDCCL_SHM_COPY=plain]") == (
        "smdccl+fp16@ring", {"SMDCCL_SHM_COPY": "plain"}, None)
    assert split_env("gloo") == ("gloo", {}, None)
    for bad in ("smdccl[SHM_COPY=plain]", "smdccl[SMDCCL_SHM_COPY]", "smdccl[SMDCCL_SHM_COPY=]"):
        assert "<backend>[SMDCCL_NAME=value]" in split_env(bad)[2], bad
    assert "only smdccl" in split_env("gloo[SMDCCL_SHM_COPY=plain]")[2]


@pytest.mark.multiprocess
def test_bench_env_variants_run(tmp_path):
    """2 ranks: a line per value, all correct; a value the variable does not
    take fails the run naming the variable (so it was set for the group)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
            "smdccl.bench", "--backends", "smdccl", "--env-variants", "SMDCCL_SHM_COPY=plain,streamed",
            "--collectives", "allreduce,reduce_scatter", "--sizes", "4K,300K", "--passes", "1",
            "--target-time", "0.02", "--warmup", "1", "--json", "out.json", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "SMDCCL_SHM_COPY"}
    out = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "#wrong total: 0  OK" in out.stdout, out.stdout[-3000:]
    rows = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert {r["backend"] for r in rows} == {"smdccl[SMDCCL_SHM_COPY=plain]",
                                            "smdccl[SMDCCL_SHM_COPY=streamed]"}
    assert len(rows) == 8, rows

    argv[argv.index("SMDCCL_SHM_COPY=plain,streamed")] = "SMDCCL_SHM_COPY=plain,sideways"
    bad = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0
    assert "SMDCCL_SHM_COPY" in bad.stdout + bad.stderr and "sideways" in bad.stdout + bad.stderr, (
        bad.stdout + bad.stderr)[-3000:]


def test_gloo_is_not_asked_for_send_recv_of_cuda_tensors():
    import torch

    from smdccl.bench.sweep import unsupported

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert "gloo has no send/recv of CUDA tensors" in unsupported("gloo", "sendrecv", cuda)
    assert unsupported("gloo", "sendrecv", cpu) is None
    assert unsupported("gloo", "allreduce", cuda) is None
    assert unsupported("smdccl", "sendrecv", cuda) is None
