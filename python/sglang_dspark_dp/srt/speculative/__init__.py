"""Counterparts of ``sglang/srt/speculative``."""
