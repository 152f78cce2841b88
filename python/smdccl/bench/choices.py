"""Names accepted on the command line.

Kept torch-free, like :mod:`~smdccl.bench.sizes`, so that the argument
parser does not depend on torch; :mod:`~smdccl.bench.collectives` maps these
names to torch dtypes and ReduceOps.
"""

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "reduce",
               "sendrecv")
#: what runs without --collectives
DEFAULT_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
DTYPES = ("float32", "float16", "bfloat16", "float64",
          "int8", "uint8", "int16", "int32", "int64")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
OPS = ("sum", "avg", "max", "min", "product")
