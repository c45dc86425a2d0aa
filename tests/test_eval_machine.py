"""The machine column (eval/machine.py): speed figures compare only within one kind of CPU."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from eval.machine import machine_record
from eval.summary import summary_text
from vllm_liliprop.host import cpu_bf16_matmul_speedup

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 {extra}
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 {extra}
"""


def test_the_record_names_the_cpu_and_its_matrix_instruction_sets(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra="amx_bf16 amx_tile"))
    record = json.loads(machine_record(str(path)))
    assert record["cpu"] == "Intel(R) Xeon(R) Processor" and record["cores"] >= 1
    assert record["isa"] == ["amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"]
    # Measured on this CPU, not read off the (fake AMX) flags: 0.01x on an AVX2-only host, ~6x with AMX.
    assert 0.001 < record["bf16_speedup"] < 100
    assert record["bf16_speedup"] == pytest.approx(cpu_bf16_matmul_speedup(), abs=0.01)
    path.write_text(CPUINFO.format(extra=""))
    assert json.loads(machine_record(str(path)))["isa"] == ["avx512_bf16", "avx512f", "avx2"]


def test_the_summary_says_which_machines_ran_the_rows(tmp_path):
    rows = pd.read_csv("tests/data/plots/smollm2_speed.csv", dtype=str, keep_default_na=False)
    amx = json.dumps({"cpu": "Xeon A", "cores": 2, "isa": ["amx_bf16", "avx512f"], "gpu": ""})
    plain = json.dumps({"cpu": "Xeon B", "cores": 2, "isa": ["avx512_bf16", "avx512f"], "bf16_speedup": 2.24,
                        "gpu": ""})
    rows["machine"] = [amx if i % 2 else plain for i in range(len(rows))]
    rows.to_csv(tmp_path / "r.csv", index=False)
    text = summary_text(tmp_path / "r.csv")
    assert "machine: Xeon A, 2 cores, AMX; Xeon B, 2 cores, no AMX (avx512_bf16, avx512f), bf16 2.24x fp32" in text
    # A file written before the column existed has no machine line.
    assert "machine:" not in summary_text("tests/data/plots/smollm2_speed.csv")
