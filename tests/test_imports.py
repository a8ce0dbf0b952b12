"""The engine's core must import on a GPU box that has only torch, triton, numpy, pandas and
sqlite-utils: no streamlit, plotly or litellm."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('streamlit', 'plotly', 'litellm', 'kaleido', 'transformers'):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
"""


def test_engine_core_imports_without_ui_or_llm_packages():
    code = BLOCK + (
        "import engine.loop, engine.cli, engine.worker, engine.verify, engine.bench, engine.hw, "
        "engine.plan, engine.proposers, engine.store, engine.models, engine.profile\n"
        "import kernels\n"
        "for n in kernels.FAMILY_NAMES: kernels.get(n)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("ok")


def test_dashboard_package_never_imports_triton():
    for path in list((ROOT / "app").glob("*.py")) + [ROOT / "streamlit_app.py"]:
        text = path.read_text()
        assert "import triton" not in text and "from triton" not in text, path
