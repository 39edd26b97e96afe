"""Repairs, laid out as the SGLang modules they patch (``sglang/srt/...``)."""
