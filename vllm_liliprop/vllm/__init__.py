"""The only part of the package that imports vLLM."""
