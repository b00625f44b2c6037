"""bench.ncu with the probe module (argv[2], written by apply.py) as the Hopper forward where argv[1] == 'loops'."""
import importlib.util
import runpy
import sys

if sys.argv[1] == "loops":
    spec = importlib.util.spec_from_file_location("diyflash.kernels.attention.forward_sm90", sys.argv[2])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
sys.argv = ["bench.ncu"] + sys.argv[3:]
runpy.run_module("bench.ncu", run_name="__main__")
