"""The reference host engine: requests and sampling parameters, the scheduler, the target
runner, the generation loop and its metrics, stop handling."""
