"""The standalone scheduler helpers, under the name the engine tests use."""

from slaq.engine.standalone import BLOCK_SIZE, Driver, build_scheduler, free_blocks, make_request

__all__ = ["BLOCK_SIZE", "Driver", "build_scheduler", "free_blocks", "make_request"]
