import os
import sys

# Without a GPU every Triton kernel runs under the CPU interpreter: in the worker, and, for the
# end-to-end check of a run's kept kernels, in this process too. Triton reads the switch when it
# is first imported, so it is set before anything imports it.
if "TRITON_INTERPRET" not in os.environ:
    import torch
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

from engine.cli import main  # noqa: E402

sys.exit(main())
