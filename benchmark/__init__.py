"""Benchmarks and validation clients shipped with sglang-dspark-dp.

Installed as the import package ``sglang_dspark_dp_bench``; nothing here imports
SGLang, so the clients run against a remote server from any Python >= 3.10.
"""
