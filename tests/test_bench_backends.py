"""The benchmark's NCCL path where NCCL cannot run: on CPU tensors, without a
GPU, and with more ranks than GPUs on a machine (NCCL refuses two ranks on one
GPU; smdccl and gloo do not). Runs without a GPU: the rules are pure."""

from smdccl.bench.backends import default_backends, nccl_unavailable


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
