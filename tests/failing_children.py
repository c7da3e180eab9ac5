"""Ways a forked child of a compile fails (jitop.codegen.children), to put in place of its work: each must leave
the child's share to the parent. A test adds its own malformed replies."""
from __future__ import annotations

import os
import time


def raises(*_):
    raise RuntimeError("the child's build failed")


def exits(*_):
    os._exit(3)


def hangs(*_):
    time.sleep(600)  # the test shortens children.REPLY_TIMEOUT_S: the parent kills it
