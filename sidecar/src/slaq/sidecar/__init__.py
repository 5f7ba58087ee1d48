"""The priority-scheduling sidecar: the ASGI front door of every pool pod."""
