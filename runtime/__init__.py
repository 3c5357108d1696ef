"""What each process computes once it has joined the job: the parallelism
(pmap or jit(shard_map)) and the data-parallel step, the data order, the loop
and its hooks, checkpoints, evaluation, metrics, goodput and the workloads."""
