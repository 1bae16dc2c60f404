"""eager: the model as PyTorch runs it, no compiler; the baseline for every backend."""
