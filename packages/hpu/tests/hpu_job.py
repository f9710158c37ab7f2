"""A 2-card job on the stand-in, run as users run a training script: ``python hpu_job.py OUT [STRATEGY]``.

Fits, validates, tests and predicts under ``hpu_parallel`` (or STRATEGY), saves ``OUT/after_fit.ckpt`` as fit ends, and
writes what rank 0 saw to ``OUT/result.json``: the metrics of each stage, the predictions, and the reductions of
an integer and a float tensor over ``hccl``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hpu_testing import Classifier, make_loader, trainer

from stratagem.callbacks import Callback


class SaveAtTrainEnd(Callback):
    """Saves while the run is live, on every rank: sharded strategies (hpu_fsdp) cannot once it ended."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: Any, module: Any) -> None:
        trainer.save_checkpoint(self.path)


def main(out: Path, strategy: str) -> None:
    run = trainer(out, strategy=strategy, devices=2, max_epochs=2, callbacks=[SaveAtTrainEnd(out / "after_fit.ckpt")])
    module = Classifier()
    run.fit(module, make_loader(), make_loader(num_samples=32))
    validated = run.validate(module, make_loader(num_samples=32))
    tested = run.test(module, make_loader(num_samples=32))
    predictions = run.predict(module, make_loader(num_samples=16))
    if run.is_global_zero:
        result = {
            "fit": {name: float(value) for name, value in run.callback_metrics.items()},
            "validate": validated,
            "test": tested,
            "predictions": [batch.tolist() for batch in predictions],
            "global_step": run.global_step,
            "reductions": module.reductions,
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "hpu_parallel")
