"""GPU kernels the block manager needs, each with a CPU reference path."""
