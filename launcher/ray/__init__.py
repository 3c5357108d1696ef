"""The job on a Ray cluster (`podrun-ray`): one process per node, placed by
a placement group. Needs the `ray` extra; runtime/ never imports Ray."""
