"""Delete a tox env once its commands have run, when STRATAGEM_FREE_TOX_ENVS=1 (set by .ci/run).

Every env holds its own torch (about 1 GB; the xla env's CUDA build of torch 2.9.0 holds 7 GB), so a
full run keeps 16 GB or more on disk by its end, more than a CI machine may have free. CI runs each
env once on a clean clone, so it can hand the space back as it goes; a developer's envs are kept.
"""

import os
import shutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if os.environ.get("STRATAGEM_FREE_TOX_ENVS") != "1":
        return 0
    (env_dir,) = argv
    path = Path(env_dir)
    if not (path / "pyvenv.cfg").is_file():
        print(f"free_tox_env: {path} is not a virtual environment; left alone", file=sys.stderr)
        return 1
    shutil.rmtree(path)
    free = shutil.disk_usage(path.parent).free
    print(f"free_tox_env: removed {path.name}; {free / 2**30:.1f} GiB free")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
