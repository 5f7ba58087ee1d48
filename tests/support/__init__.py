"""Test support shared by tests/ and e2e/: fixtures, emulators, fake upstreams."""
