"""Repairs of SGLang's DSpark components, one module per patched module."""
