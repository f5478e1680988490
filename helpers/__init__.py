"""Helpers for the GRPO course notebooks: one module per concern; importing the package does no work.

One exception, a logging filter: bitsandbytes, imported by PEFT, logs ``Failed to load CPU gemm_4bit_forward from
kernels-community ... No module named 'kernels'`` on CPUs with AVX512-BF16 (bitsandbytes/backends/cpu/ops.py:241-255).
``kernels`` would download a kernel from the Hub; without it bitsandbytes uses its own CPU code, which is what
the course runs. The filter drops that one line and nothing else.
"""

import logging

__version__ = "0.2.0"


class _NoKernelsHubNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoKernelsHubNotice())
