"""Fakes of what slaq talks to, shared by the tests and the benchmarks: a Kubernetes API emulator
(`kube`, needs the `test` extra's kmock), a fake vLLM server and a recording passthrough
(`fake_engine`), a real redis-server on a free port (`redis_server`), and the ASGI pieces they
share (`asgi`). Nothing in the shipped components imports this package."""
