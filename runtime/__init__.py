"""What each process runs once the topology is known: sharding, the pmap'd
data-parallel step, the training loop and the workloads."""
