"""``python -m engine bench``: on the CPU (interpreter) with --quick, every code path a GPU run
takes: eager, torch.compile, the starter, the loop's best kernels from a database, the Markdown."""
import argparse
from pathlib import Path

import pytest
import torch

import kernels
from engine import benchfamilies
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _args(**kw):
    p = argparse.ArgumentParser()
    benchfamilies.add_arguments(p)
    a = p.parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _db_with_run(path: Path) -> tuple[str, dict]:
    """A run with reduce and matmul experiments: starter kept, a faster variant kept at one
    shape, a reverted one; the matmul target timed a shape the quick benchmark does not use."""
    s = Store(path)
    run_id = s.create_run("llama-tiny", {"model": "llama-tiny"}, {"name": "cpu"}, "interpreter", None)
    run = s.get_run(run_id)
    red, mm = kernels.get("reduce"), kernels.get("matmul")
    quick = benchfamilies.bench_shapes(red, True, 1)[0]
    t_red = s.add_target(run_id, "reduce", "float32", [{"shape": list(quick), "count": 1}], 0.2)
    t_mm = s.add_target(run_id, "matmul", "float32", [{"shape": [64, 64, 64], "count": 4}], 0.5)
    variant = {"variant": "chunked", "block_d": 256}

    def exp(target, fam, params, state, us, shape, dt):
        src = fam.render(params)
        e = dict(run_id=run_id, target_id=target, family=fam.name, proposer="search",
                 hypothesis="test", params=params, source=src, source_hash=str(hash(src)),
                 state=state, latency_us=us, noise=0.01,
                 shape_times=[{"shape": list(shape), "count": 1, "us": us}],
                 timing_mode="interpreter", created_at=run["created_at"] + dt)
        upd = {"best_is_this": True} if state == "kept" else {}
        return s.record_experiment(e, [], upd)

    exp(t_red, red, red.default, "kept", 100.0, quick, 5.0)            # seq 1
    exp(t_mm, mm, mm.default, "kept", 500.0, (64, 64, 64), 9.0)        # seq 2
    exp(t_red, red, variant, "kept", 50.0, quick, 20.0)                # seq 3: best for reduce
    exp(t_red, red, dict(red.default, num_warps=8), "reverted", 40.0, quick, 30.0)
    s.close()
    return run_id, {"reduce_best_seq": 3}


def test_bench_quick_with_a_run(tmp_path):
    db = tmp_path / "runs.db"
    run_id, info = _db_with_run(db)
    out = tmp_path / "docs" / "bench.md"
    lines = []
    rc = benchfamilies.main(_args(families="all", quick=True, max_shapes=1, no_compile=True,
                                  db=str(db), out=str(out)), log=lines.append)
    assert rc == 0 and out.exists()
    text = out.read_text()
    assert "interpreter: no GPU figures" in text and any("no GPU figures" in l for l in lines)
    assert "torch 2." in text and "triton" in text and "UTC" in text
    for name in kernels.FAMILY_NAMES:
        assert f"## {name}" in text
    red = text.split("## reduce")[1]
    assert f"run `{run_id}`" in red and "exp 3, 20 s" in red           # the faster kept variant
    mm = text.split("## matmul")[1].split("## ")[0]
    assert "exp 2, 9 s" in mm                                          # best overall: shape untimed
    assert "No run in the database has a kept experiment" in text.split("## softmax")[1].split("## ")[0]
    # every implementation measured: no failed cells
    assert "failed" not in text
    rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| shape")]
    assert len(rows) == len(kernels.FAMILY_NAMES) + 1   # and fused_mlp's activation, timed apart
    assert "No run in the database kept a fused_mlp experiment of the \"separate\"" in text.split(
        "## fused_mlp.swiglu")[1]


def test_bench_best_kernels_from_several_runs(tmp_path):
    """--run a,b: one op run per shape; at each shape the table takes the fastest kept kernel
    timed there, and says which run and how far into it the loop found it."""
    db = tmp_path / "runs.db"
    s = Store(db)
    mm = kernels.get("matmul")
    shapes = benchfamilies.bench_shapes(mm, True, 2)
    ids = []
    for i, shape in enumerate(shapes):
        rid = s.create_run(f"op:matmul:{'x'.join(map(str, shape))}", {}, {"name": "cpu"},
                           "interpreter", None)
        created = s.get_run(rid)["created_at"]
        t = s.add_target(rid, "matmul", "float32", [{"shape": list(shape), "count": 1}], 1.0)
        for seq, (params, us) in enumerate([(dict(mm.default), 900.0),
                                            (dict(mm.default, block_k=16 * (i + 1)), 500.0)]):
            src = mm.render(params)
            s.record_experiment(dict(run_id=rid, target_id=t, family="matmul", proposer="search",
                                     hypothesis="test", params=params, source=src,
                                     source_hash=str(hash(src)), state="kept", latency_us=us,
                                     noise=0.01, timing_mode="interpreter",
                                     shape_times=[{"shape": list(shape), "count": 1, "us": us}],
                                     created_at=created + 10 * (seq + 1) + i), [], {"best_is_this": True})
        ids.append(rid)
    s.close()
    out = tmp_path / "b.md"
    rc = benchfamilies.main(_args(families="matmul", quick=True, max_shapes=2, no_compile=True,
                                  db=str(db), run=",".join(ids), out=str(out)), log=lambda _: None)
    assert rc == 0
    text = out.read_text()
    assert "Best kernels from runs" in text and all(f"`{r}`" in text for r in ids)
    rows = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| shape")]
    assert len(rows) == 2
    assert f"exp 2, 20 s of `{ids[0]}`" in rows[0] and f"exp 2, 21 s of `{ids[1]}`" in rows[1]
    with pytest.raises(benchfamilies.BenchError, match="no run 'nope'"):
        benchfamilies.main(_args(families="matmul", quick=True, no_compile=True, db=str(db),
                                 run=ids[0] + ",nope", out=str(tmp_path / "c.md")))
    assert not (tmp_path / "c.md").exists()


def test_bench_times_the_swiglu_activation_of_the_best_separate_mlp(tmp_path):
    """fused_mlp's memory-bound part gets its own table: eager silu(g) * u, the starter's kernel,
    and the kernel (its act_block) of the fastest kept experiment of the "separate" variant."""
    db = tmp_path / "runs.db"
    s = Store(db)
    run_id = s.create_run("llama-tiny", {"model": "llama-tiny"}, {"name": "cpu"}, "interpreter", None)
    created = s.get_run(run_id)["created_at"]
    fam = kernels.get("fused_mlp")
    t = s.add_target(run_id, "fused_mlp", "float32", [{"shape": [8, 16, 32], "count": 1}], 0.1)
    for seq, (params, us) in enumerate([(dict(fam.default), 90.0),
                                        (dict(fam.default, variant="separate", act_block=2048), 80.0),
                                        (dict(fam.default, variant="separate", act_block=512), 70.0)]):
        src = fam.render(params)
        s.record_experiment(dict(run_id=run_id, target_id=t, family="fused_mlp", proposer="search",
                                 hypothesis="test", params=params, source=src,
                                 source_hash=str(hash(src)), state="kept", latency_us=us,
                                 noise=0.01, timing_mode="interpreter",
                                 created_at=created + 10 * (seq + 1)), [], {"best_is_this": True})
    s.close()
    out = tmp_path / "b.md"
    rc = benchfamilies.main(_args(families="fused_mlp", quick=True, max_shapes=1, no_compile=True,
                                  db=str(db), out=str(out)), log=lambda _: None)
    assert rc == 0
    act = out.read_text().split("## fused_mlp.swiglu")[1]
    assert "silu(g) * u" in act and "act_block=512" in act and "(#3)" in act
    row = next(l for l in act.splitlines() if l.startswith("| ") and not l.startswith("| shape"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and cells[4] == "exp 3, 30 s"


def test_bench_torch_compile_path(tmp_path):
    """torch.compile default and max-autotune cells: timed where it works here, else a note."""
    out = tmp_path / "b.md"
    rc = benchfamilies.main(_args(families="reduce", quick=True, max_shapes=1,
                                  db=str(tmp_path / "none.db"), out=str(out)), log=lambda s: None)
    assert rc == 0
    text = out.read_text()
    assert "compile default (us)" in text and "compile max-autotune (us)" in text
    row = next(l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| shape"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    for c in cells[2:4]:
        assert c.startswith("failed") or float(c) > 0
    if any(c.startswith("failed") for c in cells[2:4]):
        assert "torch.compile unavailable or failed" in text
    # a benchmark split over commands: --append adds sections under the first header
    rc = benchfamilies.main(_args(families="rotary", quick=True, max_shapes=1, no_compile=True,
                                  append=True, db=str(tmp_path / "none.db"), out=str(out)),
                            log=lambda s: None)
    more = out.read_text()
    assert rc == 0 and more.startswith(text) and more.count("# Kernel families") == 1
    assert "## rotary" in more and "interpreter: no GPU figures" in more.split("## rotary")[1]


def test_bench_cli_errors(tmp_path, capsys):
    from engine import cli
    assert cli.main(["bench", "--families", "rmsnorm,warpdrive", "--out", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "unknown family" in err and len(err.splitlines()) == 1
    assert cli.main(["bench", "--run", "nope", "--db", str(tmp_path / "missing.db"),
                     "--out", str(tmp_path / "x.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
    assert not (tmp_path / "x.md").exists()


def test_probe_times_chosen_points_and_checks_each(tmp_path, capsys):
    """engine.probe: the grid's product over the default point, each point checked against the
    reference at the shape and timed (interpreter timings here), one JSON line per point."""
    import json
    from engine import probe
    out = tmp_path / "p.jsonl"
    assert probe.main(["--family", "reduce", "--shape", "4x96", "--dtype", "float32",
                       "--grid", "num_warps=1,2", "--grid", "num_warps=2", "--out", str(out)]) == 0
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    assert [r["name"] for r in rows] == ["reference", "point", "point"]      # the union, unique
    assert [r["params"]["num_warps"] for r in rows[1:]] == [1, 2]
    assert all(r["us"] > 0 and r["error"] is None for r in rows)
    assert "interpreter timings" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="reduce has no axis 'warps'"):
        probe.main(["--family", "reduce", "--shape", "4x96", "--grid", "warps=2"])


def test_recorded_hopper_runs_back_the_benchmark_table():
    """data/recorded_h200_hopper.db: the afternoon's H200 runs behind docs/benchmarks_families.md's
    matmul, attention and fused_mlp rows. Each best kernel was kept after all five stages."""
    from engine.verify import STAGES
    s = Store(ROOT / "data" / "recorded_h200_hopper.db", readonly=True)
    runs = s.list_runs()
    assert len(runs) == 8 and {r["timing_mode"] for r in runs} == {"gpu"}
    mm = benchfamilies.best_kernels(s, "matmul", "20261201-124601-6423fa,20261201-124749-d31c52")
    for shape, seq, loads in (((4096, 4096, 4096), 22, "tma"), ((4096, 11008, 4096), 22, "pointers")):
        e = benchfamilies.pick_best(mm, shape)
        assert (e["seq"], e["params"]["loads"], e["state"]) == (seq, loads, "kept")
        assert {v["stage"]: v["status"] for v in s.verifications(e["id"])} == {
            st: "passed" for st in STAGES}
    attn = benchfamilies.best_kernels(s, "attention", None)          # the latest attention run
    assert attn["run"]["id"] == "20261201-125326-7b0be1"
    best = next(e for e in attn["kept"] if e["id"] == attn["best_id"])
    assert best["seq"] == 23 and best["params"]["use_exp2"] and best["params"]["loads"] == "tma"
    # bench-first: reverted experiments were timed after the smoke test only
    outcomes = s.stage_outcomes("20261201-122744-cd5dc2")
    assert any(o["status"] == "slower" for o in outcomes)
    s.close()


_CONV_PROBLEM = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(32, 4, 3)
    def forward(self, x):
        return torch.relu(self.conv(x)) * 2.0
def get_inputs():
    return [torch.rand(1, 32, 5, 6)]
def get_init_inputs():
    return []
"""


def test_regionbench_times_a_problems_convolution_region_at_the_points_given(tmp_path):
    from engine import regionbench
    f = tmp_path / "1_Conv_Relu.py"
    f.write_text(_CONV_PROBLEM)
    lines = []
    assert regionbench.main([str(f), "--points", '[{"conv_loop": "window"}, {"conv_loop": "nope"}]'],
                            log=lines.append) == 0
    assert lines[0].startswith("1_Conv_Relu.py conv+relu+mul shape=[1, 32, 5, 6]"), lines
    ok = lines[1]
    assert ok.startswith('  {"conv_loop": "window"}:') and " us " in ok, lines
    assert float(ok.rsplit("max err ", 1)[1]) < 1e-4, ok           # the kernel computes it
    assert "failed" in lines[2], lines                             # a point outside the space
    with pytest.raises(SystemExit, match="no such file"):
        regionbench.main([str(tmp_path / "missing.py")])


def test_a_contract_flag_after_plus_benches_that_contract_against_what_the_model_runs():
    """rmsnorm+residual: the fused residual contract; its eager and compile baselines are the
    model's add then norm (baseline_op), not the judge's stacked reference; a flag the family
    does not take is one clear error."""
    import kernels
    names = benchfamilies._family_names("rmsnorm+residual, softmax")
    assert names == [("rmsnorm", {"residual": True}), ("softmax", {})]
    fam = kernels.get("rmsnorm", {"residual": True})
    kw = fam.make_inputs((3, 8), "float32", "cpu", torch.Generator().manual_seed(0))
    h, y = fam.baseline_op()(**kw)
    assert torch.allclose(torch.stack((h, y)), fam.reference(**kw))
    with pytest.raises(benchfamilies.BenchError, match="rmsnorm\\+bogus"):
        benchfamilies._family_names("rmsnorm+bogus")
    with pytest.raises(benchfamilies.BenchError, match="unknown family"):
        benchfamilies._family_names("nope+residual")
