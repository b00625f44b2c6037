# (issue 48) the marked pass's variants for the A/B, applied by monkeypatching in the process that times them:
#   head: the kernel as it is (MARKED_PASS_TILES 64 x 32, 4 warps);
#   skip: no marked pass at all (an upper bound of what it costs; wrong for rows the Hopper kernel marks);
#   m128: 128-row tiles (half the programs); m256: 256-row tiles, 8 warps (a quarter).
from diyflash.kernels.attention_configs import AttnConfig
from diyflash.kernels.attention import launch


def apply(variant: str) -> None:
    if variant == "skip":
        inner = launch.launch_chunks

        def without_pass2(chunks, *a, **kw):
            chunks = [(env, [lc for lc in lcs if not (lc.launcher is launch._FWD and lc.meta.get("PASS") == 2)])
                      for env, lcs in chunks]
            return inner(chunks, *a, **kw)

        launch.launch_chunks = without_pass2
    elif variant == "m128":
        launch.MARKED_PASS_TILES = AttnConfig(128, 32, 4, 1)
    elif variant == "m256":
        launch.MARKED_PASS_TILES = AttnConfig(256, 32, 8, 1)
    else:
        assert variant == "head", variant
