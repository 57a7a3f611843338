"""``python -m transduce`` (also what ``torchrun -m transduce train ...`` runs)."""

import sys

from .cli import main

sys.exit(main())
