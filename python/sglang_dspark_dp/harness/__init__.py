"""Multi-process harnesses: simulated ranks (gloo, CPU) driving real SGLang code."""
