import os

# XLA's CPU device: the PJRT plugin every test here runs on. Set before torch_xla is first imported, which
# reads it once per process; child processes inherit it.
os.environ.setdefault("PJRT_DEVICE", "CPU")

# Autograd sizes its per-device queues at the first backward of a process, from the device counts known
# then; XLA's count is known once its runtime has started. The tests compare XLA runs with CPU runs in one
# process, so the runtime starts before any CPU backward (a strategy starts it in setup_environment).
import torch_xla

torch_xla.device()
