"""The vLLM engine plugin: SLA-aware scheduler and block manager, and the launcher."""
