"""KV cache security through vLLM's KV-connector interface: blocks zeroed before another tenant
gets them (or as soon as freed), and preempted requests' KV sealed (AES-GCM) into host memory and
restored on readmission instead of recomputed. See connector.py for how it plugs into vLLM."""
