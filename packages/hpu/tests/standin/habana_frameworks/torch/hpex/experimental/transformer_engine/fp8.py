from __future__ import annotations

import os


def is_fp8_available() -> tuple[bool, str]:
    """Gaudi2 and later compute in fp8; ``HABANA_STANDIN_FP8=0`` plays a first-generation Gaudi."""
    if os.environ.get("HABANA_STANDIN_FP8", "1") == "1":
        return True, ""
    return False, "FP8 is not supported on the first-generation Gaudi"
