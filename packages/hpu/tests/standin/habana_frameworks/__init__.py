"""A CPU stand-in for Habana's ``habana_frameworks``, for stratagem-hpu's tests only (never installed by users).

It has the symbols stratagem-hpu uses, with Habana's documented signatures, and records the calls that
matter. What it reproduces and what only a Gaudi card can show is listed in ``packages/hpu/README.md``
("Tested against a stand-in"). In short:

- ``habana_frameworks.torch.core.mark_step`` records where it was called; there is no graph to run.
- ``habana_frameworks.torch.hpu`` reports ``HABANA_STANDIN_DEVICES`` cards (default 2) named "GAUDI2".
  Torch cannot make ``hpu`` tensors without Habana's bridge, so this stand-in declares
  ``TENSOR_DEVICE_TYPE = "cpu"`` there: the one substitution, read in one place
  (``stratagem_hpu.device.tensor_device``).
- ``habana_frameworks.torch.distributed.hccl`` registers the ``hccl`` backend with ``torch.distributed``,
  backed by gloo, and records ``initialize_distributed_hpu``'s arguments.
- The transformer engine's ``fp8_autocast`` and ``Linear`` exist; ``fp8_autocast`` computes in fp32.
- ``torch.compile(backend="hpu_backend")`` is registered and runs the captured graph eagerly.

Each recorded call is appended as one JSON line to ``$HABANA_STANDIN_RECORD/<pid>.jsonl`` when that
variable names a directory, and always to :data:`calls` in this process.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

calls: list[dict[str, Any]] = []
"""Every recorded call of this process, oldest first: ``{"call", "arguments", "place"}``."""

_OWN_FILES = (os.sep + "habana_frameworks" + os.sep, os.sep + "stratagem_hpu" + os.sep, os.sep + "contextlib.py")


def record(call: str, **arguments: Any) -> None:
    """Note ``call`` with its arguments and the place it came from: the first frame outside this stand-in and
    stratagem-hpu, as ``"<file name>:<function>"`` (e.g. ``"fit_loop.py:_forward_backward"``)."""
    frame = sys._getframe(1)
    while frame is not None and any(part in frame.f_code.co_filename for part in _OWN_FILES):
        frame = frame.f_back
    place = "?" if frame is None else f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
    entry = {"call": call, "arguments": arguments, "place": place, "pid": os.getpid()}
    calls.append(entry)
    directory = os.environ.get("HABANA_STANDIN_RECORD")
    if directory:
        with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a", encoding="utf-8") as file:
            file.write(json.dumps(entry) + "\n")
