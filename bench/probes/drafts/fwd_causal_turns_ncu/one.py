"""bench.ncu with the Hopper forward's turns forced on causal tiles (argv[1] == 'causal_turns')."""
import runpy
import sys

import diyflash.kernels.attention.hopper as h

if sys.argv[1] == "causal_turns":
    meta = h.Tiles.meta

    def forced(self, n_k, banded):
        m = meta(self, n_k, banded)
        m["TURNS"] = self.turns
        return m

    h.Tiles.meta = forced
sys.argv = ["bench.ncu"] + sys.argv[2:]
runpy.run_module("bench.ncu", run_name="__main__")
