"""Figures and tables from eval's results table (eval/schema.py).

`python -m plots all --results FILE --out DIR` writes everything; `plots.tables`
holds the table logic eval reuses. No vllm or torch imports anywhere in here.
"""
