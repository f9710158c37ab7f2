shm_interface.o: \
 /work/wt/hivemind/.venv/lib/python3.11/site-packages/deepspeed/ops/csrc/cpu/comm/shm_interface.cpp \
 /work/wt/hivemind/.venv/lib/python3.11/site-packages/deepspeed/ops/csrc/cpu/comm/shm.h
