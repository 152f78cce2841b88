"""nccl-tests-style benchmark for smdccl, gloo and nccl, all in one run.

    torchrun --nproc-per-node 2 -m smdccl.bench [options]     # see --help

Every backend is measured in the same job, on the same sizes, one after the
other, so that the numbers are comparable (same machine state, same ranks).

Modules, one job each:

- :mod:`~smdccl.bench.cli`          argparse and the order of events
- :mod:`~smdccl.bench.choices`      accepted collective, dtype and op names
- :mod:`~smdccl.bench.sizes`        "4K"/"1M" parsing, size lists, labels
- :mod:`~smdccl.bench.backends`     process groups: control group + one per backend
- :mod:`~smdccl.bench.collectives`  buffers, calls, expected results, bandwidth
- :mod:`~smdccl.bench.sweep`        correctness check and the timing loop
- :mod:`~smdccl.bench.report`       the table and the JSON file
- :mod:`~smdccl.bench.plot`         busbw-vs-size figure (matplotlib, optional)
- :mod:`~smdccl.bench.progress`     progress bar on stderr (tqdm, optional)

Separate commands (``python -m smdccl.bench.ddp`` / ``.accuracy``):

- :mod:`~smdccl.bench.ddp`          DDP training: step, compute, comm, hidden share, bytes, loss
- :mod:`~smdccl.bench.ddp_model`    its transformer and synthetic data
- :mod:`~smdccl.bench.accuracy`     fp16 averaging error: torch's hook vs smdccl's fp16 wire

Sizes and bandwidths are defined in :mod:`~smdccl.bench.collectives`, the
timing method in :mod:`~smdccl.bench.sweep`.
"""
