"""Built-in workloads; each is `train_and_evaluate(config, workdir) -> dict`."""
