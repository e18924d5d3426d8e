"""Data-parallel training: launching jobs of workers and parameter servers.

Enters: a training script and the number of workers and servers.
Leaves: the processes of one MXNet ``dist_sync`` job, watched together
(``launch``).  Not part of the batching pipeline; it imports no stage.
"""
