"""`mirrorbert reproduce`: the papers' experiments as cached cells, with a report beside the paper's numbers."""

from mirrorbert.reproduce.runner import ReproduceConfig, ReproduceResult, reproduce

__all__ = ["ReproduceConfig", "ReproduceResult", "reproduce"]
