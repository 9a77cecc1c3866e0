"""Benchmarks run by ``captioner bench``; they time, they do not test."""
