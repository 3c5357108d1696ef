"""A local pod: N processes on this machine, started and supervised as a gang.

`pod.Pod` puts the parts together: `ranks` starts, signals and stops the
processes; `output` files and echoes their lines and reads their progress;
`monitor` watches the gang over an explicit state until it must end; `report`
says how it ended and which exit code that is. Nothing here imports JAX.
"""
