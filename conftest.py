"""Repository-wide pytest setup: shared fixtures are plugins under tests/support/."""

pytest_plugins: list[str] = ["tests.support.kube", "tests.support.fake_upstream", "tests.support.engine"]
