"""Built-in workloads; each is `train_and_evaluate(config, workdir)`, which
returns a `runtime.TrainResult` (dot_product: a dict of its own results)."""
