"""The pass pipeline: one list, run in order, each stage printable (`tilec dump-ir`).

After these target-independent passes, the target's own lowering steps run (its `lowering` list
in tilec/targets: software pipelining, layouts, barriers, ...); `driver.compile_module` runs both.
"""

from __future__ import annotations

from . import canonicalize, fuse, tile

PIPELINE = [
    # softmax/mean/logsumexp -> max/exp/sum/div, CSE, DCE: fusion then sees few op kinds
    ("canonicalize", canonicalize.run),
    # partition into device kernels; needs canonical ops to recognise GEMM/row/attention chains
    ("fuse", fuse.run),
    # each group -> a Tile IR kernel for the target's tile sizes; needs the partition
    ("tile", tile.run),
]

PASS_NAMES = [name for name, _ in PIPELINE]
