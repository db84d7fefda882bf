"""Helpers shared by the test modules and benchmarks (test modules never import each other)."""
