"""Benchmarks and validation clients for sglang-dspark-dp.

This folder is its own distribution, ``sglang-dspark-dp-bench`` (see
``benchmark/pyproject.toml``), installed as the import package
``sglang_dspark_dp_bench``: ``pip install -e benchmark``. The GSM8K client and
the matrix talk to a running SGLang server over HTTP and never import SGLang.
"""
