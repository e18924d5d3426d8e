"""Jobs of several processes: the job launcher and data-parallel helpers.

:mod:`gluon_dynbatch.distributed.launch` starts and watches the processes of
a job on MXNet's parameter server (``python -m
gluon_dynbatch.distributed.launch``).

Nothing here is part of the batching pipeline: the engine never imports
this package, and a worker batches its samples like any other process.
"""
