"""backendgen: generate, extend and check out-of-tree PyTorch backends on PrivateUse1."""

__version__ = "0.1.0"
