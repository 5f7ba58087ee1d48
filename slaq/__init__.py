"""slaq: SLA-aware priority scheduling for multi-tenant LLM inference on Kubernetes."""

__version__ = "0.1.0"
