"""Decides who runs where: one process, a local pod, or a host of a cluster.

The launcher never runs device code itself; each process it starts (or that a
cluster starts with `python -m launcher`) sets up JAX's devices and
distributed system and then hands over to the workload the config names.
"""
