import sys

from engine.cli import main  # importing engine sets TRITON_INTERPRET=1 when there is no GPU

sys.exit(main())
