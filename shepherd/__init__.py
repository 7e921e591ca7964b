"""Shepherd: each GPU training job's whole life is one durable Temporal workflow."""

__version__ = "0.1.0"
