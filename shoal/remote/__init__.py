"""Environments and policies across the network over gRPC (``proto/shoal.proto``)."""
