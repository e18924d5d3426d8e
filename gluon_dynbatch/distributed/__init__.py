"""Jobs of several processes: the job launcher and data-parallel helpers.

Enters: a training script, the numbers of workers and servers, a run
directory for checkpoints.
Leaves: the processes of one MXNet ``dist_sync`` job, watched together and
restarted from the last complete checkpoint when one dies.

:mod:`gluon_dynbatch.distributed.launch` starts and watches the processes of
a job on MXNet's parameter server (``python -m
gluon_dynbatch.distributed.launch``) and restarts it from its last complete
checkpoint when a process dies (``--max-restarts``).
:mod:`gluon_dynbatch.distributed.checkpoint` writes checkpoints that no
crash can leave half-written; :mod:`gluon_dynbatch.distributed.server_state`
saves and restores the optimiser state that parameter servers hold.

Nothing here is part of the batching pipeline: the engine never imports
this package, and a worker batches its samples like any other process.
"""
