"""torch.library registration of every diyflash:: operator (schemas from csrc_registry/).

Importing this package registers the ops. It imports diyflash.kernels, never diyflash.api.
"""

from . import attention  # noqa: F401  (registers diyflash::attention, attention_fwd, attention_bwd)
from . import attention_kvcache  # noqa: F401  (registers diyflash::attention_with_kvcache)
from . import attention_varlen  # noqa: F401  (registers diyflash::attention_varlen and its fwd / bwd)
from . import matmul  # noqa: F401  (registers diyflash::matmul)
from .registry import registry

__all__ = ["registry"]
