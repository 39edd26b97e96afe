"""Counterparts of ``sglang/srt/managers``."""
