"""``python -m smdccl.tune``: measure the cost model's parameters on this
machine and write them to a profile that the backend reads through
``SMDCCL_TUNE_FILE``.

The backend picks its algorithms with an alpha-beta model
(csrc/algorithms/cost_model.h): every message on a level (inside a node, or
between nodes) costs ``alpha + bytes / bandwidth``, and a reduction costs
``bytes / reduce_bandwidth``. The built-in numbers describe a generic server
(shared memory, a 10 Gbit/s uplink); this tool replaces them with measured
ones.

Modules, one job each:

- :mod:`~smdccl.tune.cli`      options, then the whole run in order;
- :mod:`~smdccl.tune.layout`   process groups, the node map, the pairs to time;
- :mod:`~smdccl.tune.measure`  ping-pong message times, the reduction's speed;
- :mod:`~smdccl.tune.fit`      alpha and bandwidth from (size, time) points;
- :mod:`~smdccl.tune.profile`  the profile file (writing it, the built-in defaults);
- :mod:`~smdccl.tune.report`   the summary table and the algorithm picks.
"""
