"""Nightshift's engine: everything that runs (models, profile, plan, proposers, worker, verifier,
benchmark, loop, integration, store, CLI). Never imports streamlit or plotly.

Without a GPU every Triton kernel runs under Triton's CPU interpreter: in the worker and, for the
end-to-end check of a run's kept kernels, in the engine's own process too (the CLI's or the
dashboard's). Triton reads the switch when it is first imported, so it is set here, before any
engine module can import it.
"""
import os

if "TRITON_INTERPRET" not in os.environ:
    try:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    except ImportError:  # torch missing: the import that needs it will say so
        pass

# The kernel families' package is named "kernels", as Hugging Face's is: importing it here tells
# transformers (in any process that runs the engine, whatever it imports first) that its hub
# kernels are unavailable, so it never imports ours in their place (kernels/__init__.py).
import kernels  # noqa: E402,F401  (imported for its effect)

del kernels
