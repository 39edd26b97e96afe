"""Counterparts of ``sglang/srt/model_executor``."""
