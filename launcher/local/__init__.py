"""A local pod: N processes on this machine, started and supervised as a gang.

`pod.Pod` puts the parts together: `members` starts, signals and stops the
processes; `output` files and echoes their lines and reads their progress;
`monitor` watches the gang over an explicit state until it must end; `report`
says how it ended and which exit code that is; `elastic` how many processes
an elastic pod has and when a lost one is back. Nothing here imports JAX.
"""
