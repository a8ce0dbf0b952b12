"""The op: model source (one family's operator at a shape, for the loop and the benchmark): it
parses, is matched by its graph to exactly the family shape it names, drives a run, and bad specs
get one clear message. CPU, under Triton's interpreter."""
import pytest
import torch

from engine import benchfamilies, capture, match, sources
from engine.cli import main as cli_main
from engine.store import Store


def _profiled(spec: str) -> dict:
    """{family: [family-convention shapes]} of ``spec``'s graph matches, as the loop's targets
    get them (plain contracts: every op: call is the family's own reference)."""
    loaded = sources.load(spec)
    cap = capture.capture(loaded.model, loaded.inputs)
    assert cap.method == "export", cap.note
    out: dict = {}
    for m in match.find(cap.graphs[0]):
        assert m.placeable and m.fit.spec == {}, (m.pattern, m.why_not, m.fit)
        out.setdefault(m.family, []).append(tuple(m.fit.shape))
    return out


@pytest.mark.parametrize("spec, family, shape", [
    ("op:softmax:7x1000", "softmax", (7, 1000)),
    ("op:rmsnorm:5x3x129", "rmsnorm", (5, 3, 129)),
    ("op:layernorm:33x257", "layernorm", (33, 257)),
    ("op:cross_entropy:9x3001", "cross_entropy", (9, 3001)),
    ("op:reduce:7x1000", "reduce", (7, 1000)),
    ("op:rotary:1x2x33x64", "rotary", (1, 2, 33, 64)),
    ("op:matmul:31x64x15", "matmul", (31, 64, 15)),
    ("op:matmul:2x16x32x16", "matmul", (2, 16, 32, 16)),
    ("op:attention:1x4x17x64x2x1", "attention", (1, 4, 17, 64, 2, 1)),
    ("op:attention:1x4x17x64x2x0", "attention", (1, 4, 17, 64, 2, 0)),
    ("op:fused_mlp:16x32x64", "fused_mlp", (16, 32, 64)),
])
def test_op_profiles_to_the_shape_it_names(spec, family, shape):
    found = _profiled(spec)
    assert found[family] == [shape], found


def test_several_ops_in_one_spec_and_input_shape_for_one():
    found = _profiled("op:softmax:7x1000,reduce:3x50")
    assert found["softmax"] == [(7, 1000)] and found["reduce"] == [(3, 50)]
    loaded = sources.load("op:layernorm", input_shape="4x96")
    assert tuple(loaded.inputs[0].shape) == (4, 96)
    # fresh inputs for the end-to-end check: same shapes, other values
    again = loaded.new_inputs(5)
    assert [t.shape for t in again] == [t.shape for t in loaded.inputs]
    assert not torch.equal(again[0], loaded.inputs[0])


@pytest.mark.parametrize("spec, input_shape, words", [
    ("op:nosuch", None, "unknown family 'nosuch'"),
    ("op:softmax:7xq", None, "bad input shape"),
    ("op:softmax,softmax", None, "names softmax twice"),
    ("op:attention:3x4", None, "does not fit its convention"),
    ("op:softmax,reduce", "4x8", "--input-shape applies to op: with one family"),
])
def test_bad_op_spec_one_clear_message(tmp_path, capsys, spec, input_shape, words):
    db = tmp_path / "runs.db"
    args = ["run", "--model", spec, "--budget-experiments", "1", "--db", str(db)]
    rc = cli_main(args + (["--input-shape", input_shape] if input_shape else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert not db.exists() or Store(db, readonly=True).list_runs() == []


@pytest.mark.slow   # 45 s: a run on an op: model with its end-to-end check
def test_op_run_targets_the_named_shape(tmp_path, capsys):
    db = tmp_path / "runs.db"
    rc = cli_main(["run", "--model", "op:softmax:7x1000", "--budget-experiments", "1",
                   "--db", str(db)])
    assert rc == 0, capsys.readouterr().err
    store = Store(db, readonly=True)
    run = store.list_runs()[0]
    (target,) = store.targets(run["id"])
    assert target["family"] == "softmax" and target["shapes"] == [{"shape": [7, 1000], "count": 1}]
    (exp,) = store.experiments(run["id"])
    assert exp["state"] == "kept" and exp["hypothesis"].startswith("starter")


def test_bench_compares_with_the_faster_max_autotune():
    row = {"results": {"compile:max-autotune": {"us": 170.0},
                       "compile:max-autotune-no-cudagraphs": {"us": 66.0}}}
    assert benchfamilies.max_autotune_us(row) == 66.0
    row["results"]["compile:max-autotune-no-cudagraphs"] = "failed: RuntimeError: x"
    assert benchfamilies.max_autotune_us(row) == 170.0


def test_a_problems_inputs_are_drawn_on_the_run_device_seeded_or_on_the_cpu_where_they_must(tmp_path):
    # KernelBench's get_inputs() draws on the CPU (28 s for one [128, 4096, 4095] input on 2
    # cores); under the run's device they are drawn there, seeded per set. "meta" stands in for
    # a GPU here: a get_inputs going through numpy cannot run there and is drawn on the CPU
    from engine import sources

    def draw():
        return (torch.rand(3, 4), torch.randint(0, 5, (3,)))
    on = sources.draw_on(draw, 1, "meta")
    assert [t.device.type for t in on] == ["meta", "meta"]

    def through_numpy():
        return (torch.from_numpy(torch.rand(3, 4).numpy()),)
    back = sources.draw_on(lambda: sources._call_with(through_numpy, (), "get_inputs()"), 1, "meta")
    assert back[0].device.type == "cpu"
    state = torch.random.get_rng_state()
    a, b, c = (sources.draw_on(draw, s, "cpu") for s in (1, 1, 2))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])
    assert torch.equal(torch.random.get_rng_state(), state)      # the generator put back
    # a problem file, as the run loads it
    f = tmp_path / "p.py"
    f.write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                 "    def forward(self, x):\n        return x.relu()\n\n"
                 "def get_inputs():\n    return [torch.rand(4, 8)]\n\ndef get_init_inputs():\n    return []\n")
    loaded = sources.load(str(f), dtype="float32", device="cpu")
    assert torch.equal(loaded.new_inputs(3)[0], loaded.new_inputs(3)[0])
