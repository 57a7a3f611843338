"""``python -m transduce`` as a torchrun worker that stops at a known update, for kill tests.

With ``TRANSDUCE_TEST_PAUSE_AT=K`` in its environment, the worker stops right after step checkpoint K
(every rank takes part in writing it), waits until ``step_K`` is on disk, writes its process id to
``TRANSDUCE_TEST_PAUSE_FILE`` and sleeps until killed. The other ranks block at update K + 1, which needs
this one, so the run can neither end nor write another checkpoint before the test kills this node: the
kill lands at the same point whatever the load (tests/test_train_multinode.py)."""

import os
import sys
import time
from pathlib import Path

from transduce.cli import main
from transduce.train import trainer
from transduce.train.checkpoint import STATE, step_dir

AT = int(os.environ.get("TRANSDUCE_TEST_PAUSE_AT", "0"))
MARK = Path(os.environ.get("TRANSDUCE_TEST_PAUSE_FILE", "paused"))
save = trainer.Trainer.save


def save_then_pause(self, name=None):
    out = save(self, name)
    if AT and name is None and self.step == AT:
        while not (step_dir(self.ckpt_dir, AT) / STATE).is_file():  # rank 0 writes it
            time.sleep(0.01)
        MARK.with_suffix(".tmp").write_text(str(os.getpid()))
        os.replace(MARK.with_suffix(".tmp"), MARK)
        while True:
            time.sleep(60)
    return out


trainer.Trainer.save = save_then_pause
sys.exit(main(sys.argv[1:]))
