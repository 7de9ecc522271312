"""GPU catalog: specs of training accelerators, each figure with its source.

>>> from gpu_catalog import get_gpu, parse_gpu_option
>>> get_gpu("h200").capacity_bytes == 143771 * 2**20
True
>>> gpu, count = parse_gpu_option("2xh200")
>>> (gpu.label, count)
('H200 141GB', 2)
"""

from gpu_catalog.errors import GPUCatalogError, InvalidGPUOptionError, UnknownGPUError
from gpu_catalog.lookup import MAX_GPU_COUNT, get_gpu, list_gpus, load_catalog, parse_gpu_option
from gpu_catalog.schema import GPU, NUMERIC_FIGURES, Catalog

__all__ = [
    "GPU",
    "MAX_GPU_COUNT",
    "NUMERIC_FIGURES",
    "Catalog",
    "GPUCatalogError",
    "InvalidGPUOptionError",
    "UnknownGPUError",
    "get_gpu",
    "list_gpus",
    "load_catalog",
    "parse_gpu_option",
]
