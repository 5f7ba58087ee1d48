"""Repository-wide pytest setup: shared fixtures are plugins under tests/support/ (the fakes they serve live in slaq.testing)."""

pytest_plugins: list[str] = ["tests.support.fixtures", "tests.support.engine"]
