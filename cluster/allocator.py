"""A ps task gives the memory it frees back to the system.

TensorFlow's CPU tensors come from glibc's malloc. Two of its defaults keep a ps's freed memory
resident for good:
- its mmap threshold rises to the size of each mmapped block freed (up to 32 MiB): after that,
  tensors of up to that size come from the heaps, where a block freed between live ones stays;
- each thread that allocates may get an arena (heap) of its own, up to 8 per core, and a freed block
  returns to its arena, not to the system.
A ps that grows its tables (every growth copies its shards' variables and frees the old copies) or
serves batches of new IDs from many gRPC threads kept 2-3x its tables' bytes resident
(scripts/table_scale.py, docs/data.md). With blocks of 1 MiB and more always mmapped (unmapped when
freed) and 2 arenas, it keeps about what its tables hold.

The settings are glibc's mallopt, called at start before the server's threads exist. A user's own
MALLOC_MMAP_THRESHOLD_ or MALLOC_ARENA_MAX (glibc's environment variables) wins: that setting is left
alone. Where malloc is not glibc's, nothing is done.
"""

import ctypes
import os

# glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
SETTINGS = (("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, 1 << 20), ("MALLOC_ARENA_MAX", M_ARENA_MAX, 2))


def give_back_freed_memory(environ=os.environ) -> list[str]:
    """Sets glibc's malloc to return freed blocks of 1 MiB and more at once, with 2 arenas; returns
    the settings made, as 'NAME=value' (none where the user set them, or where malloc is not glibc's)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return []
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return [f"{name}={value}" for name, option, value in SETTINGS
            if name not in environ and mallopt(option, value) == 1]
